"""What the Breaking the chain page computes from the engine, with no visitor state and no
wording: the draft methods by the page's names, the two lanes (speculative and plain) and their
running totals, and the averages its cost section states. No Streamlit here.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from engine import Generation, Limits, LoadedModel, PromptLookup, SettingsError, SpeculativeGeneration
from engine.speculative import (
    DraftMethod,
    DraftModel,
    EarlyExit,
    Lookahead,
    chosen_exit,
    draft_for,
    expected_tokens_per_round,
)

PROMPT_LOOKUP = "prompt lookup"
SELF_BF16 = "draft model: bfloat16 copy of this model"
SELF_INT8 = "draft model: int8 copy of this model"
LOOKAHEAD = "lookahead decoding (Jacobi window + n-gram pool)"
EARLY_EXIT = "early exit: the model's own first layers draft"
HEADS = "parallel decoding heads (Medusa-style, trained here)"
MTP = "multi-token prediction module (trained here)"
METHODS = (PROMPT_LOOKUP, LOOKAHEAD, HEADS, MTP, EARLY_EXIT, SELF_BF16, SELF_INT8)
MakeDraft = Callable[[LoadedModel, str], DraftMethod]  # a fresh draft method by the page's name for it
METHOD_OF_NAME = {"prompt-lookup": PROMPT_LOOKUP, "self-draft-bfloat16": SELF_BF16, "self-draft-int8": SELF_INT8,
                  "lookahead": LOOKAHEAD, "medusa-heads": HEADS, "mtp": MTP}


def method_of(name: str) -> str | None:
    """The page's method for a draft's name (a trace's "method"); early exit names its layer."""
    if name.startswith("early-exit-") and name.removeprefix("early-exit-").isdigit():
        return EARLY_EXIT
    return METHOD_OF_NAME.get(name)


def draft_method(lm: LoadedModel, method: str, self_copy: Callable[[LoadedModel, str], LoadedModel]
                 ) -> DraftMethod:
    """A fresh draft method for this visitor (a draft model's KV cache is the visitor's own);
    `self_copy(lm, kind)` gives the shared, read-only bfloat16 or int8 copy of `lm` to draft with."""
    if method == PROMPT_LOOKUP:
        return PromptLookup(lm.eos_ids)
    if method == LOOKAHEAD:
        return Lookahead(lm.eos_ids)
    if method == EARLY_EXIT:  # the layer with the best expected speed-up, measured once per model
        return EarlyExit(lm, chosen_exit(lm).layer)
    if method in (HEADS, MTP):  # the shipped weights, checked once per model (ModelLoadError says why not)
        return draft_for(lm, "medusa-heads" if method == HEADS else "mtp")
    kind = "bfloat16" if method == SELF_BF16 else "int8"
    return DraftModel(self_copy(lm, kind), lm, name=f"self-draft-{kind}")


def pictured(draft: DraftMethod) -> DraftMethod:
    """The lane's draft keeps a picture of each round's draft for the page (ui/views/draft_pictures.py);
    the race's drafts do not, so their times are the methods' own."""
    if hasattr(draft, "picturing"):
        draft.picturing = True
    return draft


def drafts_by_name(lm: LoadedModel, make_draft: MakeDraft) -> Callable[[str], DraftMethod]:
    """A trace names each round's draft method; this makes the visitor's own of each."""

    def draft_named(name: str) -> DraftMethod:
        if (method := method_of(name)) is None:
            raise SettingsError("draft method", name, f"one of {', '.join(METHOD_OF_NAME)} or early-exit-<layer>")
        if method == EARLY_EXIT:  # the very layer the trace drafted with
            return pictured(EarlyExit(lm, int(name.removeprefix("early-exit-"))))
        return pictured(make_draft(lm, method))

    return draft_named


# ---- the two lanes ------------------------------------------------------------------------------


@dataclass
class Lanes:
    """The visitor's two generations of the same prompt: speculative and plain."""

    speculative: SpeculativeGeneration
    plain: Generation

    @property
    def identical(self) -> bool:
        """Both lanes hold the same tokens so far (each compared up to the shorter)."""
        spec, plain = self.speculative.generated_ids, self.plain.generated_ids
        shared = min(len(spec), len(plain))
        return spec[:shared] == plain[:shared]


def catch_up(lanes: Lanes) -> None:
    """Plain decoding, one token per forward pass, until it has as many tokens as the speculative lane
    (or a stop condition ends it: with the same settings, at the same token)."""
    target = len(lanes.speculative.generated_ids)
    while len(lanes.plain.steps) < target and not lanes.plain.finished:
        lanes.plain.step()


def with_plain_lane(spec: SpeculativeGeneration, limits: Limits) -> Lanes:
    """Both lanes for a replayed speculative generation: plain decoding made again with the
    same settings, to as many tokens."""
    plain = Generation(spec.lm, spec.prompt, chat=spec.chat, system_prompt=spec.system_prompt, sampler=spec.sampler,
                       stop=spec.stop, seed=spec.seed, allow_special=spec.allow_special, limits=limits)
    lanes = Lanes(spec, plain)
    catch_up(lanes)
    return lanes


@dataclass(frozen=True)
class Counts:
    """The running totals the page compares."""

    tokens: int  # produced by the speculative lane
    target_passes: int  # forward passes of the target model, speculative lane
    plain_passes: int  # forward passes, plain lane (one per token)
    drafted: int
    checked: int
    accepted: int

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / self.target_passes if self.target_passes else 0.0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.checked if self.checked else None


def counts(lanes: Lanes) -> Counts:
    rounds = lanes.speculative.rounds
    return Counts(tokens=len(lanes.speculative.generated_ids), target_passes=len(rounds),
                  plain_passes=len(lanes.plain.steps), drafted=sum(len(r.drafted) for r in rounds),
                  checked=sum(len(r.checks) for r in rounds), accepted=sum(r.accepted for r in rounds))


# ---- what checking k guesses costs ---------------------------------------------------------------


@dataclass(frozen=True)
class VerifyCost:
    """A verify pass against a plain decode step, each averaged after the first pass (it reads
    the prompt)."""

    verify_ms: float  # mean verify pass of the rounds that guessed
    mean_fed: float  # mean tokens such a pass read
    decode_ms: float  # mean forward pass of a plain decode step


@dataclass(frozen=True)
class TimePerToken:
    """Wall time per token in each lane after its first pass."""

    speculative_ms: float
    plain_ms: float
    drafted_by_model: bool  # the latest round's draft scored its guesses (a draft model), not a copy


@dataclass(frozen=True)
class RoundYield:
    """Tokens per round, expected from the measured acceptance α against measured, over the
    rounds that guessed k tokens and were not cut by a stop."""

    alpha: float
    k: int
    expected: float  # (1 − α^(k+1)) / (1 − α)
    measured: float
    rounds: int


@dataclass(frozen=True)
class CostFigures:
    verify: VerifyCost | None  # None before a round after the first has guessed
    time_per_token: TimePerToken | None  # None before two rounds
    round_yield: RoundYield | None  # None before a full round, or before any guess was checked


def cost_figures(spec: SpeculativeGeneration, plain: Generation) -> CostFigures:
    return CostFigures(verify_cost(spec, plain), time_per_token(spec, plain), round_yield(spec))


def verify_cost(spec: SpeculativeGeneration, plain: Generation) -> VerifyCost | None:
    guessed = [r for r in spec.rounds[1:] if r.drafted]
    decode = [s.timing.forward_ms for s in plain.steps[1:]]
    if not (guessed and decode):
        return None
    return VerifyCost(sum(r.timing.verify_ms for r in guessed) / len(guessed),
                      sum(r.fed_tokens for r in guessed) / len(guessed), sum(decode) / len(decode))


def time_per_token(spec: SpeculativeGeneration, plain: Generation) -> TimePerToken | None:
    if len(spec.rounds) < 2 or len(plain.steps) < 2:
        return None
    later = spec.rounds[1:]
    return TimePerToken(sum(r.timing.round_ms for r in later) / sum(len(r.emitted) for r in later),
                        sum(s.timing.step_ms for s in plain.steps[1:]) / (len(plain.steps) - 1),
                        not spec.rounds[-1].deterministic_draft)


def round_yield(spec: SpeculativeGeneration) -> RoundYield | None:
    alpha = spec.acceptance_rate
    full = [r for r in spec.rounds if r.drafted and len(r.drafted) == spec.k and not r.cut_by_stop]
    if alpha is None or not full:
        return None
    return RoundYield(alpha, spec.k, expected_tokens_per_round(alpha, spec.k),
                      sum(len(r.emitted) for r in full) / len(full), len(full))


def plain_ms_per_token(lanes: Lanes | None) -> float | None:
    """The visitor's plain lane's median step time after the prompt's pass, if it has one."""
    steps = lanes.plain.steps[1:] if lanes is not None else ()
    return statistics.median(s.timing.step_ms for s in steps) if steps else None
