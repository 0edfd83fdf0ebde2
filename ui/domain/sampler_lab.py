"""The Sampler lab's numbers: one frozen next-token distribution run through several sampler
settings, sweeps and chain orders. Every number comes from the engine's own sampler
(`engine.sampling`); nothing here reshapes logits itself. No Streamlit here.

Each public function is one hop onto the sampler's one-thread worker (engine/cpu_threads.py):
the lab's numbers have a step's own last digits, and 1,000 draws cost one hand-off, not 1,000.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from engine import (
    CHAINS,
    ChainOutput,
    Decision,
    Distribution,
    Generation,
    InverseCdf,
    LoadedModel,
    SamplerSettings,
    decide,
    describe_distribution,
    draw_uniform,
    on_sampler_thread,
    pick_by_cdf,
    run_chain,
)
from engine.serving import ForwardScheduler
from ui.session.settings import step_generation


@dataclass(frozen=True, eq=False)  # holds tensors: compared by identity
class FrozenStep:
    """One next-token decision, frozen: the raw logits, the context they came from, and the
    generation step they belong to (whose own random draw every sampler reuses)."""

    source: str  # for people: where the logits come from
    context_text: str  # what the model had read
    logits: torch.Tensor  # [vocab], raw model output
    context_ids: torch.Tensor  # [context], for the repetition penalty
    generation: Generation
    index: int  # the step within `generation`
    u: float | None  # the step's uniform draw; None when it drew the multinomial way


@dataclass(frozen=True, eq=False)
class Outcome:
    """One sampler setting applied to the frozen step."""

    settings: SamplerSettings
    decision: Decision
    chain: ChainOutput

    @property
    def kept_ids(self) -> frozenset[int]:
        return frozenset(torch.nonzero(self.chain.final_probs > 0).flatten().tolist())


def freeze_generation(generation: Generation, source: str) -> FrozenStep:
    """The latest step of a generation, with its logits copied."""
    index = len(generation.steps)
    context = generation.prompt_ids + generation.generated_ids[: index - 1]
    draw = generation.resample(SamplerSettings(temperature=1.0), index).decision.draw
    text = generation.lm.tokenizer.decode(context, skip_special_tokens=False)
    return FrozenStep(source, text, generation.raw_logits(index), torch.tensor(context), generation, index,
                      draw.u if draw is not None else None)


def freeze_prompt(lm: LoadedModel, prompt: str, chat: bool, seed: int = 0,
                  scheduler: ForwardScheduler | None = None) -> FrozenStep:
    """The first step of a fresh generation on `prompt` (one forward pass, through the
    server's `scheduler` when given)."""
    generation = Generation(lm, prompt, chat=chat, seed=seed, scheduler=scheduler)
    generation.step()
    kind = "chat question" if chat else "prompt"
    return freeze_generation(generation, f"{kind} “{prompt}”, first new token")


def live_generation(state: Mapping[str, Any], lm: LoadedModel) -> Generation | None:
    """The visitor's generation from the Step-through page, if it has taken a step on the
    model now loaded (after a model switch its token ids would mean other tokens)."""
    generation = step_generation(state)
    if generation is not None and generation.steps and generation.lm.source == lm.source:
        return generation
    return None


@on_sampler_thread
def apply(step: FrozenStep, settings: SamplerSettings, u: float | None = None) -> Outcome:
    """The engine's chain on the frozen logits and its pick: with the step's own draw
    (`Generation.resample`, whatever draw method the generation uses), or with `u` if given."""
    if u is None:
        decision = step.generation.resample(settings, step.index).decision
        chain = run_chain(step.logits, step.context_ids, settings)
    else:
        decision, chain = decide(step.logits, step.context_ids, settings, InverseCdf(u))
    return Outcome(settings, decision, chain)


@dataclass(frozen=True)
class TemperaturePoint:
    """The final distribution's spread at one temperature."""

    temperature: float
    entropy_bits: float
    top_prob: float


@on_sampler_thread
def temperature_sweep(step: FrozenStep, temperatures: Sequence[float]) -> tuple[TemperaturePoint, ...]:
    """Entropy and the top token's probability of the final distribution at each T (no filters)."""
    points = []
    for t in temperatures:
        chain = run_chain(step.logits, step.context_ids, SamplerSettings(temperature=t))
        points.append(TemperaturePoint(t, chain.final_entropy_bits, float(chain.final_probs.max())))
    return tuple(points)


@dataclass(frozen=True)
class CutPoint:
    """How many tokens a top-p or min-p setting keeps."""

    value: float  # the top-p or min-p setting
    kept: int  # tokens left with non-zero probability
    threshold: float  # min-p only: the probability below which tokens are cut (0 for top-p)


def _kept(chain: ChainOutput) -> int:
    return int((chain.final_probs > 0).sum())


@on_sampler_thread
def nucleus_sweep(step: FrozenStep, top_ps: Sequence[float], temperature: float = 1.0) -> tuple[CutPoint, ...]:
    """How many tokens top-p keeps at each p."""
    return tuple(CutPoint(p, _kept(run_chain(step.logits, step.context_ids,
                                             SamplerSettings(temperature=temperature, top_p=p))), 0.0)
                 for p in top_ps)


@on_sampler_thread
def min_p_sweep(step: FrozenStep, min_ps: Sequence[float], temperature: float = 1.0) -> tuple[CutPoint, ...]:
    """How many tokens min-p keeps at each setting, and the probability it cuts below
    (min-p times the top token's probability after temperature)."""
    top = float(run_chain(step.logits, step.context_ids, SamplerSettings(temperature=temperature)).final_probs.max())
    return tuple(CutPoint(m, _kept(run_chain(step.logits, step.context_ids,
                                             SamplerSettings(temperature=temperature, min_p=m))), m * top)
                 for m in min_ps)


def outcome_distribution(lm: LoadedModel, step: FrozenStep, outcome: Outcome, top_n: int) -> Distribution:
    """The frozen step's distribution as a step record holds it, under one sampler setting: the
    `top_n` leaders by raw probability, the pick wherever it ranks, and the rest summed."""
    return describe_distribution(lm, step.logits, step.logits.softmax(dim=-1), outcome.chain, top_n,
                                 always=(outcome.decision.token_id,))


@on_sampler_thread
def chain_outcomes(step: FrozenStep, settings: SamplerSettings) -> dict[str, Outcome]:
    """The same settings under each engine's stage order."""
    return {name: apply(step, replace(settings, chain=name)) for name in CHAINS}


def disputed_tokens(step: FrozenStep, outcomes: Mapping[str, Outcome]) -> list[int]:
    """Tokens some chains keep and others remove, most probable (raw) first."""
    kept = [o.kept_ids for o in outcomes.values()]
    union, common = frozenset().union(*kept), frozenset.intersection(*kept)
    return sorted(union - common, key=lambda i: -float(step.logits[i]))


@on_sampler_thread
def draw_many(final_probs: torch.Tensor, count: int, seed: int) -> Counter[int]:
    """`count` picks with the engine's own draw: a seeded torch.Generator, `draw_uniform`,
    then `pick_by_cdf`. The pick runs over the tokens with non-zero probability only (in
    token-id order), which gives the same token as the whole vocabulary: zero-probability
    tokens sit at the end of the cumulative order and never take a draw."""
    kept_ids = torch.nonzero(final_probs > 0).flatten()  # ascending ids keep tie order
    kept_probs = final_probs[kept_ids]
    generator = torch.Generator(device="cpu").manual_seed(seed)
    picks: Counter[int] = Counter()
    for _ in range(count):
        position, _draw = pick_by_cdf(kept_probs, draw_uniform(generator))
        picks[int(kept_ids[position])] += 1
    return picks
