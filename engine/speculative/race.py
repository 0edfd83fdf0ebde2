"""The race: plain greedy decoding, then each draft method, on one prompt, measured alone.

The Breaking the chain page races every method on the visitor's prompt, and
bench/speculative_bench.py races them over several prompts and draft lengths; both call `run_race`.
Every run is greedy with the same stop settings, so every method must give plain decoding's
tokens exactly: each row says whether it did. The runs go one after another on the caller's
thread (a race measures each alone), and each is timed twice: the whole run, and the run after
its first pass (the first pass reads the prompt too, so it is not a decode step).
"""

from __future__ import annotations

import statistics
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
         progress: Progress | None = None) -> RaceResult:
    """Plain greedy decoding of `tokens` new tokens, then each entrant on the same prompt and
    settings, one after another."""
    stop = StopSettings(max_new_tokens=tokens)
    plain = _timed(Generation(lm, prompt, chat=chat, sampler=GREEDY, stop=stop))
    plain_row = _plain_row(*plain)
    if progress is not None:
        progress(0, len(entrants), plain_row)
    rows, skipped = [], []
    for done, entrant in enumerate(entrants, start=1):
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
