"""The race (engine/speculative/race.py): plain decoding, then each draft method on the same
prompt, every row checked against plain decoding's tokens, each row reported as it comes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine import SettingsError
from engine.speculative import (
    EarlyExit,
    Entrant,
    Lookahead,
    PromptLookup,
    RaceRow,
    last_race_times,
    run_race,
    start_race,
)
from engine.speculative.race import PLAIN, PLAIN_LABEL, by_position

COPYING = "Repeat after me: the cat sat on the mat. the cat sat on the mat."


def refused() -> PromptLookup:
    raise SettingsError("draft method", "nowhere", "a method this model can use")


def entrants(lm) -> list[Entrant]:
    return [Entrant("lookup", lambda: PromptLookup(lm.eos_ids), k=4), Entrant("refused", refused),
            Entrant("lookahead", lambda: Lookahead(lm.eos_ids), k=3), Entrant("exit", lambda: EarlyExit(lm, 1), k=2)]


def test_every_method_gives_plain_decodings_tokens_and_a_refused_one_is_skipped_by_name(tiny_lm) -> None:
    result = run_race(tiny_lm, COPYING, False, entrants(tiny_lm), tokens=12)
    plain = result.plain
    assert plain.method == PLAIN and plain.k is None and plain.acceptance is None and plain.by_position == ()
    assert plain.tokens == plain.passes == len(plain.ids) == 12
    assert [row.label for row in result.rows] == ["lookup", "lookahead", "exit"]
    assert [row.k for row in result.rows] == [4, 3, 2]
    assert [row.method for row in result.rows] == ["prompt-lookup", "lookahead", "early-exit-1"]
    assert all(row.ids == plain.ids and row.same_text for row in result.rows)
    assert [(s.label, "nowhere" in s.reason) for s in result.skipped] == [("refused", True)]
    assert result.all_rows == (plain, *result.rows)


def test_a_row_counts_its_passes_guesses_and_times_as_the_generation_did(tiny_lm) -> None:
    row = run_race(tiny_lm, COPYING, False, entrants(tiny_lm)[:1], tokens=12).rows[0]
    assert 1 <= row.passes <= row.tokens == 12 and 0 <= row.accepted <= row.checked
    assert row.tokens_per_pass == row.tokens / row.passes
    assert row.acceptance == (row.accepted / row.checked if row.checked else None)
    assert 0 < row.decode_seconds < row.seconds and row.decode_tokens < row.tokens
    assert row.ms_per_token == pytest.approx(row.decode_seconds * 1e3 / max(1, row.decode_tokens))
    assert len(row.by_position) <= row.k and all(0 <= share <= 1 for share in row.by_position)


def test_progress_reports_plain_decoding_then_each_entrant_in_order(tiny_lm) -> None:
    seen: list[tuple[int, int, RaceRow | None]] = []
    result = run_race(tiny_lm, COPYING, False, entrants(tiny_lm), tokens=6,
                      progress=lambda done, total, row: seen.append((done, total, row)))
    assert [(done, total) for done, total, _ in seen] == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)]
    assert [row for _, _, row in seen] == [result.plain, result.rows[0], None, *result.rows[1:]]


def test_kept_by_position_counts_only_the_rounds_that_reached_each_position() -> None:
    rounds = [SimpleNamespace(checks=(1, 2, 3), accepted=3), SimpleNamespace(checks=(1, 2), accepted=1),
              SimpleNamespace(checks=(), accepted=0), SimpleNamespace(checks=(1,), accepted=0)]
    # position 1: reached 3 times, kept twice; 2: reached twice, kept once; 3: reached once, kept
    assert by_position(rounds, 4) == (2 / 3, 1 / 2, 1.0)


def test_on_the_real_model_prompt_lookup_needs_fewer_passes_than_tokens_for_a_copy(lm) -> None:
    result = run_race(lm, "Repeat the following text exactly: Autoregressive models write one token at a time.",
                      True, [Entrant("lookup", lambda: PromptLookup(lm.eos_ids), k=4)], tokens=16)
    row = result.rows[0]
    assert row.same_text and row.tokens == result.plain.tokens
    assert row.passes < row.tokens and row.acceptance is not None and row.acceptance > 0.5


def test_a_race_on_its_own_thread_names_each_run_as_it_starts_and_the_server_remembers_its_times(tiny_lm) -> None:
    started: list[str] = []
    slow_lookup = Entrant("lookup", lambda: started.append("built") or PromptLookup(tiny_lm.eos_ids), k=4)
    job = start_race(tiny_lm, COPYING, False, [slow_lookup, Entrant("refused", refused)], tokens=6)
    assert job.labels == (PLAIN_LABEL, "lookup", "refused")
    assert job.wait(60) and job.error is None and job.running is None and not job.waiting
    result = job.result
    assert job.rows == (result.plain, *result.rows) and [row.label for row in result.rows] == ["lookup"]
    times = last_race_times(tiny_lm.name, 6)
    assert [label for label, _ in times] == [PLAIN_LABEL, "lookup"]  # the refused one never ran
    assert [seconds for _, seconds in times] == [row.seconds for row in job.rows]
    assert last_race_times(tiny_lm.name, 7) == ()


def test_run_race_tells_each_run_before_it_starts(tiny_lm) -> None:
    seen: list[str] = []
    run_race(tiny_lm, COPYING, False, entrants(tiny_lm)[:2], tokens=4, starting=seen.append)
    assert seen == [PLAIN_LABEL, "lookup", "refused"]


def test_a_race_that_fails_says_why_and_ends(tiny_lm) -> None:
    def broken() -> PromptLookup:
        raise RuntimeError("the draft broke")

    job = start_race(tiny_lm, COPYING, False, [Entrant("broken", broken)], tokens=4)
    assert job.wait(60) and job.result is None and job.error == "The race stopped: the draft broke"
