"""The sampler: reshape the logits stage by stage, then pick one token.

Pipeline, in transformers' order (other chains reorder the same stages, see
`engine.settings.CHAINS`):
  1. repetition penalty over every token already in the context (prompt and output)
  2. temperature
  3. top-k (tokens tied with the k-th are kept)
  4. top-p (the token that crosses p is kept)
  5. min-p (relative to the most probable token, after temperature)
  6. softmax, then one draw: the uniform u falls in one token's band of the cumulative
     distribution (tokens ordered by final probability). Temperature 0 is the argmax instead.

Every stage takes 1-D logits `[vocab]` and returns a new tensor; none changes its input.
Filtered tokens get -inf, exactly as transformers' warpers do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# the sampler's entry points run on the sampler's one-CPU-thread worker: the same last digits
# however they are called (a sum's order follows the thread count), no waiting on a core
# another process holds, and no caller's own thread count touched
from engine.cpu_threads import on_sampler_thread
from engine.settings import CHAINS, SamplerSettings

NEG_INF = float("-inf")
FILTERS = ("top_k", "top_p", "min_p")  # the stages that remove tokens


def penalize_repetition(logits: torch.Tensor, context_ids: torch.Tensor, penalty: float) -> torch.Tensor:
    """Make every token already in the context less likely: positive logits are divided by
    `penalty`, negative ones multiplied, so both move towards 'less likely'."""
    seen = torch.unique(context_ids)  # [n_seen]
    seen_logits = logits[seen]
    penalised = torch.where(seen_logits < 0, seen_logits * penalty, seen_logits / penalty)
    out = logits.clone()
    out[seen] = penalised
    return out


def scale_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Divide the logits by T: below 1 sharpens the distribution, above 1 flattens it."""
    return logits / temperature


def keep_top_k(logits: torch.Tensor, top_k: int, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """Keep the k highest logits; tokens tied with the k-th are kept too."""
    k = min(max(top_k, min_tokens_to_keep), logits.numel())
    kth_value = torch.topk(logits, k).values[-1]
    return logits.masked_fill(logits < kth_value, NEG_INF)


def keep_top_p(logits: torch.Tensor, top_p: float, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """Keep the smallest set of most probable tokens whose mass reaches p.

    Accumulates from the least probable end and drops tokens while the dropped mass stays
    <= 1 - p, so the token that crosses p survives (the same float32 arithmetic as transformers).
    """
    ascending_logits, ascending_ids = torch.sort(logits, descending=False)
    dropped_mass = ascending_logits.softmax(dim=-1).cumsum(dim=-1)  # [vocab]
    drop_sorted = dropped_mass <= (1 - top_p)
    drop_sorted[-min_tokens_to_keep:] = False
    drop = torch.zeros_like(drop_sorted).scatter(0, ascending_ids, drop_sorted)
    return logits.masked_fill(drop, NEG_INF)


def keep_min_p(logits: torch.Tensor, min_p: float, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the top token's probability."""
    probs = logits.softmax(dim=-1)
    drop = probs < min_p * probs.amax()
    keep_ids = torch.topk(probs, min(min_tokens_to_keep, probs.numel())).indices
    drop[keep_ids] = False
    return logits.masked_fill(drop, NEG_INF)


@dataclass(frozen=True)
class StageRecord:
    """What one sampler stage did to the distribution."""

    name: str  # key in CHAINS, e.g. "top_p"
    label: str  # for people, e.g. "top-p 0.9"
    active: bool  # False when the setting is neutral or greedy makes it moot
    kept: int  # tokens still possible after the stage
    removed: int  # tokens this stage removed
    removed_mass: float  # probability those tokens had in the distribution entering the stage
    note: str = ""


@dataclass(frozen=True)
class Draw:
    """The random draw of one step and where the pick sits on the cumulative distribution.

    Tokens are laid end to end in order of final probability (highest first); the picked
    token owns the band [cdf_low, cdf_high). With the "cdf" method one uniform u was drawn
    and fell in that band. With "multinomial" (torch.multinomial's own method, which
    generate() uses) every token drew an exponential waiting time and the pick is the token
    whose time divided by its probability came first; there is no single u.
    """

    u: float | None
    cdf_low: float
    cdf_high: float
    rank: int  # the pick's place in that order, 1 = most probable
    method: str = "cdf"


@dataclass(frozen=True)
class Decision:
    """The sampler's decision for one step: its stages and the pick."""

    settings: SamplerSettings
    stages: tuple[StageRecord, ...]
    token_id: int
    greedy: bool  # argmax, no draw
    forced: bool  # the visitor chose the token; the sampler's own pick is `sampler_token_id`
    sampler_token_id: int  # what the sampler picked (or would have picked, when forced)
    draw: Draw | None  # None for greedy
    final_prob: float  # the pick's probability in the distribution it was drawn from
    final_entropy_bits: float
    final_kept: int  # tokens with non-zero final probability


@dataclass(frozen=True)
class ChainOutput:
    """The final logits and distribution after every stage, plus each stage's record."""

    final_logits: torch.Tensor  # [vocab]
    final_probs: torch.Tensor  # [vocab]
    final_entropy_bits: float
    stages: tuple[StageRecord, ...]


def entropy_bits(probs: torch.Tensor) -> float:
    """Shannon entropy of a distribution, in bits (0 = certain)."""
    return float(torch.special.entr(probs.double()).sum()) / math.log(2)  # entr(0) = 0


def _stage_label(name: str, settings: SamplerSettings) -> str:
    labels = {
        "repetition_penalty": f"repetition penalty {settings.repetition_penalty:g}",
        "temperature": f"temperature {settings.temperature:g}",
        "top_k": f"top-k {settings.top_k}",
        "top_p": f"top-p {settings.top_p:g}",
        "min_p": f"min-p {settings.min_p:g}",
    }
    return labels[name]


def _is_neutral(name: str, settings: SamplerSettings) -> bool:
    neutral = {
        "repetition_penalty": settings.repetition_penalty == 1.0,
        "temperature": settings.temperature == 1.0,
        "top_k": settings.top_k == 0,
        "top_p": settings.top_p >= 1.0,
        "min_p": settings.min_p == 0.0,
    }
    return neutral[name]


def _apply_stage(name: str, logits: torch.Tensor, context_ids: torch.Tensor,
                 settings: SamplerSettings) -> torch.Tensor:
    keep = settings.min_tokens_to_keep
    if name == "repetition_penalty":
        return penalize_repetition(logits, context_ids, settings.repetition_penalty)
    if name == "temperature":
        return scale_temperature(logits, settings.temperature)
    if name == "top_k":
        return keep_top_k(logits, settings.top_k, keep)
    if name == "top_p":
        return keep_top_p(logits, settings.top_p, keep)
    return keep_min_p(logits, settings.min_p, keep)


def _stage_record(name: str, settings: SamplerSettings, before: torch.Tensor,
                  after: torch.Tensor) -> StageRecord:
    """Measure what an applied stage removed (tokens newly at -inf) and the mass they held."""
    gone_after = torch.isneginf(after)  # filters mark removed tokens -inf
    removed = gone_after & ~torch.isneginf(before)
    removed_count = int(removed.sum())
    removed_mass = float(before.softmax(dim=-1).double()[removed].sum()) if removed_count else 0.0
    return StageRecord(name=name, label=_stage_label(name, settings), active=True,
                       kept=after.numel() - int(gone_after.sum()), removed=removed_count, removed_mass=removed_mass)


def _skipped_record(name: str, settings: SamplerSettings, kept: int, note: str) -> StageRecord:
    return StageRecord(name=name, label=_stage_label(name, settings), active=False, kept=kept,
                       removed=0, removed_mass=0.0, note=note)


@on_sampler_thread
def run_chain(logits: torch.Tensor, context_ids: torch.Tensor, settings: SamplerSettings) -> ChainOutput:
    """Apply the sampler stages in the chain's order and record what each one did.

    With temperature 0 only the repetition penalty applies; the argmax of the penalised
    logits gets probability 1 (the other filters cannot remove the top token anyway).
    """
    stages: list[StageRecord] = []
    current = logits
    kept = logits.numel() - int(torch.isneginf(logits).sum())
    for name in CHAINS[settings.chain]:
        if settings.greedy and name != "repetition_penalty":
            note = "greedy: the argmax is taken" if name == "temperature" else "not used by greedy"
            stages.append(_skipped_record(name, settings, kept, note))
        elif _is_neutral(name, settings):
            stages.append(_skipped_record(name, settings, kept, "off"))
        else:
            after = _apply_stage(name, current, context_ids, settings)
            if name in FILTERS:
                stages.append(_stage_record(name, settings, current, after))
                kept = stages[-1].kept
            else:  # reshapes only: every token stays possible
                stages.append(StageRecord(name=name, label=_stage_label(name, settings), active=True,
                                          kept=kept, removed=0, removed_mass=0.0))
            current = after
    if settings.greedy:
        final_probs = torch.zeros_like(current)
        final_probs[torch.argmax(current)] = 1.0
    else:
        final_probs = current.softmax(dim=-1)
    entropy = 0.0 if settings.greedy else entropy_bits(final_probs)  # one certain token: 0 bits
    return ChainOutput(final_logits=current, final_probs=final_probs,
                       final_entropy_bits=entropy, stages=tuple(stages))


def draw_uniform(generator: torch.Generator) -> float:
    """One uniform number in [0, 1) from the generation's own generator."""
    return float(torch.rand((), generator=generator, dtype=torch.float64))


def _ranked(final_probs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """`ids` ordered by final probability, highest first, ties by id."""
    by_id = ids.sort().values
    return by_id[torch.sort(final_probs[by_id], descending=True, stable=True).indices]


def _leading_cdf(final_probs: torch.Tensor, u: float, total: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The leading tokens in CDF order and their running mass, far enough to pass u.

    Sorting the whole vocabulary costs milliseconds on a CPU; the mass is usually in a few
    hundred tokens, so grow a top-k until its exact prefix (tokens strictly above the k-th
    value, so ties at the cut never reorder) reaches u.
    """
    alive = int((final_probs > 0).sum())
    k = 64
    while True:
        k = min(k, alive)
        if k == alive:
            head = (final_probs > 0).nonzero().flatten()
        else:
            head = (final_probs > torch.topk(final_probs, k).values[-1]).nonzero().flatten()
        order = _ranked(final_probs, head)
        cdf = final_probs[order].double().cumsum(dim=0) / total
        if k == alive or (len(cdf) > 0 and u < float(cdf[-1])):
            return order, cdf
        k *= 4


@on_sampler_thread
def pick_by_cdf(final_probs: torch.Tensor, u: float) -> tuple[int, Draw]:
    """Inverse-CDF sampling: order tokens by probability, lay their masses end to end on
    [0, 1), and pick the token whose band contains u."""
    order, cdf = _leading_cdf(final_probs, u, final_probs.double().sum())
    rank0 = int(torch.searchsorted(cdf, torch.tensor([u], dtype=torch.float64), right=True))
    rank0 = min(rank0, len(order) - 1)  # float rounding must never land u past the last token
    low = float(cdf[rank0 - 1]) if rank0 > 0 else 0.0
    return int(order[rank0]), Draw(u=u, cdf_low=low, cdf_high=float(cdf[rank0]), rank=rank0 + 1, method="cdf")


@on_sampler_thread
def pick_like_multinomial(final_probs: torch.Tensor, generator: torch.Generator) -> tuple[int, Draw]:
    """Sample exactly as `torch.multinomial(probs, 1)` does on the CPU: one Exp(1) waiting
    time per token, pick the largest probability / time. With the same generator state this
    reproduces `generate(do_sample=True)` after `torch.manual_seed`, token for token."""
    waits = torch.empty_like(final_probs).exponential_(1, generator=generator)  # [vocab]
    token = int(torch.argmax(final_probs / waits))
    # the pick's band: every token ahead of it in CDF order (higher probability, or tied with a lower id)
    mine = final_probs[token]
    ahead = (final_probs > mine) | ((final_probs == mine) & (torch.arange(final_probs.numel()) < token))
    probs = final_probs.double()
    total = probs.sum()
    low = float(probs[ahead].sum() / total)
    high = low + float(probs[token] / total)
    return token, Draw(u=None, cdf_low=low, cdf_high=high, rank=int(ahead.sum()) + 1, method="multinomial")


DRAW_METHODS = ("cdf", "multinomial")


@on_sampler_thread
def decide(logits: torch.Tensor, context_ids: torch.Tensor, settings: SamplerSettings,
           u: float | None, force_token_id: int | None = None, *,
           generator: torch.Generator | None = None) -> tuple[Decision, ChainOutput]:
    """Run the chain and pick: argmax for greedy, else a random draw.

    Pass either `u`, the step's uniform number (inverse-CDF draw), or `generator` to draw
    the way torch.multinomial does. A forced token replaces the pick but the sampler's own
    choice is still reported.
    """
    chain = run_chain(logits, context_ids, settings)
    if settings.greedy or (u is None and generator is None):
        sampler_pick, draw = int(torch.argmax(chain.final_probs)), None
    elif generator is not None:
        sampler_pick, draw = pick_like_multinomial(chain.final_probs, generator)
    else:
        sampler_pick, draw = pick_by_cdf(chain.final_probs, u)
    token_id = sampler_pick if force_token_id is None else force_token_id
    decision = Decision(
        settings=settings, stages=chain.stages, token_id=token_id, greedy=settings.greedy,
        forced=force_token_id is not None, sampler_token_id=sampler_pick, draw=draw,
        final_prob=float(chain.final_probs[token_id]),
        final_entropy_bits=chain.final_entropy_bits,
        final_kept=int((chain.final_probs > 0).sum()),
    )
    return decision, chain
