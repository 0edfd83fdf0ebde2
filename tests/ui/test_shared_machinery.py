"""The pieces every page that runs shares: one Run clock, messages that carry their level, and
one presets loader reading every page's presets from assets/ in one format."""

from __future__ import annotations

import pytest

from engine import FINISH_REASONS, SamplerSettings, StopSettings
from ui.session import run_clock
from ui.session.presets import CHAIN_PRESETS_FILE, LAB_PRESETS_FILE, LESSON_PRESETS_FILE, PRESETS_FILE, load_presets
from ui.session.run_clock import RunClock
from ui.session.settings import Message, message, notice, set_message


def test_a_run_clock_keeps_each_step_on_screen_for_a_frame_under_its_own_keys() -> None:
    clock, state = RunClock("running", "started"), {}
    assert not clock.is_running(state) and clock.frame_wait(state, now=5.0) == run_clock.RUN_FRAME_S
    clock.start(state)
    clock.frame_begins(state, now=100.0)
    assert clock.is_running(state) and state == {"running": True, "started": 100.0}
    assert clock.frame_wait(state, now=100.1) == pytest.approx(run_clock.RUN_FRAME_S - 0.1)
    assert clock.frame_wait(state, now=101.0) == 0.0
    clock.stop(state)
    assert not clock.is_running(state)


def test_a_message_keeps_its_level_and_its_text_reads_as_before() -> None:
    state: dict = {}
    set_message(state, "method", "From round 3 on, the guesses come from lookahead.", "store", level="info")
    set_message(state, "setup", "The prompt is empty.", "store")
    assert notice(state, "method", "store") == Message("From round 3 on, the guesses come from lookahead.", "info")
    assert notice(state, "setup", "store").level == "error"  # a problem unless told otherwise
    assert message(state, "setup", "store") == "The prompt is empty."
    set_message(state, "method", None, "store")
    assert notice(state, "method", "store") is None and message(state, "method", "store") is None


def test_a_message_level_must_be_one_a_page_can_show() -> None:
    with pytest.raises(ValueError, match="level 'loud'"):
        set_message({}, "setup", "text", "store", level="loud")


def test_both_pages_presets_load_from_assets_in_one_format() -> None:
    step, chain = load_presets(PRESETS_FILE), load_presets(CHAIN_PRESETS_FILE)
    assert PRESETS_FILE.parent == CHAIN_PRESETS_FILE.parent and PRESETS_FILE.parent.name == "assets"
    assert step[0].name == "The capital of France is" and step[0].stop.max_new_tokens == 12
    assert [p.name for p in chain] == ["Asked to fix the spelling, it copies", "Repeat a sentence (copying)",
                                       "Code: edit a given function", "Free-form story (lookup rarely helps)",
                                       "Sampled copying (temperature 0.7)"]
    assert all(isinstance(p.sampler, SamplerSettings) and isinstance(p.stop, StopSettings) for p in (*step, *chain))
    assert [p.sampler.temperature for p in chain] == [0.0, 0.0, 0.0, 0.0, 0.7]
    assert {p.stop.max_new_tokens for p in chain} == {48} and chain[2].prompt.endswith("    return total")


def test_the_lesson_and_the_lab_read_their_presets_from_assets_too(tmp_path) -> None:
    lesson, lab = load_presets(LESSON_PRESETS_FILE), load_presets(LAB_PRESETS_FILE)
    assert [p.fires for p in lesson] == ["eos", "stop_sequence", "max_tokens", "max_tokens"]
    assert lesson[1].stop.stop_sequences == ("10",) and lesson[3].stop.ignore_eos
    assert all(p.sampler.greedy for p in lesson) and all(p.fires in FINISH_REASONS for p in lesson)
    assert [p.chat for p in lab] == [False, False, True, False] and all(p.fires is None for p in lab)
    wrong = tmp_path / "wrong.json"
    wrong.write_text('[{"name": "x", "about": "", "prompt": "Hi", "chat": false, "fires": "tired"}]')
    with pytest.raises(ValueError, match="fires 'tired'; the finish reasons are"):
        load_presets(wrong)
