"""The race: plain greedy decoding, then each draft method, on one prompt, measured alone.

The Breaking the chain page races every method on the visitor's prompt, and
bench/speculative_bench.py races them over several prompts and draft lengths; both call `run_race`.
Every run is greedy with the same stop settings, so every method must give plain decoding's
tokens exactly: each row says whether it did. The runs go one after another (a race measures
each alone), and each is timed twice: the whole run, and the run after its first pass (the
first pass reads the prompt too, so it is not a decode step).

`start_race` runs a race on a thread of its own, for a page that stays usable while it runs and
shows each row as it comes: a `RaceJob` is read while it runs. Races on one server take turns
(each would slow the other's measurement), and the server remembers each finished race's times
per model and length, so the next visitor is told what a race costs before starting one.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from engine.errors import ModelLoadError, SettingsError
from engine.generation import Generation
from engine.loading import LoadedModel
from engine.settings import SamplerSettings, StopSettings
from engine.shell import GenerationShell
from engine.speculative.drafting import DraftMethod
from engine.speculative.generation import RoundRecord, SpeculativeGeneration

GREEDY = SamplerSettings(temperature=0.0)
PLAIN = "plain"  # the plain run's method name
PLAIN_LABEL = "plain decoding (one token per pass)"
G = TypeVar("G", bound=GenerationShell)


@dataclass(frozen=True)
class Entrant:
    """One speculative run to race: a label to show, a fresh draft method per run (a draft
    keeps state between rounds: lookahead's pool, a draft model's cache), and k."""

    label: str
    make_draft: Callable[[], DraftMethod]  # raises ModelLoadError / SettingsError when it cannot be built
    k: int = 4


@dataclass(frozen=True)
class RaceRow:
    """One run of the race prompt, measured here."""

    method: str  # the draft's own name ("plain" for plain decoding)
    label: str
    k: int | None  # None for plain decoding
    tokens: int
    passes: int  # forward passes of the target
    checked: int  # guesses checked
    accepted: int  # guesses kept
    seconds: float  # the whole run, its first pass (the prompt's) included
    decode_seconds: float  # the run after its first pass
    decode_tokens: int  # tokens made after the first pass
    overhead_ms: float  # median per pass of everything but the forward passes (sampler, checks, records)
    by_position: tuple[float, ...]  # per guessed position: kept / reached
    ids: tuple[int, ...]
    same_text: bool  # the tokens equal plain decoding's

    @property
    def ms_per_token(self) -> float:
        """Wall time per token after the prompt's pass."""
        return self.decode_seconds * 1e3 / max(1, self.decode_tokens)

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / self.passes if self.passes else 0.0

    @property
    def acceptance(self) -> float | None:
        """Guesses kept / guesses checked (None for plain decoding, or when nothing was guessed)."""
        return self.accepted / self.checked if self.checked else None


@dataclass(frozen=True)
class Skipped:
    """An entrant whose draft could not be built here (e.g. trained heads on another model)."""

    label: str
    reason: str


@dataclass(frozen=True)
class RaceResult:
    plain: RaceRow
    rows: tuple[RaceRow, ...]  # one per entrant that ran, in order
    skipped: tuple[Skipped, ...] = ()

    @property
    def all_rows(self) -> tuple[RaceRow, ...]:
        """Plain decoding's row, then the entrants'."""
        return (self.plain, *self.rows)


# Called after plain decoding (done 0) and after each entrant (its row, or None when it was
# skipped), so a page can show each row as it comes.
Progress = Callable[[int, int, RaceRow | None], None]


def run_race(lm: LoadedModel, prompt: str, chat: bool, entrants: Sequence[Entrant], tokens: int,
             progress: Progress | None = None, starting: Callable[[str], None] | None = None) -> RaceResult:
    """Plain greedy decoding of `tokens` new tokens, then each entrant on the same prompt and
    settings, one after another; `starting(label)` is told before each run begins."""
    stop = StopSettings(max_new_tokens=tokens)
    if starting is not None:
        starting(PLAIN_LABEL)
    plain = _timed(Generation(lm, prompt, chat=chat, sampler=GREEDY, stop=stop))
    plain_row = _plain_row(*plain)
    if progress is not None:
        progress(0, len(entrants), plain_row)
    rows, skipped = [], []
    for done, entrant in enumerate(entrants, start=1):
        if starting is not None:
            starting(entrant.label)
        try:
            draft = entrant.make_draft()
        except (ModelLoadError, SettingsError) as exc:
            skipped.append(Skipped(entrant.label, str(exc)))
            row = None
        else:
            spec = SpeculativeGeneration(lm, prompt, chat=chat, draft=draft, k=entrant.k, sampler=GREEDY, stop=stop)
            row = _speculative_row(entrant, *_timed(spec), plain_row.ids)
            rows.append(row)
        if progress is not None:
            progress(done, len(entrants), row)
    return RaceResult(plain_row, tuple(rows), tuple(skipped))


# ---- a race on a thread of its own -----------------------------------------------------------

_ONE_RACE_AT_A_TIME = threading.Lock()  # two races at once would each slow the other's measurement
_LAST_TIMES: dict[tuple[str, int], tuple[tuple[str, float], ...]] = {}  # (model, tokens) -> (label, s) per run
_LAST_LOCK = threading.Lock()


class RaceJob:
    """A race running on its own thread: what it has measured so far, what runs now, and its
    end (the result, or the error that stopped it). Read from any thread."""

    def __init__(self, lm: LoadedModel, prompt: str, chat: bool, entrants: Sequence[Entrant], tokens: int) -> None:
        self.labels = (PLAIN_LABEL, *(entrant.label for entrant in entrants))
        self.tokens = tokens
        self._key = (lm.name, tokens)
        self._lock = threading.Lock()
        self._rows: list[RaceRow] = []
        self._running: str | None = None
        self._waiting = True
        self._result: RaceResult | None = None
        self._error: str | None = None
        self._started = time.perf_counter()
        self._thread = threading.Thread(target=self._run, args=(lm, prompt, chat, tuple(entrants)),
                                        name="race", daemon=True)
        self._thread.start()

    @property
    def rows(self) -> tuple[RaceRow, ...]:
        with self._lock:
            return tuple(self._rows)

    @property
    def running(self) -> str | None:
        """The label of the run under way (None before the first and after the last)."""
        with self._lock:
            return self._running

    @property
    def waiting(self) -> bool:
        """Whether it waits for another race on this server to finish."""
        with self._lock:
            return self._waiting

    @property
    def done(self) -> bool:
        with self._lock:
            return self._result is not None or self._error is not None

    @property
    def result(self) -> RaceResult | None:
        with self._lock:
            return self._result

    @property
    def error(self) -> str | None:
        with self._lock:
            return self._error

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self._started

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the end; whether it came."""
        self._thread.join(timeout)
        return self.done

    def _run(self, lm: LoadedModel, prompt: str, chat: bool, entrants: tuple[Entrant, ...]) -> None:
        times: list[tuple[str, float]] = []

        def starting(label: str) -> None:
            with self._lock:
                self._running = label

        def progress(done: int, total: int, row: RaceRow | None) -> None:
            with self._lock:
                if row is not None:
                    self._rows.append(row)
                    times.append((row.label, row.seconds))

        try:
            with _ONE_RACE_AT_A_TIME:
                with self._lock:
                    self._waiting = False
                result = run_race(lm, prompt, chat, entrants, self.tokens, progress, starting)
        except Exception as exc:  # any: the page says why (a thread that dies leaves no word)
            with self._lock:
                self._error, self._running, self._waiting = f"The race stopped: {exc}", None, False
            return
        with _LAST_LOCK:
            _LAST_TIMES[self._key] = tuple(times)
        with self._lock:
            self._result, self._running = result, None


def start_race(lm: LoadedModel, prompt: str, chat: bool, entrants: Sequence[Entrant], tokens: int) -> RaceJob:
    """`run_race` on a thread of its own (after any other race on this server has finished)."""
    return RaceJob(lm, prompt, chat, entrants, tokens)


def last_race_times(model: str, tokens: int) -> tuple[tuple[str, float], ...]:
    """Each run's seconds in the last race this server finished for `model` at `tokens` new
    tokens, in order (empty before the first)."""
    with _LAST_LOCK:
        return _LAST_TIMES.get((model, tokens), ())


@dataclass(frozen=True)
class _Times:
    seconds: float
    decode_seconds: float
    decode_tokens: int


def _timed(generation: G) -> tuple[G, _Times]:
    """Run `generation` to its end, timing the whole run and the run after its first pass; the
    generation is closed (its records stay readable)."""
    started = time.perf_counter()
    generation.step()
    after_first = time.perf_counter()
    first_tokens = len(generation.generated_ids)
    for _ in generation.run():
        pass
    ended = time.perf_counter()
    generation.close()
    return generation, _Times(ended - started, ended - after_first, len(generation.generated_ids) - first_tokens)


def _plain_row(generation: Generation, times: _Times) -> RaceRow:
    steps = generation.steps
    ids = tuple(generation.generated_ids)
    overhead = statistics.median(s.timing.step_ms - s.timing.forward_ms for s in steps)
    return RaceRow(PLAIN, PLAIN_LABEL, None, len(ids), len(steps), 0, 0, times.seconds, times.decode_seconds,
                   times.decode_tokens, overhead, (), ids, True)


def _speculative_row(entrant: Entrant, spec: SpeculativeGeneration, times: _Times, expected: tuple[int, ...]
                     ) -> RaceRow:
    rounds = spec.rounds
    ids = tuple(spec.generated_ids)
    overhead = statistics.median(r.timing.round_ms - r.timing.verify_ms - r.timing.draft_ms for r in rounds)
    return RaceRow(spec.draft.name, entrant.label, entrant.k, len(ids), len(rounds), sum(len(r.checks) for r in rounds),
                   sum(r.accepted for r in rounds), times.seconds, times.decode_seconds, times.decode_tokens, overhead,
                   by_position(rounds, entrant.k), ids, ids == expected)


def by_position(rounds: Sequence[RoundRecord], k: int) -> tuple[float, ...]:
    """Per guessed position 1..k: the share of the rounds that reached it whose guess there was kept."""
    reached, kept = [0] * k, [0] * k
    for record in rounds:
        for index in range(min(k, len(record.checks))):
            reached[index] += 1
            kept[index] += index < record.accepted
    return tuple(kept[i] / reached[i] for i in range(k) if reached[i])
