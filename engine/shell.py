"""What both kinds of generation share: the plain one (engine/generation.py, a token a step) and
the speculative one (engine/speculative/generation.py, several tokens a round).

A shell holds one visitor's prompt and settings, validated the same way whichever loop runs
inside it; the KV cache and the random generator; and answers the same questions: the text so
far (decoded once per new token), which termination condition ends it under the current stop
settings, the cache as it stands, and `close`, which frees its memory (the server's idle
release calls it, engine/serving/idle.py). The loops differ only in how tokens are made.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

import torch

from engine.errors import GenerationFinished, SettingsError
from engine.forward import new_cache
from engine.kvcache import KVSnapshot, read_kv
from engine.limits import Limits
from engine.loading import LoadedModel
from engine.prompt import build_prompt
from engine.settings import SamplerSettings, StopSettings, check_seed
from engine.stopping import Termination, returned_text, stop_sequence_states, termination_after
from engine.tokens import TokenPiece

if TYPE_CHECKING:
    from concurrent.futures import Future

    from transformers import DynamicCache


class PassQueue(Protocol):
    """Where a generation's forward passes wait their turn on a shared model: the server's
    scheduler (engine/serving/scheduler.py), which may pack them with other visitors'. The
    loop only knows this much of it."""

    def forward(self, token_ids: list[int], cache: DynamicCache) -> torch.Tensor: ...

    def submit(self, token_ids: list[int], cache: DynamicCache) -> Future: ...

    def cancel(self, cache: DynamicCache) -> None: ...


class GenerationShell:
    """One visitor's prompt, settings, KV cache and random generator, and what is read from
    them; a subclass makes the tokens (`generated_ids`, `_latest_eos_prob`).

    Args:
        lm: the loaded model.
        prompt: the text to continue (or the user message, with `chat`).
        chat: wrap the prompt in the model's chat template.
        system_prompt: with `chat`, the system message (None: the template's default).
        sampler: how each token is picked; may be changed between steps.
        stop: termination settings; may be changed between steps.
        seed: seeds this generation's own torch.Generator.
        allow_special: in chat mode, let typed special-token text become special tokens
            (see engine/prompt.py `build_prompt`); off by default, as chat servers do.
        limits: the server's caps on prompt tokens and new tokens (none beyond the model's
            own by default).
    """

    def __init__(self, lm: LoadedModel, prompt: str, *, chat: bool = False, system_prompt: str | None = None,
                 sampler: SamplerSettings | None = None, stop: StopSettings | None = None, seed: int = 0,
                 allow_special: bool = False, limits: Limits | None = None) -> None:
        check_seed(seed)
        for name, flag in (("chat", chat), ("allow_special", allow_special)):
            if not isinstance(flag, bool):
                raise SettingsError(name, flag, "True or False")
        self.lm = lm
        self.limits = limits or Limits()
        self.prompt = prompt
        self.chat = chat
        self.system_prompt = system_prompt
        self.allow_special = allow_special
        self.seed = seed
        self.sampler = sampler or SamplerSettings()
        self.stop = stop or StopSettings()
        built = build_prompt(lm, prompt, chat, system_prompt, allow_special=allow_special,
                             max_prompt_tokens=self.limits.max_prompt_tokens)
        self.prompt_text, self.prompt_ids, self.special_text = built.text, built.ids, built.special_text
        self._generator = torch.Generator(device="cpu").manual_seed(seed)
        self._cache = new_cache(lm)
        self._text_cache: tuple[int, str] = (-1, "")  # (tokens decoded, their text)
        self._closed = False

    # ---- settings that may change between steps -------------------------------------------

    @property
    def sampler(self) -> SamplerSettings:
        return self._sampler

    @sampler.setter
    def sampler(self, sampler: SamplerSettings) -> None:
        if not isinstance(sampler, SamplerSettings):
            raise SettingsError("sampler", sampler, "a SamplerSettings")
        self._sampler = sampler

    @property
    def stop(self) -> StopSettings:
        return self._stop

    @stop.setter
    def stop(self, stop: StopSettings) -> None:
        if not isinstance(stop, StopSettings):
            raise SettingsError("stop", stop, "a StopSettings")
        self.limits.check_new_tokens(stop.max_new_tokens)
        self._stop = stop

    # ---- what the pages read -------------------------------------------------------------

    @property
    def generated_ids(self) -> list[int]:
        raise NotImplementedError

    def _latest_eos_prob(self) -> float:
        """The raw probability of every end token at the latest generated position."""
        raise NotImplementedError

    @property
    def context_ids(self) -> list[int]:
        return self.prompt_ids + self.generated_ids

    @property
    def prompt_pieces(self) -> list[TokenPiece]:
        return [self.lm.texts.piece(i) for i in self.prompt_ids]

    @property
    def output_text(self) -> str:
        """All generated tokens decoded, special tokens left out (as servers return them)."""
        generated = self.generated_ids
        count, text = self._text_cache
        if count != len(generated):
            text = self._decode(generated)
            self._text_cache = (len(generated), text)
        return text

    @property
    def text(self) -> str:
        """The completion as returned: cut just before the first stop sequence."""
        return returned_text(self.output_text, stop_sequence_states(self.output_text, self.stop.stop_sequences))

    @property
    def termination(self) -> Termination | None:
        """The latest token's conditions re-checked under the current stop settings (which
        may have changed since it was made); None before the first token."""
        generated = self.generated_ids
        if not generated:
            return None
        return self._termination(generated, self.output_text, self._latest_eos_prob())

    @property
    def finish_reason(self) -> str | None:
        """What ends generation under the current stop settings, or None to go on."""
        termination = self.termination
        return termination.finish_reason if termination else None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def kv(self) -> KVSnapshot:
        """The cache as it stands now, read from its tensors."""
        return read_kv(self._cache, self.lm.geometry, self.lm.dtype)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Release this generation's memory (its KV cache and whatever the loop keeps). The
        records stay readable; it cannot step again."""
        self._closed = True
        self._cache = new_cache(self.lm)

    def run(self, max_steps: int | None = None) -> Iterator:
        """Step until a termination condition fires (or `max_steps`), yielding each record."""
        taken = 0
        while not self.finished and (max_steps is None or taken < max_steps):
            yield self.step()
            taken += 1

    def step(self) -> object:
        raise NotImplementedError

    # ---- for the loops -------------------------------------------------------------------

    def _check_open(self, what_next: str) -> None:
        """Refuse a step on a closed or finished generation, saying what the visitor can do."""
        if self._closed:
            raise GenerationFinished.closed()
        if self.finished:
            raise GenerationFinished(f"Generation has finished ({self.finish_reason}); {what_next}.")

    def _decode(self, generated: list[int]) -> str:
        """`generated` decoded, special tokens left out. A loop that commits tokens sets
        `_text_cache` to their text (every other change of the tokens changes their count)."""
        return self.lm.tokenizer.decode(generated, skip_special_tokens=True)

    def _termination(self, generated: list[int], text: str, eos_prob: float) -> Termination:
        """Every condition's state once `generated` (whose decoded text is `text`) is out."""
        return termination_after(generated, text, eos_ids=self.lm.eos_ids, eos_prob=eos_prob, stop=self.stop,
                                 prompt_tokens=len(self.prompt_ids), context_window=self.lm.context_window)
