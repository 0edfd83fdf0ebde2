"""Check a student's own sampler and stop-sequence code against the engine's.

Courses have students write the sampler's stages (temperature, top-k, top-p, min-p) and the
stop-sequence rule themselves. This runs their function, case by case, on the real model's
logits and texts beside the engine's own code (`run_chain` for the sampler, `first_match` for
stops), and reports the first case that differs in plain words: the setting, where the logits
came from, the token that shows the difference, the engine's stage table and, where the
mistake is a known one, a hint.

    from engine import check_sampler, check_stop, load_model

    lm = load_model()
    print(check_sampler("student.py", lm))  # the file's final_distribution(...)
    print(check_stop("student.py", lm))     # the file's find_stop(text, stop_sequences)

The student's functions:
    final_distribution(logits, temperature, top_k, top_p, min_p) -> probabilities `[vocab]`
    find_stop(text, stop_sequences) -> the index where the first stop sequence begins, or None

Where float rounding alone decides a case (top-p exactly at a cumulative boundary, a min-p
threshold on a token's probability), the engine's answer a hair's breadth either side of the
setting is accepted too; a top-p cut so deep in the tail that rounding moves it by several
tokens is not checked; everywhere else the kept tokens must be the engine's exactly.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import product
from numbers import Integral
from pathlib import Path

import torch

from engine.cpu_threads import on_sampler_thread
from engine.generation import Generation
from engine.loading import LoadedModel, load_model
from engine.sampling import ChainOutput, StageRecord, keep_min_p, run_chain
from engine.settings import CHAINS, SamplerSettings, StopSettings
from engine.stopping import INCOMPLETE, escape, first_match, stop_sequence_states

SIGNATURES = {
    "final_distribution": "final_distribution(logits, temperature, top_k, top_p, min_p)",
    "find_stop": "find_stop(text, stop_sequences)",
}
STUDENT_FUNCTIONS = {"sampler": "final_distribution", "stop": "find_stop"}  # the CLI's subjects
# A probability agrees within PROB_TOLERANCE + PROB_RELATIVE x its value: a float32 softmax over a
# whole vocabulary is itself off by about 1e-5 of a probability (its sum of 49,152 terms), so a
# student working in float64 differs from the engine by that much on a large probability.
PROB_TOLERANCE = 1e-5
PROB_RELATIVE = 1e-4
SUM_TOLERANCE = 1e-4  # the same rounding, summed
# A threshold's neighbours: the engine's top-p cut, from its own float32 sums, sits up to a few
# 1e-5 away from the exact one, so top_p and min_p this far either side are accepted too
TOP_P_NUDGE = 1e-4
MIN_P_NUDGE = 1e-4  # relative
BOUNDARY_STEP = 1e-3  # "just above / below" a top-p boundary: well beyond rounding and the nudge

# Prompts whose greedy steps give the logits: two plain continuations (one sure of itself, one
# less so) and a chat question (flatter distributions).
PROMPTS: tuple[tuple[str, bool], ...] = (
    ("The capital of France is", False),
    ("Once upon a time", False),
    ("Write two short lines about the sea.", True),
)
GREEDY_STEPS = 3
STOP_PROMPT = "The capital of France is"  # its greedy text has punctuation, newlines and digits
STOP_TOKENS = 20


class StudentCodeError(RuntimeError):
    """The student's file cannot be loaded, lacks the function, or the function raised."""


# ---- loading the student's code --------------------------------------------------------------


def load_student(path: str | Path, function: str) -> Callable[..., object]:
    """The function `function` from the Python file at `path` (its module run once).

    Raises StudentCodeError naming what is wrong: no such file, a syntax error (with its line),
    an exception while the file runs, or no such function.
    """
    path = Path(path)
    if not path.is_file():
        raise StudentCodeError(f"{path}: no such file")
    name = f"_student_{path.stem}_{abs(hash(path.resolve()))}"  # two files with one name stay apart
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise StudentCodeError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look a module up by name
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        del sys.modules[name]
        raise StudentCodeError(f"{path}, line {exc.lineno}: syntax error: {exc.msg}") from exc
    except Exception as exc:
        del sys.modules[name]
        raise StudentCodeError(f"{path} raised {_exception_words(exc)} while loading{_raised_at(exc, str(path))}") \
            from exc
    found = getattr(module, function, None)
    if not callable(found):
        defined = sorted(n for n, v in vars(module).items() if callable(v) and getattr(v, "__module__", "") == name)
        listed = ", ".join(defined) if defined else "no functions"
        raise StudentCodeError(f"{path} has no function {SIGNATURES.get(function, function)} "
                               f"(it defines {listed})")
    return found


def _as_function(student: Callable[..., object] | str | Path, function: str) -> Callable[..., object]:
    return student if callable(student) else load_student(student, function)


def _exception_words(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _raised_at(exc: BaseException, filename: str | None) -> str:
    """' at student.py, line 7': the student's own line that raised, if one is in the traceback."""
    if filename is None:
        return ""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == Path(filename)]
    return f" at {Path(filename).name}, line {frames[-1].lineno}" if frames else ""


def _call(function: Callable[..., object], args: tuple, case_words: str) -> object:
    """The student's answer; what it raises becomes a StudentCodeError naming the case."""
    try:
        return function(*args)
    except Exception as exc:
        code = getattr(function, "__code__", None)
        where = _raised_at(exc, code.co_filename if code else None)
        raise StudentCodeError(f"{_name(function)} raised {_exception_words(exc)}{where}, on {case_words}") from exc


def _name(function: Callable[..., object]) -> str:
    return getattr(function, "__name__", "your function")


# ---- the report ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenDifference:
    """The token that shows a sampler difference, as both sides saw it."""

    token_id: int
    text: str
    raw_rank: int  # by raw logit, 1 = the most probable
    raw_prob: float  # softmax of the raw logits
    reference_prob: float  # in the engine's final distribution
    student_prob: float  # in the student's
    removed_by: str | None  # the engine's stage that removed it (its label), if it did


@dataclass(frozen=True)
class SamplerDifference:
    """The first sampler case where the student's distribution is not the engine's."""

    where: str  # the logits: prompt and greedy step
    settings: SamplerSettings
    problem: str  # what differs, in words
    token: TokenDifference | None  # None when the answer is not a distribution at all
    reference_kept: int
    student_kept: int | None
    stages: tuple[StageRecord, ...]  # the engine's, for this case
    hint: str | None
    logits: torch.Tensor = field(repr=False, compare=False)  # [vocab], to try the case again

    def lines(self) -> list[str]:
        lines = [f"call: final_distribution(logits, {_settings_words(self.settings)})",
                 f"logits: {self.where}", self.problem]
        if self.token is not None:
            lines.append(_token_words(self.token))
        if self.student_kept is not None:
            lines.append(f"tokens kept: the engine {self.reference_kept:,}, your code {self.student_kept:,}")
        lines.append("the engine's stages, in order:")
        lines += [f"  {_stage_words(stage)}" for stage in self.stages]
        if self.hint:
            lines.append(f"hint: {self.hint}")
        return lines


@dataclass(frozen=True)
class StopDifference:
    """The first stop case where the student's index is not the engine's."""

    what: str  # the kind of case, in words
    text: str  # the output text so far
    tokens: int  # generated tokens it holds
    stops: tuple[str, ...]
    answer: object  # the student's
    reference: int | None  # the engine's
    hint: str | None

    def lines(self) -> list[str]:
        stops = ", ".join(repr(s) for s in self.stops)
        lines = [f"case: {self.what}", f"call: find_stop(text, [{stops}])",
                 f"text after {self.tokens} tokens: {self.text!r}",
                 f"the engine: {self.reference!r}; your code: {self.answer!r}"]
        for whose, index in (("the engine's", self.reference), ("your", self.answer)):
            if index is not None and _is_index(index) and 0 <= index <= len(self.text):
                lines.append(f"around {whose} index: {_around(self.text, int(index))}")
        if self.hint:
            lines.append(f"hint: {self.hint}")
        return lines


@dataclass(frozen=True)
class CheckReport:
    """What a check found: the cases checked and the first difference (None: it passed)."""

    subject: str  # "sampler" or "stop"
    function: str  # the student's function's name
    cases: int  # cases checked, the differing one included
    total: int  # cases in the whole check
    difference: SamplerDifference | StopDifference | None
    passed_over: int = 0  # top-p cases where the answers differ but float rounding alone decides the cut

    @property
    def passed(self) -> bool:
        """The student's code agreed with the engine's on every case."""
        return self.difference is None

    def text(self) -> str:
        """The report in plain words."""
        what = "sampler" if self.subject == "sampler" else "stop-sequence rule"
        if self.difference is None:
            same = (f"the same tokens kept, every probability within {PROB_TOLERANCE:g} plus "
                    f"{PROB_RELATIVE:g} of its value"
                    if self.subject == "sampler" else "the same index or None")
            over = (f" Passed over: {self.passed_over:,} top-p case(s) where the answers differ only because float32 "
                    "rounding decides a cut deep in the tail." if self.passed_over else "")
            return f"{self.function} agrees with the engine's {what} on all {self.total:,} cases ({same}).{over}"
        head = (f"{self.function} differs from the engine's {what} at case {self.cases:,} of {self.total:,} "
                f"({self.cases - 1:,} agreed before it).")
        return "\n".join([head, *self.difference.lines()])

    def __str__(self) -> str:
        return self.text()


def _settings_words(settings: SamplerSettings) -> str:
    return (f"temperature={settings.temperature!r}, top_k={settings.top_k!r}, top_p={settings.top_p!r}, "
            f"min_p={settings.min_p!r}")


def _token_words(token: TokenDifference) -> str:
    def status(prob: float) -> str:
        return f"keeps it (probability {prob:.6f})" if prob > 0 else "drops it"

    engine = status(token.reference_prob)
    if token.removed_by is not None:
        engine = f"drops it (at {token.removed_by})"
    return (f"token {token.token_id} {token.text!r} (raw rank {token.raw_rank:,}, raw probability "
            f"{token.raw_prob:.6f}): the engine {engine}; your code {status(token.student_prob)}")


def _stage_words(stage: StageRecord) -> str:
    if not stage.active:
        return f"{stage.label:<26} {stage.note}"
    if stage.removed:
        return (f"{stage.label:<26} kept {stage.kept:,}, removed {stage.removed:,} "
                f"(they held {stage.removed_mass:.6f} of the probability)")
    return f"{stage.label:<26} kept {stage.kept:,}"


def _around(text: str, index: int, width: int = 16) -> str:
    """The text either side of `index`, a bar at the index, newlines and tabs escaped."""
    before, after = text[max(0, index - width):index], text[index:index + width]
    return f"{'…' if index > width else ''}{escape(before)}|{escape(after)}{'…' if index + width < len(text) else ''}"


# ---- the sampler's cases ---------------------------------------------------------------------


@dataclass(frozen=True)
class Logits:
    """One next-token decision's raw logits and where they come from."""

    where: str  # for people
    values: torch.Tensor  # [vocab], float32
    context_ids: torch.Tensor  # [context]


@dataclass(frozen=True)
class SamplerCase:
    logits: Logits
    settings: SamplerSettings

    @property
    def words(self) -> str:
        return f"{_settings_words(self.settings)} ({self.logits.where})"


def _settings(temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> SamplerSettings:
    return SamplerSettings(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)


def greedy_logits(lm: LoadedModel) -> list[Logits]:
    """The raw logits of each prompt's first greedy steps, read from the engine's own generation."""
    found = []
    for prompt, chat in PROMPTS:
        generation = Generation(lm, prompt, chat=chat, sampler=SamplerSettings(temperature=0),
                                stop=StopSettings(max_new_tokens=GREEDY_STEPS, ignore_eos=True))
        kind = "chat question" if chat else "prompt"
        try:
            for index in range(1, GREEDY_STEPS + 1):
                generation.step()
                context = generation.context_ids[:len(generation.prompt_ids) + index - 1]
                found.append(Logits(f"{kind} {prompt!r}, greedy step {index}", generation.raw_logits(index),
                                    torch.tensor(context)))
        finally:
            generation.close()
    return found


def tied_at(logits: Logits, rank: int, extra: int = 2) -> Logits:
    """The same logits with the `extra` tokens ranked after `rank` raised to its logit: a tie."""
    values = logits.values.clone()
    order = torch.sort(values, descending=True, stable=True).indices
    values[order[rank:rank + extra]] = float(values[order[rank - 1]])
    ranks = " and ".join(str(r) for r in range(rank + 1, rank + extra + 1))
    return Logits(f"{logits.where}, with the tokens ranked {ranks} set to the logit of rank {rank} (a tie)",
                  values, logits.context_ids)


def rounded(logits: Logits) -> Logits:
    """The same logits rounded to a quarter: ties everywhere."""
    return Logits(f"{logits.where}, rounded to a quarter (many ties)", torch.round(logits.values * 4) / 4,
                  logits.context_ids)


def top_p_boundaries(logits: Logits, temperature: float, counts: Sequence[int] = (1, 2)) -> list[SamplerSettings]:
    """top_p exactly at the float sum of the `n` most probable tokens' probabilities (after
    temperature, from the engine's distribution), and just below and above it."""
    probs = _engine_chain(logits.values, logits.context_ids, _settings(temperature)).final_probs
    descending = torch.sort(probs, descending=True).values
    sums = descending.cumsum(dim=0)
    found = []
    for n in counts:
        if float(descending[n]) > 2 * BOUNDARY_STEP and float(sums[n - 1]) + BOUNDARY_STEP < 1:
            at = float(sums[n - 1])
            found += [_settings(temperature, top_p=p) for p in (at - BOUNDARY_STEP, at, at + BOUNDARY_STEP)]
    return found


def sampler_cases(sources: Sequence[Logits]) -> list[SamplerCase]:
    """Every case, in groups from the simplest (temperature alone) to the combinations, so the
    first difference is found where the mistake shows most plainly."""
    first = sources[0]
    tie_at_top, tie_at_5, tie_at_50 = tied_at(first, 1), tied_at(first, 5), tied_at(first, 50)

    def each(*settings: SamplerSettings) -> list[SamplerCase]:
        return [SamplerCase(source, s) for s in settings for source in sources]

    return [
        *each(_settings(0), _settings(0.5), _settings(1), _settings(1.7)),
        SamplerCase(tie_at_top, _settings(0)),
        *each(_settings(1, top_k=1), _settings(1, top_k=5), _settings(1, top_k=50)),
        SamplerCase(tie_at_top, _settings(1, top_k=1)), SamplerCase(tie_at_5, _settings(1, top_k=5)),
        SamplerCase(tie_at_5, _settings(1.7, top_k=5)), SamplerCase(tie_at_50, _settings(1, top_k=50)),
        SamplerCase(tie_at_50, _settings(0.5, top_k=50)), SamplerCase(rounded(first), _settings(1, top_k=20)),
        *each(_settings(1, top_p=0.001), _settings(1, top_p=0.5), _settings(1, top_p=0.9), _settings(1, top_p=0.95)),
        *[SamplerCase(source, s) for source in sources for s in top_p_boundaries(source, 1.0)],
        *each(_settings(1, min_p=0.05), _settings(1, min_p=0.1), _settings(1, min_p=0.3)),
        SamplerCase(rounded(first), _settings(1, min_p=0.1)),
        # where the order matters: temperature comes before top-p and min-p
        *each(_settings(0.5, top_p=0.9), _settings(1.5, top_p=0.5), _settings(1.7, top_k=50, top_p=0.9),
              _settings(0.5, min_p=0.1), _settings(1.7, min_p=0.05), _settings(1.7, top_k=50)),
        *[SamplerCase(source, s) for source in sources for s in top_p_boundaries(source, 0.6, (1,))],
        *each(_settings(0.7, top_k=5, top_p=0.8), _settings(0.8, top_k=50, top_p=0.95, min_p=0.05),
              _settings(1.3, top_k=20, top_p=0.9, min_p=0.02), _settings(1, top_p=0.95, min_p=0.1),
              _settings(1.5, top_p=0.95, min_p=0.05)),
        # greedy whatever the filters say
        *each(_settings(0, top_k=5, top_p=0.9, min_p=0.1)),
        SamplerCase(tie_at_top, _settings(0, top_k=5, top_p=0.9)),
    ]


# ---- the engine's answers --------------------------------------------------------------------


@on_sampler_thread
def _engine_chain(logits: torch.Tensor, context_ids: torch.Tensor, settings: SamplerSettings) -> ChainOutput:
    # the sampler's own thread, where every sampler call of the engine runs (engine/cpu_threads.py)
    return run_chain(logits, context_ids, settings)


def _reference(case: SamplerCase, settings: SamplerSettings | None = None) -> ChainOutput:
    return _engine_chain(case.logits.values, case.logits.context_ids, settings or case.settings)


def _nudged(settings: SamplerSettings) -> Iterator[SamplerSettings]:
    """The settings a hair's breadth either side on each threshold (top-p, min-p) that is on."""
    top_ps = [settings.top_p]
    if 0 < settings.top_p < 1:
        top_ps += [max(0.0, settings.top_p - TOP_P_NUDGE), min(1.0, settings.top_p + TOP_P_NUDGE)]
    min_ps = [settings.min_p]
    if settings.min_p > 0:
        min_ps += [settings.min_p * (1 - MIN_P_NUDGE), min(1.0, settings.min_p * (1 + MIN_P_NUDGE))]
    for top_p, min_p in list(product(top_ps, min_ps))[1:]:
        yield replace(settings, top_p=top_p, min_p=min_p)


def decidable(case: SamplerCase) -> bool:
    """False where float32 rounding alone decides a top-p cut by more than one token: the cut
    falls so deep in the tail that tokens there hold less mass than the sum's rounding, and the
    engine's own answers a nudge either side of p differ by several tokens."""
    s = case.settings
    if s.greedy or not 0 < s.top_p < 1:
        return True
    kept = [int((_reference(case, replace(s, top_p=p)).final_probs > 0).sum())
            for p in (max(0.0, s.top_p - TOP_P_NUDGE), min(1.0, s.top_p + TOP_P_NUDGE))]
    return kept[1] - kept[0] <= 1


def _agrees(probs: torch.Tensor, reference: torch.Tensor) -> bool:
    """The same kept tokens, every probability within the tolerance."""
    reference = reference.double()
    return (bool(torch.equal(probs > 0, reference > 0))
            and bool(((probs - reference).abs() <= PROB_TOLERANCE + PROB_RELATIVE * reference).all()))


def _as_probs(answer: object, vocab: int) -> tuple[torch.Tensor | None, str | None]:
    """The student's answer as float64 probabilities `[vocab]`, or None and what is wrong with it."""
    try:
        probs = torch.as_tensor(answer).detach().to("cpu", torch.float64)
    except Exception:  # whatever the student returned
        return None, f"your code returned {type(answer).__name__}, not a tensor of probabilities"
    if probs.shape != (vocab,):
        return None, f"your code returned shape {tuple(probs.shape)}; the vocabulary needs ({vocab},)"
    if bool(probs.isnan().any()):
        return None, f"your code returned NaN for {int(probs.isnan().sum()):,} tokens"
    if bool((probs < 0).any()) or bool(probs.isinf().any()):
        return None, "your code returned negative or infinite probabilities"
    total = float(probs.sum())
    if abs(total - 1) > SUM_TOLERANCE:
        return None, f"your probabilities sum to {total:.6f}, not 1"
    return probs, None


# ---- what the difference is, and why ---------------------------------------------------------


def _raw_rank(values: torch.Tensor, token: int) -> int:
    return int((values > values[token]).sum()) + 1


FILTER_OFF = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}


def _removed_by(case: SamplerCase, reference: ChainOutput, token: int) -> str | None:
    """The engine's stage that removed `token`: the chain run with the later filters off, one
    filter more each time, until the token is gone."""
    if reference.final_probs[token] > 0 or case.settings.greedy:
        return None
    filters = [name for name in CHAINS[case.settings.chain] if name in FILTER_OFF]
    for i, name in enumerate(filters):
        partial = replace(case.settings, **{later: FILTER_OFF[later] for later in filters[i + 1:]})
        if _reference(case, partial).final_probs[token] == 0:
            return next(stage.label for stage in reference.stages if stage.name == name)
    return None


def _telling_token(probs: torch.Tensor, reference: torch.Tensor, raw: torch.Tensor) -> int:
    """The token that shows the difference best: of those kept by one side only, the most
    probable (raw); if both keep the same tokens, the one furthest beyond the tolerance."""
    disputed = (probs > 0) != (reference > 0)
    if bool(disputed.any()):
        return int(torch.where(disputed, raw, torch.full_like(raw, float("-inf"))).argmax())
    reference = reference.double()
    return int(((probs - reference).abs() - PROB_RELATIVE * reference).argmax())


def _token_difference(lm: LoadedModel, case: SamplerCase, probs: torch.Tensor, reference: ChainOutput,
                      token: int) -> TokenDifference:
    raw = case.logits.values
    return TokenDifference(token, lm.texts.piece(token).text, _raw_rank(raw, token), float(raw.softmax(dim=-1)[token]),
                           float(reference.final_probs[token]), float(probs[token]),
                           _removed_by(case, reference, token))


def _problem(token: TokenDifference) -> str:
    if (token.reference_prob > 0) != (token.student_prob > 0):
        return "the kept tokens differ:"
    return (f"the same tokens are kept, but token {token.token_id}'s probability differs by "
            f"{abs(token.reference_prob - token.student_prob):.2e} (the tolerance: {PROB_TOLERANCE:g} plus "
            f"{PROB_RELATIVE:g} of its value):")


@dataclass(frozen=True)
class Mistake:
    """A known mistake: when it can show, the distribution it gives (made with the engine's own
    stages), and the hint that names it."""

    shows: Callable[[SamplerSettings], bool]
    probs: Callable[[SamplerCase], torch.Tensor]
    hint: str


def _filters_on(s: SamplerSettings) -> bool:
    return s.top_k > 0 or s.top_p < 1 or s.min_p > 0


def _min_p_on_raw(case: SamplerCase) -> torch.Tensor:
    """min-p measured on the raw probabilities (before temperature), the other stages as the engine's."""
    rest = _reference(case, replace(case.settings, min_p=0.0)).final_logits
    raw_cut = torch.isneginf(keep_min_p(case.logits.values, case.settings.min_p))
    return rest.masked_fill(raw_cut, float("-inf")).softmax(dim=-1)


# the first that matches names the mistake: with min-p the only filter, min-p measured before
# temperature and temperature after the filters are the same distribution; the first says more
MISTAKES = (
    Mistake(lambda s: s.temperature != 1 and s.min_p > 0, _min_p_on_raw,
            "your min-p cut is the one measured on the probabilities before temperature; min-p compares each "
            "token with the top token's probability after temperature."),
    Mistake(lambda s: s.temperature != 1 and _filters_on(s),
            lambda c: _reference(c, replace(c.settings, chain="llama.cpp")).final_probs,
            "your distribution is the one you get by applying temperature after the filters (llama.cpp's "
            "order); here temperature comes first: divide the logits by T, then top-k, top-p and min-p "
            "work on the result."),
    Mistake(lambda s: s.min_p > 0 and (s.top_k > 0 or s.top_p < 1),
            lambda c: _reference(c, replace(c.settings, chain="vllm")).final_probs,
            "your distribution is the one you get with min-p before top-k and top-p (vLLM's order); here "
            "min-p comes last."),
    Mistake(lambda s: s.temperature != 1 and s.temperature >= 0.01,
            lambda c: _reference(c, replace(c.settings, temperature=1 / c.settings.temperature)).final_probs,
            "your distribution is the one you get by multiplying the logits by T; temperature divides them."),
    Mistake(lambda s: s.temperature != 1,
            lambda c: _reference(c, replace(c.settings, temperature=1.0)).final_probs,
            "your distribution is the one at temperature 1: the logits must be divided by T."),
)


def _greedy_hint(case: SamplerCase, probs: torch.Tensor | None, reference: ChainOutput) -> str:
    picked = reference.greedy_token
    one_hot = probs is not None and int((probs > 0).sum()) == 1
    if one_hot and case.logits.values[int(probs.argmax())] == case.logits.values[picked]:
        return (f"on a tie of the maximum the engine takes the first tied token (the lowest id, {picked}, as "
                "torch.argmax does).")
    return ("temperature 0 means greedy: probability 1 on the most probable token and 0 on every other "
            "(never divide by 0).")


def _count_hint(case: SamplerCase, probs: torch.Tensor, reference: ChainOutput) -> str | None:
    """Hints read from which tokens differ: top-k's ties, the top-p boundary."""
    settings, values = case.settings, case.logits.values
    student, engine = probs > 0, reference.final_probs > 0
    missing, extra = engine & ~student, student & ~engine
    if settings.top_k > 0 and bool(missing.any()):
        kth = torch.topk(values, min(settings.top_k, values.numel())).values[-1]
        if bool((values[missing] == kth).any()):
            kept = next(s.kept for s in reference.stages if s.name == "top_k")
            return (f"top-k keeps every token tied with the k-th logit: the engine's top-k {settings.top_k} kept "
                    f"{kept:,}; your code dropped a token tied with the k-th (torch.topk returns exactly k, "
                    "whatever the ties).")
    top_p = next(s for s in reference.stages if s.name == "top_p")
    if not (top_p.active and top_p.removed):
        return None
    final = reference.final_probs
    if int(missing.sum()) == 1 and not extra.any() and bool(final[missing] == final[engine].min()):
        return ("kept one token fewer than the engine at the top-p boundary: the token that crosses p is kept "
                "(keep a token while the mass before it is below p).")
    if int(extra.sum()) == 1 and not missing.any():
        return ("kept one token more than the engine at the top-p boundary: top-p keeps the smallest set of most "
                "probable tokens whose mass reaches p.")
    return None


def _sampler_hint(case: SamplerCase, probs: torch.Tensor | None, reference: ChainOutput) -> str | None:
    if case.settings.greedy:
        return _greedy_hint(case, probs, reference)
    if probs is None:
        return None
    for mistake in MISTAKES:
        if mistake.shows(case.settings) and _agrees(probs, mistake.probs(case)):
            return mistake.hint
    return _count_hint(case, probs, reference)


def _sampler_difference(lm: LoadedModel, case: SamplerCase, probs: torch.Tensor | None, problem: str | None,
                        reference: ChainOutput) -> SamplerDifference:
    token = None
    if probs is not None:
        telling = _telling_token(probs, reference.final_probs, case.logits.values)
        token = _token_difference(lm, case, probs, reference, telling)
        problem = _problem(token)
    return SamplerDifference(
        where=case.logits.where, settings=case.settings, problem=problem or "", token=token,
        reference_kept=int((reference.final_probs > 0).sum()),
        student_kept=None if probs is None else int((probs > 0).sum()), stages=reference.stages,
        hint=_sampler_hint(case, probs, reference), logits=case.logits.values.clone())


def _check_sampler_case(lm: LoadedModel, function: Callable[..., object], case: SamplerCase,
                        number: int, total: int) -> SamplerDifference | None:
    s = case.settings
    answer = _call(function, (case.logits.values.clone(), s.temperature, s.top_k, s.top_p, s.min_p),
                   f"case {number} of {total}: {case.words}")
    probs, problem = _as_probs(answer, case.logits.values.numel())
    reference = _reference(case)
    if probs is not None and (_agrees(probs, reference.final_probs)
                              or any(_agrees(probs, _reference(case, n).final_probs) for n in _nudged(s))):
        return None
    return _sampler_difference(lm, case, probs, problem, reference)


def check_sampler(student: Callable[..., object] | str | Path, lm: LoadedModel | None = None) -> CheckReport:
    """Run the student's `final_distribution(logits, temperature, top_k, top_p, min_p)` on the
    real model's logits over many settings, beside the engine's `run_chain` (transformers' order,
    no repetition penalty), and report the first case that differs.

    Args:
        student: the function, or the path of a Python file that defines `final_distribution`.
        lm: the model whose logits are used; the bundled one is loaded when None.

    Raises StudentCodeError when the file cannot be loaded, lacks the function, or it raises.
    """
    function = _as_function(student, "final_distribution")
    lm = lm or load_model()
    cases = sampler_cases(greedy_logits(lm))
    passed_over = 0
    for number, case in enumerate(cases, start=1):
        difference = _check_sampler_case(lm, function, case, number, len(cases))
        if difference is None:
            continue
        if difference.student_kept is not None and not decidable(case):  # asked only where answers differ
            passed_over += 1
            continue
        return CheckReport("sampler", _name(function), number, len(cases), difference, passed_over)
    return CheckReport("sampler", _name(function), len(cases), len(cases), None, passed_over)


# ---- stop sequences --------------------------------------------------------------------------


@dataclass(frozen=True)
class StopCase:
    what: str  # the kind of case, in words
    text: str  # the output text after `tokens` tokens
    tokens: int
    newest_from: int  # where the newest token's text begins
    stops: tuple[str, ...]


def greedy_texts(lm: LoadedModel) -> list[str]:
    """The output text after each token of a greedy generation, as the engine's loop checks it."""
    generation = Generation(lm, STOP_PROMPT, sampler=SamplerSettings(temperature=0),
                            stop=StopSettings(max_new_tokens=STOP_TOKENS, ignore_eos=True))
    try:
        return [generation.output_text for _ in generation.run()]
    finally:
        generation.close()


def _token_starts(texts: Sequence[str]) -> list[int]:
    """Where each token's text begins in the last text. The texts grow by appending, except where
    a character's bytes span tokens; then a start is approximate, which only a hint reads."""
    return [0, *(len(t) for t in texts[:-1])]


def _first_at(full: str, candidates: Iterator[tuple[str, int]]) -> str | None:
    """The first candidate stop sequence whose first occurrence is where it was cut from."""
    return next((s for s, at in candidates if s and full.find(s) == at), None)


def stop_lists(texts: Sequence[str]) -> list[tuple[str, tuple[str, ...]]]:
    """(what, stop sequences) cut from the real text: across tokens, inside one, at the start,
    several at once, repeated, absent, begun at the end only."""
    full, starts = texts[-1], _token_starts(texts)
    ends = [*starts[1:], len(full)]
    spans = list(zip(starts, ends, strict=True))[2:]  # later tokens: earlier texts hold no match
    across = _first_at(full, ((full[b - 2:b + 2], b - 2) for b, _ in spans if b >= 2 and b + 2 <= len(full)))
    inside = _first_at(full, ((full[a + 1:a + 3], a + 1) for a, b in spans if b - a >= 4))
    pairs = (full[i:i + 2] for i in range(len(full) - 1))
    repeated = next((pair for pair in pairs if pair.strip() and full.count(pair) > 1), None)
    found = [(f"a stop sequence across two tokens: {across!r}", (across,)),
             (f"a stop sequence inside one token: {inside!r}", (inside,)),
             ("a stop sequence at the very start", (full[:3],)),
             (f"a stop sequence that occurs twice: {repeated!r}", (repeated,)),
             ("a stop sequence begun at the end of the text but not finished", (full[-3:] + "§§",)),
             ("no stop sequence present", ("###", "<|im_end|>"))]
    present = sorted({s for _, stops in found[:4] for s in stops if s}, key=full.find, reverse=True)
    if len(present) >= 2:  # the one listed first starts later in the text
        found.append(("several at once: the earliest in the text wins, not the first listed", tuple(present[:3])))
        found.append(("several at once, one absent", ("###", present[0], present[-1])))
    # a text that ends inside a character (U+FFFD) is held back from matching (engine/stopping.py),
    # a rule the exercise does not ask for: no stop sequence with one in it
    return [(what, stops) for what, stops in found if all(stops) and not any(INCOMPLETE in s for s in stops)]


def stop_cases(texts: Sequence[str]) -> list[StopCase]:
    """Every stop list against the text after each token, as a generation grows it."""
    starts = _token_starts(texts)
    return [StopCase(what, text, n, starts[n - 1], stops)
            for what, stops in stop_lists(texts) for n, text in enumerate(texts, start=1)]


def _stop_hint(case: StopCase, answer: object, reference: int | None) -> str | None:
    states = stop_sequence_states(case.text, case.stops)
    match = first_match(states)
    if answer == -1 and reference is None:
        return "return None when no stop sequence is in the text (not -1, which is str.find's answer)."
    if match is None:
        if any(s.partial for s in states):
            return "a stop sequence that is only begun at the end of the text is not a match (yet)."
        return "no stop sequence is in the text: the answer is None."
    if answer == match.position + len(match.sequence):
        return "you returned where the stop sequence ends; return where it begins (the text before it is kept)."
    if answer is None and match.position < case.newest_from < match.position + len(match.sequence):
        return ("the match runs across tokens (it began in an earlier token): search the whole text, not only "
                "the newest token.")
    if answer is None:
        return "the stop sequence is in the text (perhaps from an earlier token): search the whole text."
    other = next((s for s in states if s.matched and s.position == answer and s is not match), None)
    if other is not None:
        return (f"you took {other.sequence!r}, listed first; the stop sequence that begins earliest in the text "
                f"({match.sequence!r}) wins, whatever the list's order.")
    if answer == case.text.rfind(match.sequence):
        return "the first occurrence counts, not the last."
    return None


def _is_index(answer: object) -> bool:
    """None or a whole number (numpy's included), never True or False."""
    return answer is None or (isinstance(answer, Integral) and not isinstance(answer, bool))


def check_stop(student: Callable[..., object] | str | Path, lm: LoadedModel | None = None) -> CheckReport:
    """Run the student's `find_stop(text, stop_sequences)` on a real greedy text as it grows
    token by token, beside the engine's `first_match`, and report the first case that differs.

    Args:
        student: the function, or the path of a Python file that defines `find_stop`.
        lm: the model that writes the text; the bundled one is loaded when None.

    Raises StudentCodeError when the file cannot be loaded, lacks the function, or it raises.
    """
    function = _as_function(student, "find_stop")
    cases = stop_cases(greedy_texts(lm or load_model()))
    for number, case in enumerate(cases, start=1):
        answer = _call(function, (case.text, list(case.stops)),
                       f"case {number} of {len(cases)}: text {case.text!r}, stop sequences {list(case.stops)!r}")
        match = first_match(stop_sequence_states(case.text, case.stops))
        reference = None if match is None else match.position
        if not _is_index(answer) or answer != reference:
            hint = _stop_hint(case, answer, reference) if _is_index(answer) else "return an int index or None."
            difference = StopDifference(case.what, case.text, case.tokens, case.stops, answer, reference, hint)
            return CheckReport("stop", _name(function), number, len(cases), difference)
    return CheckReport("stop", _name(function), len(cases), len(cases), None)
