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
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.settings import CHAINS, GREEDY_BELOW_TEMPERATURE, SamplerSettings

NEG_INF = float("-inf")


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
class Stage:
    """One sampler stage, the way transformers has one class per transform.

    Args:
        name: its key in `engine.settings.CHAINS`.
        apply: (logits `[vocab]`, context ids, settings) -> new logits; never in place.
        is_neutral: True when the settings turn the stage off.
        label: the stage and its setting, for people.
        removes_tokens: a filter (tokens leave at -inf) rather than a reshape.
    """

    name: str
    apply: Callable[[torch.Tensor, torch.Tensor, SamplerSettings], torch.Tensor]
    is_neutral: Callable[[SamplerSettings], bool]
    label: Callable[[SamplerSettings], str]
    removes_tokens: bool


STAGES: dict[str, Stage] = {stage.name: stage for stage in (
    Stage("repetition_penalty",
          lambda logits, context, s: penalize_repetition(logits, context, s.repetition_penalty),
          lambda s: s.repetition_penalty == 1.0, lambda s: f"repetition penalty {s.repetition_penalty:g}", False),
    Stage("temperature", lambda logits, _, s: scale_temperature(logits, s.temperature),
          lambda s: s.temperature == 1.0, lambda s: f"temperature {s.temperature:g}", False),
    Stage("top_k", lambda logits, _, s: keep_top_k(logits, s.top_k, s.min_tokens_to_keep),
          lambda s: s.top_k == 0, lambda s: f"top-k {s.top_k}", True),
    Stage("top_p", lambda logits, _, s: keep_top_p(logits, s.top_p, s.min_tokens_to_keep),
          lambda s: s.top_p >= 1.0, lambda s: f"top-p {s.top_p:g}", True),
    Stage("min_p", lambda logits, _, s: keep_min_p(logits, s.min_p, s.min_tokens_to_keep),
          lambda s: s.min_p == 0.0, lambda s: f"min-p {s.min_p:g}", True),
)}


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
    # a reshaping stage (temperature, repetition penalty) removes nothing: what it did is how it
    # moved the distribution; None for filters and for stages that did not run
    top_prob_before: float | None = None  # the most probable token's probability entering the stage
    top_prob_after: float | None = None  # that same token's probability leaving it
    entropy_before_bits: float | None = None
    entropy_after_bits: float | None = None


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
    greedy_token: int | None = None  # greedy: the one token final_probs holds (probability 1)

    def leaders(self, n: int) -> list[int]:
        """Up to `n` tokens of highest final probability, none with probability 0."""
        if self.greedy_token is not None:  # a one-hot: no need to rank the vocabulary
            return [self.greedy_token]
        return leading_ids(self.final_probs, n)


def top_token(values: torch.Tensor) -> int:
    """The index of the largest value of a 1-D tensor: the first of equal maxima, and the first
    NaN if there is one, exactly as `torch.argmax` (tests/engine/test_sampler_stages.py proves it on
    ties, infinities, NaNs and bfloat16). `torch.max(dim=0)` runs a vectorised reduction and
    takes a fraction of argmax's time over the vocabulary, and a step takes it several times."""
    return int(torch.max(values, dim=0).indices)


def leading_ids(values: torch.Tensor, n: int) -> list[int]:
    """The ids of the `n` largest values of a 1-D tensor, highest first, leaving out zeros."""
    top_values, top_ids = torch.topk(values, min(n, values.numel()))
    return [i for i, v in zip(top_ids.tolist(), top_values.tolist(), strict=True) if v > 0]


SUM_BLOCK = 1024  # a long sum's terms, summed a block at a time by one thread


def ordered_sum(values: torch.Tensor) -> torch.Tensor:
    """The sum of a 1-D tensor (0-d), the same digits at any thread count. torch splits one long
    sum between threads, so its last digit moved with the thread count (a 49,152-token entropy,
    measured between the sampler's one thread and a page's two); here each block is summed whole
    by one thread, then the blocks in order."""
    values = values.flatten()
    blocks = F.pad(values, (0, -values.numel() % SUM_BLOCK)).view(-1, SUM_BLOCK)  # + 0.0 changes no sum
    return blocks.sum(dim=1).sum()


def entropy_bits(probs: torch.Tensor) -> float:
    """Shannon entropy of a distribution, in bits (0 = certain)."""
    return float(ordered_sum(torch.special.entr(probs.double()))) / math.log(2)  # entr(0) = 0


class _Softmaxes:
    """Each logits tensor's softmax and entropy, computed once however many records ask: one
    reshape's output is the next one's input."""

    def __init__(self) -> None:
        self._of: tuple[torch.Tensor, torch.Tensor, float] | None = None

    def __call__(self, logits: torch.Tensor) -> tuple[torch.Tensor, float]:
        if self._of is None or self._of[0] is not logits:
            probs = logits.softmax(dim=-1)  # [vocab]
            self._of = (logits, probs, entropy_bits(probs))
        return self._of[1], self._of[2]


def _applied_record(stage: Stage, settings: SamplerSettings, before: torch.Tensor, after: torch.Tensor,
                    kept_before: int, softmaxes: _Softmaxes) -> StageRecord:
    """What an applied stage did: a filter's removed tokens (newly at -inf) and the mass they
    held; a reshape keeps every token possible, and moves the distribution."""
    if not stage.removes_tokens:
        (probs_before, entropy_before), (probs_after, entropy_after) = softmaxes(before), softmaxes(after)
        top = top_token(probs_before)
        return StageRecord(stage.name, stage.label(settings), active=True, kept=kept_before, removed=0,
                           removed_mass=0.0, top_prob_before=float(probs_before[top]),
                           top_prob_after=float(probs_after[top]), entropy_before_bits=entropy_before,
                           entropy_after_bits=entropy_after)
    gone_after = torch.isneginf(after)
    removed = gone_after & ~torch.isneginf(before)
    removed_count = int(removed.sum())
    removed_mass = float(ordered_sum(before.softmax(dim=-1).double()[removed])) if removed_count else 0.0
    return StageRecord(stage.name, stage.label(settings), active=True, kept=after.numel() - int(gone_after.sum()),
                       removed=removed_count, removed_mass=removed_mass)


def _skipped_record(stage: Stage, settings: SamplerSettings, kept: int, note: str) -> StageRecord:
    return StageRecord(stage.name, stage.label(settings), active=False, kept=kept, removed=0, removed_mass=0.0,
                       note=note)


def _skip_note(stage: Stage, settings: SamplerSettings) -> str | None:
    """Why a stage does not run, or None when it does. Greedy keeps only the repetition
    penalty: it changes which token is the argmax; nothing else can."""
    if settings.greedy and stage.name != "repetition_penalty":
        if stage.name != "temperature":
            return "not used by greedy"
        if settings.temperature == 0:
            return "greedy: the argmax is taken"
        return f"greedy: below {GREEDY_BELOW_TEMPERATURE:g} the argmax is taken (dividing by it would overflow)"
    return "off" if stage.is_neutral(settings) else None


def run_chain(logits: torch.Tensor, context_ids: torch.Tensor, settings: SamplerSettings) -> ChainOutput:
    """Apply the sampler stages in the chain's order and record what each one did.

    With temperature 0 only the repetition penalty applies; the argmax of the penalised
    logits gets probability 1 (the other filters cannot remove the top token anyway).
    """
    records: list[StageRecord] = []
    current = logits
    kept = logits.numel() - int(torch.isneginf(logits).sum())
    softmaxes = _Softmaxes()
    for stage in (STAGES[name] for name in CHAINS[settings.chain]):
        note = _skip_note(stage, settings)
        if note is not None:
            records.append(_skipped_record(stage, settings, kept, note))
            continue
        after = stage.apply(current, context_ids, settings)
        records.append(_applied_record(stage, settings, current, after, kept, softmaxes))
        kept, current = records[-1].kept, after
    greedy_token = None
    if settings.greedy:
        greedy_token = top_token(current)
        final_probs = torch.zeros_like(current)
        final_probs[greedy_token] = 1.0
        entropy = 0.0  # one certain token: 0 bits
    else:
        final_probs, entropy = softmaxes(current)
    return ChainOutput(final_logits=current, final_probs=final_probs,
                       final_entropy_bits=entropy, stages=tuple(records), greedy_token=greedy_token)


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


def pick_by_cdf(final_probs: torch.Tensor, u: float) -> tuple[int, Draw]:
    """Inverse-CDF sampling: order tokens by probability, lay their masses end to end on
    [0, 1), and pick the token whose band contains u."""
    order, cdf = _leading_cdf(final_probs, u, ordered_sum(final_probs.double()))
    rank0 = int(torch.searchsorted(cdf, torch.tensor([u], dtype=torch.float64), right=True))
    rank0 = min(rank0, len(order) - 1)  # float rounding must never land u past the last token
    low = float(cdf[rank0 - 1]) if rank0 > 0 else 0.0
    return int(order[rank0]), Draw(u=u, cdf_low=low, cdf_high=float(cdf[rank0]), rank=rank0 + 1, method="cdf")


def pick_like_multinomial(final_probs: torch.Tensor, generator: torch.Generator) -> tuple[int, Draw]:
    """Sample exactly as `torch.multinomial(probs, 1)` does on the CPU: one Exp(1) waiting
    time per token, pick the largest probability / time. With the same generator state this
    reproduces `generate(do_sample=True)` after `torch.manual_seed`, token for token."""
    waits = torch.empty_like(final_probs).exponential_(1, generator=generator)  # [vocab]
    token = top_token(final_probs / waits)
    # the pick's band: every token ahead of it in CDF order (higher probability, or tied with a lower id)
    mine = final_probs[token]
    ahead = (final_probs > mine) | ((final_probs == mine) & (torch.arange(final_probs.numel()) < token))
    probs = final_probs.double()
    total = ordered_sum(probs)
    low = float(ordered_sum(probs[ahead]) / total)
    high = low + float(probs[token] / total)
    return token, Draw(u=None, cdf_low=low, cdf_high=high, rank=int(ahead.sum()) + 1, method="multinomial")


DRAW_METHODS = ("cdf", "multinomial")


@dataclass(frozen=True)
class Argmax:
    """No draw: the most probable token of the final distribution (greedy decoding)."""


@dataclass(frozen=True)
class InverseCdf:
    """One uniform number `u` in [0, 1) picks the token whose CDF band holds it."""

    u: float


@dataclass(frozen=True, eq=False)
class Multinomial:
    """Draw as torch.multinomial does, from this generator (which advances)."""

    generator: torch.Generator


DrawStrategy = Argmax | InverseCdf | Multinomial


def pick(final_probs: torch.Tensor, strategy: DrawStrategy) -> tuple[int, Draw | None]:
    """The token the strategy picks from the final distribution, and its draw (None for argmax)."""
    if isinstance(strategy, InverseCdf):
        return pick_by_cdf(final_probs, strategy.u)
    if isinstance(strategy, Multinomial):
        return pick_like_multinomial(final_probs, strategy.generator)
    return top_token(final_probs), None


def decide(logits: torch.Tensor, context_ids: torch.Tensor, settings: SamplerSettings, strategy: DrawStrategy,
           force_token_id: int | None = None) -> tuple[Decision, ChainOutput]:
    """Run the chain and pick with `strategy`; greedy settings always take the argmax (no
    draw is made). A forced token replaces the pick, but the sampler's own choice is still
    reported."""
    chain = run_chain(logits, context_ids, settings)
    if chain.greedy_token is not None:
        sampler_pick, draw = chain.greedy_token, None
    else:
        sampler_pick, draw = pick(chain.final_probs, strategy)
    token_id = sampler_pick if force_token_id is None else force_token_id
    decision = Decision(
        settings=settings, stages=chain.stages, token_id=token_id, greedy=settings.greedy,
        forced=force_token_id is not None, sampler_token_id=sampler_pick, draw=draw,
        final_prob=float(chain.final_probs[token_id]),
        final_entropy_bits=chain.final_entropy_bits,
        final_kept=1 if chain.greedy_token is not None else int((chain.final_probs > 0).sum()),
    )
    return decision, chain
