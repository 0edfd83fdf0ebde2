"""Sampler and stop settings: validated, immutable values.

Validation lives here, at the edge, so every stage downstream can trust its inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.errors import SettingsError

# The sampler chains of three well-known engines, as stage names in the order applied.
# transformers: `_get_logits_processor` (processors, then warpers in this order).
# vLLM v1: penalties, temperature, then min-p before the joint top-k/top-p mask.
# llama.cpp: the default `common` chain applies temperature last, after the filters.
CHAINS: dict[str, tuple[str, ...]] = {
    "transformers": ("repetition_penalty", "temperature", "top_k", "top_p", "min_p"),
    "vllm": ("repetition_penalty", "temperature", "min_p", "top_k", "top_p"),
    "llama.cpp": ("repetition_penalty", "top_k", "top_p", "min_p", "temperature"),
}

MAX_STOP_SEQUENCES = 4
MAX_STOP_LENGTH = 200  # characters: each step searches the output text for every stop sequence
MAX_NEW_TOKENS = 1_000_000
# Below this temperature sampling is greedy, as in vLLM (_SAMPLING_EPS): dividing logits by a
# smaller number overflows float32 to inf and the softmax to NaN.
GREEDY_BELOW_TEMPERATURE = 1e-5
# Dividing a positive logit by a tiny penalty overflows too; a hundredfold either way is
# already far beyond any useful setting.
REPETITION_PENALTY_RANGE = (0.01, 100.0)
MAX_TOP_K = 10_000_000  # beyond any vocabulary; keeps labels and messages printable


def _require(condition: bool, parameter: str, value: object, allowed: str) -> None:
    if not condition:
        raise SettingsError(parameter, value, allowed)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_whole(value: object) -> bool:
    """A whole number: an int, and not True or False (which Python counts as ints)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_seed(seed: object) -> None:
    """A generation's seed: what torch.Generator.manual_seed takes."""
    _require(is_whole(seed) and 0 <= seed < 2**63, "seed", seed, "a whole number from 0 to 2^63 - 1")




@dataclass(frozen=True)
class SamplerSettings:
    """How the next token is chosen from the logits.

    The neutral value of every filter disables it, as in transformers: temperature 1,
    top_k 0, top_p 1, min_p 0, repetition_penalty 1. Temperature 0 means greedy (argmax),
    as in vLLM and the OpenAI API.
    """

    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    min_p: float = 0.0  # 0.0 = off; relative to the top token's probability
    repetition_penalty: float = 1.0  # 1.0 = off; over prompt and output tokens
    chain: str = "transformers"  # stage order: a key of CHAINS
    min_tokens_to_keep: int = 1  # floor for top-k, top-p and min-p, as in transformers

    def __post_init__(self) -> None:
        _require(_is_number(self.temperature) and 0 <= self.temperature <= 100,
                 "temperature", self.temperature, "a number from 0 to 100 (0 means greedy)")
        _require(is_whole(self.top_k) and 0 <= self.top_k <= MAX_TOP_K,
                 "top_k", self.top_k, f"a whole number from 0 to {MAX_TOP_K:,} (0 turns top-k off)")
        _require(_is_number(self.top_p) and 0 <= self.top_p <= 1,
                 "top_p", self.top_p, "a number from 0 to 1 (1 turns top-p off)")
        _require(_is_number(self.min_p) and 0 <= self.min_p <= 1,
                 "min_p", self.min_p, "a number from 0 to 1 (0 turns min-p off)")
        low, high = REPETITION_PENALTY_RANGE
        _require(_is_number(self.repetition_penalty) and low <= self.repetition_penalty <= high,
                 "repetition_penalty", self.repetition_penalty, f"a number from {low:g} to {high:g} (1 turns it off)")
        _require(isinstance(self.chain, str) and self.chain in CHAINS, "chain", self.chain,
                 f"one of {', '.join(CHAINS)}")
        _require(is_whole(self.min_tokens_to_keep) and 1 <= self.min_tokens_to_keep <= MAX_TOP_K,
                 "min_tokens_to_keep", self.min_tokens_to_keep, f"a whole number from 1 to {MAX_TOP_K:,}")

    @property
    def greedy(self) -> bool:
        """Temperature 0 (or below GREEDY_BELOW_TEMPERATURE) picks the argmax; no draw is made."""
        return self.temperature < GREEDY_BELOW_TEMPERATURE


@dataclass(frozen=True)
class StopSettings:
    """When generation ends, besides the model's end-of-sequence token."""

    max_new_tokens: int = 64
    stop_sequences: tuple[str, ...] = field(default=())
    ignore_eos: bool = False  # keep generating after the model emits an end token

    def __post_init__(self) -> None:
        _require(is_whole(self.max_new_tokens) and 1 <= self.max_new_tokens <= MAX_NEW_TOKENS,
                 "max_new_tokens", self.max_new_tokens, f"a whole number from 1 to {MAX_NEW_TOKENS:,}")
        # a lone string is a sequence of one-letter strings: refuse it rather than stop on every letter
        _require(isinstance(self.stop_sequences, (tuple, list)), "stop_sequences", self.stop_sequences,
                 "a list of strings (one string is a list of one)")
        sequences = tuple(self.stop_sequences)
        object.__setattr__(self, "stop_sequences", sequences)
        _require(len(sequences) <= MAX_STOP_SEQUENCES, "stop_sequences", sequences,
                 f"at most {MAX_STOP_SEQUENCES} sequences")
        for sequence in sequences:
            _require(isinstance(sequence, str) and 0 < len(sequence) <= MAX_STOP_LENGTH, "stop_sequences",
                     sequence,
                     f"non-empty strings of at most {MAX_STOP_LENGTH} characters")
        _require(isinstance(self.ignore_eos, bool), "ignore_eos", self.ignore_eos, "True or False")
