"""Same prompt, different answers: why temperature 0 can still vary on a server, measured.

A server packs many visitors' decode steps into one pass. With the library's batched matrix
product (`fast`), each row's sums are added in an order set by the batch's shape, so a
visitor's logits move in their last digits with the company it keeps; float addition is not
associative. Where the top two logits are closer than that move, greedy picks another token
and everything after it differs. The `exact` packed pass gives every row its lone pass's
digits bit for bit (engine/serving/packed.py), so no company can change an answer.

Every number here comes from real passes, never a simulation:
  1. `decode_alone`: the visitor's prompt decoded alone, batch-1 steps: the reference.
  2. `decode_in_company`: the same prompt decoded while other sequences decode in the SAME
     packed passes (`forward_packed`), each step compared with the lone run's step.
  3. `repeated_experiment`: step 2 many times with fresh random company, in both modes, and
     how many distinct completions came out.
A sampled variant (a fixed seed, temperature > 0) draws the same u at every step in both runs,
so it too differs only where the logits do. On a GPU no packed pass is proven to keep the lone
digits (`packed_pass_path` says which pass runs): there the `exact` figures say how far it moves.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from engine.errors import SettingsError
from engine.fast import kernel_available, lone_rows_linear
from engine.forward import cache_length, cache_prefix, forward, forward_one, new_cache
from engine.loading import LoadedModel
from engine.prompt import build_prompt
from engine.sampling import InverseCdf, decide, draw_uniform, top_token
from engine.serving.packed import forward_packed
from engine.settings import SamplerSettings, check_seed, is_whole
from engine.speed import sample_context

RUNS = (1, 64)
TOKENS = (1, 128)
BATCH = (2, 16)  # rows in a packed pass, the visitor's included
COMPANY_LENGTHS = (4, 48)  # tokens in each other visitor's context: caches stay small at any batch
MODES = {"exact": True, "fast": False}
TIMING_REPEATS = 9  # timed packed passes per mode, interleaved
TIMING_REPEATS_RANGE = (1, 50)
# How each pass runs: at once (`at_once`), or through a server's queue (ForwardScheduler.call), so
# an experiment's passes wait their turn with every visitor's instead of fighting them for the cores.
PassRunner = Callable[[Callable[[], Any]], Any]
Progress = Callable[[int, int], None]  # (decodes done, decodes in all): a page's progress bar


def at_once(job: Callable[[], Any]) -> Any:
    return job()


@dataclass(frozen=True)
class Sampling:
    """A sampled decode with a fixed seed. Each step draws one uniform u from a generator seeded
    with `seed`, as a generation does (`draw_uniform`), and the engine's sampler picks the token
    whose CDF band holds it (`InverseCdf`): a lone run and a run in company draw the same u at
    every step, so they differ only where their logits do."""

    settings: SamplerSettings
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.settings, SamplerSettings) or self.settings.greedy:
            raise SettingsError("temperature", getattr(self.settings, "temperature", self.settings),
                                "above 0 for a sampled run (temperature 0 is greedy: pass no sampling)")
        check_seed(self.seed)

    def generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed)


@dataclass(frozen=True)
class LoneStep:
    """One step of the lone run."""

    token_id: int
    margin: float  # top logit minus the second: how far the pick is from a tie
    u: float | None = None  # sampled runs: the step's uniform draw
    band_gap: float | None = None  # sampled runs: how far u fell from the nearer edge of its token's CDF band
    # sampled runs: the pick's logit minus the nearest other token's, in absolute value. Bands are
    # laid in order of probability, so a token within this of the pick can swap places with it
    # and move its band under the same u, however far u is from an edge
    rival_gap: float | None = None


@dataclass(frozen=True, eq=False)
class LoneRun:
    """The visitor's prompt decoded alone, batch-1 steps (`forward_one`): the reference."""

    prompt_ids: tuple[int, ...]
    steps: tuple[LoneStep, ...]
    text: str
    logits: torch.Tensor  # [steps, vocab]: kept to compare each step in company with
    sampling: Sampling | None = None

    @property
    def token_ids(self) -> tuple[int, ...]:
        return tuple(step.token_id for step in self.steps)


@dataclass(frozen=True)
class CompanyStep:
    """One step of the visitor's row in a packed pass, against the lone run's same step."""

    token_id: int
    lone_token_id: int
    # largest |logit - lone logit| over the vocabulary; None once an earlier step's token
    # differed: the contexts differ from there, so the logits are not comparable
    max_abs_logit_diff: float | None
    lone_margin: float  # the lone run's top-two margin at this step
    differs: bool  # this step's token is not the lone run's


@dataclass(frozen=True)
class CompanyRun:
    """The visitor's prompt decoded in company: `batch` rows in every packed pass."""

    exact: bool
    batch: int
    row: int  # the visitor's row in the pass
    company_lengths: tuple[int, ...]  # each other row's context when the decode began
    steps: tuple[CompanyStep, ...]
    text: str
    step_ms: float  # median time of one whole packed pass

    @property
    def token_ids(self) -> tuple[int, ...]:
        return tuple(step.token_id for step in self.steps)

    @property
    def first_divergence(self) -> int | None:
        """The first step whose token is not the lone run's, or None."""
        return next((index for index, step in enumerate(self.steps) if step.differs), None)

    @property
    def max_abs_logit_diff(self) -> float:
        """Over the steps compared (up to and including the first divergence)."""
        return max((s.max_abs_logit_diff for s in self.steps if s.max_abs_logit_diff is not None), default=0.0)


@dataclass(frozen=True)
class ModeResult:
    """One batching mode over every run of an experiment."""

    mode: str  # "exact" or "fast"
    runs: tuple[CompanyRun, ...]
    distinct_completions: int
    max_abs_logit_diff: float  # over runs and steps, against the lone run, up to each run's first divergence
    first_divergence: tuple[int | None, ...]  # per run
    texts: tuple[str, ...]
    ms_per_step: float  # median packed pass at the experiment's batch (`PackedSpeed`)


@dataclass(frozen=True)
class PackedSpeed:
    """Both modes' packed pass on the same rows, interleaved: what batch invariance costs."""

    batch: int
    repeats: int
    exact_ms: float  # median
    fast_ms: float


@dataclass(frozen=True)
class DeterminismResult:
    """The same prompt run many times, each time beside fresh random company, in both modes."""

    prompt: str
    runs: int
    tokens: int
    batch: int  # the largest batch; each run's own is drawn from 2 to this
    seed: int
    lone: LoneRun
    exact: ModeResult
    fast: ModeResult
    speed: PackedSpeed

    def mode(self, name: str) -> ModeResult:
        return {"exact": self.exact, "fast": self.fast}[name]


# ---- the two decodes ---------------------------------------------------------------------

def top_two_margin(logits: torch.Tensor) -> float:
    """The top logit minus the second (0 for a tie)."""
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


@dataclass(frozen=True)
class _Pick:
    token_id: int
    u: float | None
    band_gap: float | None
    rival_gap: float | None


def _pick(logits: torch.Tensor, context: list[int], sampling: Sampling | None,
          generator: torch.Generator | None) -> _Pick:
    """The visitor's token: the argmax, or the engine's sampler with this step's draw."""
    if sampling is None:
        return _Pick(top_token(logits), None, None, None)
    decision, _ = decide(logits, torch.tensor(context), sampling.settings, InverseCdf(draw_uniform(generator)))
    draw, token = decision.draw, decision.token_id
    others = torch.cat([logits[:token], logits[token + 1:]])
    return _Pick(token, draw.u, min(draw.u - draw.cdf_low, draw.cdf_high - draw.u),
                 float((others - logits[token]).abs().min()))


def _prefilled(lm: LoadedModel, sequence: Sequence[int], run: PassRunner = at_once) -> DynamicCache:
    """A cache holding all of `sequence` but its last token, read alone: the last one is the
    first decode step, so lone and packed runs begin from the same cache digits."""
    cache = new_cache(lm)
    run(lambda: forward(lm, torch.tensor([list(sequence[:-1])]), cache))
    return cache


def _timed(job: Callable[[], torch.Tensor]) -> Callable[[], tuple[torch.Tensor, float]]:
    """`job` returning its result and its own time in ms (not the wait for its turn)."""
    def timed() -> tuple[torch.Tensor, float]:
        started = time.perf_counter()
        result = job()
        return result, (time.perf_counter() - started) * 1e3
    return timed


@torch.inference_mode()
def decode_alone(lm: LoadedModel, prompt_ids: Sequence[int], tokens: int,
                 sampling: Sampling | None = None, *, run: PassRunner = at_once) -> LoneRun:
    """Decode `tokens` steps of `prompt_ids` in batch-1 steps (`forward_one`), greedy or with
    `sampling`; end tokens do not stop it, so every run has the same length. `run` runs each pass."""
    _check_whole("tokens", tokens, TOKENS)
    prompt = _checked_sequence(lm, "prompt", prompt_ids, tokens)
    cache = _prefilled(lm, prompt, run)
    generator = sampling.generator() if sampling is not None else None
    context, steps, kept = list(prompt), [], []
    for _ in range(tokens):
        logits = run(lambda: forward_one(lm, [context[-1]], cache))  # [vocab]
        pick = _pick(logits, context, sampling, generator)
        steps.append(LoneStep(pick.token_id, top_two_margin(logits), pick.u, pick.band_gap, pick.rival_gap))
        kept.append(logits)
        context.append(pick.token_id)
    return LoneRun(tuple(prompt), tuple(steps), _text(lm, context[len(prompt):]), torch.stack(kept), sampling)


@torch.inference_mode()
def decode_in_company(lm: LoadedModel, prompt_ids: Sequence[int], tokens: int, company: Sequence[Sequence[int]],
                      exact: bool, *, row: int = 0, lone: LoneRun | None = None,
                      sampling: Sampling | None = None, run: PassRunner = at_once) -> CompanyRun:
    """Decode `tokens` steps of `prompt_ids` while `company` (other visitors' contexts) decodes
    beside it in the same packed passes (`forward_packed`, `exact` or fast), the visitor at
    `row`. Each row has its own cache, read alone first; the company follows its own greedy
    picks. Every step is compared with `lone` (decoded here when not given) up to the first
    step whose token differs; decoding goes on after it, so the text is whole. `run` runs each
    pass; a step's time is its pass's own, not its wait."""
    _check_whole("tokens", tokens, TOKENS)
    if not isinstance(exact, bool):
        raise SettingsError("exact", exact, "True (each row its lone digits) or False (one batched product)")
    prompt = _checked_sequence(lm, "prompt", prompt_ids, tokens)
    others = _checked_rows(lm, "company", company, tokens, seats=1)
    _check_whole("row", row, (0, len(others)))
    lone = decode_alone(lm, prompt, tokens, sampling, run=run) if lone is None else lone
    if lone.prompt_ids != tuple(prompt) or lone.sampling != sampling or len(lone.steps) < tokens:
        raise SettingsError("lone", "a lone run of another decode",
                            f"the lone run of this prompt and sampling, at least {tokens} steps long")
    sequences = [*others[:row], prompt, *others[row:]]
    caches = [_prefilled(lm, sequence, run) for sequence in sequences]
    last = [sequence[-1] for sequence in sequences]
    generator = sampling.generator() if sampling is not None else None
    context, steps, times = list(prompt), [], []
    diverged = False
    for index in range(tokens):
        logits, ms = run(_timed(lambda last=last: forward_packed(lm, last, caches, exact)))  # [rows, vocab]
        times.append(ms)
        pick = _pick(logits[row], context, sampling, generator)
        steps.append(_compared(logits[row], pick.token_id, lone, index, diverged))
        diverged = diverged or steps[-1].differs
        last = [top_token(other) for other in logits]
        last[row] = pick.token_id
        context.append(pick.token_id)
    return CompanyRun(exact, len(sequences), row, tuple(len(s) for s in others), tuple(steps),
                      _text(lm, context[len(prompt):]), statistics.median(times))


def _compared(logits: torch.Tensor, token_id: int, lone: LoneRun, index: int, diverged: bool) -> CompanyStep:
    """The visitor's step against the lone run's; logits compared only while the contexts agree."""
    reference = lone.steps[index]
    diff = None if diverged else float((logits - lone.logits[index]).abs().max())
    return CompanyStep(token_id, reference.token_id, diff, reference.margin, token_id != reference.token_id)


# ---- the experiment ----------------------------------------------------------------------

def random_company(lm: LoadedModel, batch: int, rng: random.Random) -> list[list[int]]:
    """`batch - 1` other visitors' contexts: ordinary text at random offsets, of random lengths
    within COMPANY_LENGTHS (less where the context window is short)."""
    _check_whole("batch size", batch, BATCH)
    low, high = COMPANY_LENGTHS
    high = max(low, min(high, lm.context_window - TOKENS[1] - 1))
    return [sample_context(lm, rng.randint(low, high), offset=rng.randrange(10_000)) for _ in range(batch - 1)]


def repeated_experiment(lm: LoadedModel, prompt: str, runs: int, tokens: int, batch: int, seed: int, *,
                        sampler: SamplerSettings | None = None, timing_repeats: int = TIMING_REPEATS,
                        run: PassRunner = at_once, progress: Progress | None = None) -> DeterminismResult:
    """Run `prompt` `runs` times in each mode, each run beside fresh random company: a batch size
    drawn from 2 to `batch`, the visitor at a random row, and the others' contexts from
    `random_company` (a server's company changes with its load, and so does the shape of its
    products). Both modes meet the same company in the same run, so they differ only in how the
    pass multiplies. Greedy, or sampled with `sampler` (temperature > 0, draws seeded with
    `seed`). Both modes' packed pass is timed at `batch` on the same rows, `timing_repeats`
    times each. Memory stays bounded: the lone run's logits (`tokens` x vocabulary) and one
    run's caches at a time. `run` runs each pass (a server's queue); `progress(done, all)` is
    told after the lone run and after each run in company."""
    _check_whole("runs", runs, RUNS)
    _check_whole("tokens", tokens, TOKENS)
    _check_whole("batch size", batch, BATCH)
    _check_whole("timing repeats", timing_repeats, TIMING_REPEATS_RANGE)
    check_seed(seed)
    prompt_ids = build_prompt(lm, prompt, chat=False).ids
    sampling = None if sampler is None else Sampling(sampler, seed)
    told = progress or (lambda done, total: None)
    total = 1 + 2 * runs
    lone = decode_alone(lm, prompt_ids, tokens, sampling, run=run)
    told(1, total)
    rng = random.Random(seed)
    seats = [_seat(lm, batch, rng) for _ in range(runs)]
    speed = packed_step_ms(lm, [prompt_ids, *random_company(lm, batch, rng)], timing_repeats, run=run)
    results = {}
    for name, exact in MODES.items():
        done = []
        for company, row in seats:
            done.append(decode_in_company(lm, prompt_ids, tokens, company, exact, row=row, lone=lone,
                                          sampling=sampling, run=run))
            told(1 + len(done) + runs * (name == "fast"), total)
        results[name] = _mode_result(name, done, speed.exact_ms if exact else speed.fast_ms)
    return DeterminismResult(prompt, runs, tokens, batch, seed, lone, results["exact"], results["fast"], speed)


def _seat(lm: LoadedModel, batch: int, rng: random.Random) -> tuple[list[list[int]], int]:
    """One run's company (of a random size) and the visitor's row among it."""
    size = rng.randint(BATCH[0], batch)
    return random_company(lm, size, rng), rng.randrange(size)


def _mode_result(mode: str, runs: list[CompanyRun], ms_per_step: float) -> ModeResult:
    return ModeResult(mode, tuple(runs), len({run.token_ids for run in runs}),
                      max(run.max_abs_logit_diff for run in runs), tuple(run.first_divergence for run in runs),
                      tuple(run.text for run in runs), ms_per_step)


@torch.inference_mode()
def packed_step_ms(lm: LoadedModel, sequences: Sequence[Sequence[int]], repeats: int = TIMING_REPEATS, *,
                   run: PassRunner = at_once) -> PackedSpeed:
    """One packed decode pass over `sequences`' rows, exact and fast interleaved (so a busy
    machine slows both alike), each pass on fresh views of the same caches: medians in ms."""
    _check_whole("timing repeats", repeats, TIMING_REPEATS_RANGE)
    sequences = _checked_rows(lm, "sequences", sequences, 1, seats=0)
    caches = [_prefilled(lm, sequence, run) for sequence in sequences]
    last = [sequence[-1] for sequence in sequences]
    times: dict[bool, list[float]] = {True: [], False: []}
    for repeat in range(repeats + 1):
        for exact in (True, False):
            views = [cache_prefix(cache, cache_length(cache)) for cache in caches]
            _, ms = run(_timed(lambda views=views, exact=exact: forward_packed(lm, last, views, exact)))
            if repeat:  # the first pass of each shape settles its probes: untimed
                times[exact].append(ms)
    return PackedSpeed(len(sequences), repeats, statistics.median(times[True]), statistics.median(times[False]))


def near_ties(lone: LoneRun, threshold: float) -> tuple[int, ...]:
    """The lone run's steps whose top-two margin is below `threshold` logits. A change of at
    most d in every logit can swap two tokens only where they are within 2d: pass twice a
    measured `max_abs_logit_diff` to list every step where that change could flip greedy."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not threshold >= 0:
        raise SettingsError("threshold", threshold, "a number >= 0 (a logit difference)")
    return tuple(index for index, step in enumerate(lone.steps) if step.margin < threshold)


# ---- why: the order of a sum, on the spot -------------------------------------------------

@dataclass(frozen=True)
class SumOrder:
    """Three numbers added in two orders in one float type: (a + b) + c against a + (b + c)."""

    dtype: str
    a: float
    b: float
    c: float
    left: float  # (a + b) + c
    right: float  # a + (b + c)


def sum_in_two_orders(a: float, b: float, c: float, dtype: torch.dtype = torch.float32) -> SumOrder:
    """Computed now with torch in `dtype`: each operand and each partial sum rounded to it."""
    x, y, z = (torch.tensor(v, dtype=dtype) for v in (a, b, c))
    return SumOrder(str(dtype).removeprefix("torch."), float(x), float(y), float(z), float((x + y) + z),
                    float(x + (y + z)))


@dataclass(frozen=True)
class ProductOrder:
    """One row of a real weight's product, alone and inside a batch of `rows` rows."""

    weight: str  # which of the model's weights
    rows: int
    inputs: int
    outputs: int
    batched_max_diff: float  # row 0 in the library's batched product against row 0 alone
    batched_outputs_differing: int  # of `outputs`
    exact_max_diff: float | None  # row 0 in the exact rows kernel's product; None where it is not built


@torch.inference_mode()
def product_in_two_shapes(lm: LoadedModel, rows: int = 8) -> ProductOrder:
    """The model's first linear layer that reads the hidden state, applied to the embeddings of
    `rows` ordinary tokens: the first row multiplied alone (what a lone visitor's pass does),
    inside the `rows`-row batched product (a fast packed pass), and through the exact rows kernel
    (an exact packed pass). Real weights, real embeddings, the kernels this machine chooses."""
    _check_whole("rows", rows, BATCH)
    hidden = lm.model.config.hidden_size
    name, layer = next((n, m) for n, m in lm.model.named_modules()
                       if isinstance(m, torch.nn.Linear) and m.in_features == hidden)
    ids = sample_context(lm, rows, offset=0)
    x = lm.model.get_input_embeddings().weight[ids].to(layer.weight.dtype).contiguous()
    alone = torch.nn.functional.linear(x[:1], layer.weight)[0]
    batched = torch.nn.functional.linear(x, layer.weight)[0]
    exact = None
    if lm.device.type == "cpu" and layer.weight.dtype == torch.float32 and kernel_available():
        exact = float((lone_rows_linear(x, layer.weight)[0] - alone).abs().max())
    return ProductOrder(name, rows, layer.in_features, layer.out_features, float((batched - alone).abs().max()),
                        int((batched != alone).sum()), exact)


# ---- validation --------------------------------------------------------------------------

def _check_whole(parameter: str, value: object, bounds: tuple[int, int]) -> None:
    low, high = bounds
    if not (is_whole(value) and low <= value <= high):
        raise SettingsError(parameter, value, f"a whole number from {low} to {high}")


def _checked_sequence(lm: LoadedModel, parameter: str, ids: object, tokens: int) -> list[int]:
    """Token ids that can be decoded `tokens` steps: at least two (all but the last are read
    alone first), each in the vocabulary, and room left in the context window."""
    vocab, room = lm.model.config.vocab_size, lm.context_window - tokens
    if not isinstance(ids, Sequence) or isinstance(ids, str) or not all(is_whole(i) and 0 <= i < vocab for i in ids):
        raise SettingsError(parameter, ids, f"a list of token ids from 0 to {vocab - 1}")
    if not 2 <= len(ids) <= room:
        raise SettingsError(f"{parameter} length", len(ids),
                            f"from 2 to {room} tokens (the context window is {lm.context_window}, "
                            f"with room for {tokens} new tokens)")
    return list(ids)


def _checked_rows(lm: LoadedModel, parameter: str, rows: object, tokens: int, seats: int) -> list[list[int]]:
    """Rows of a packed pass that has `seats` more rows besides, each decodable `tokens` steps."""
    low, high = BATCH[0] - seats, BATCH[1] - seats
    if not isinstance(rows, Sequence) or isinstance(rows, str) or not low <= len(rows) <= high:
        raise SettingsError(parameter, rows, f"a list of {low} to {high} token-id sequences")
    return [_checked_sequence(lm, f"{parameter} row", ids, tokens) for ids in rows]


def _text(lm: LoadedModel, ids: Sequence[int]) -> str:
    return lm.tokenizer.decode(list(ids), skip_special_tokens=True)
