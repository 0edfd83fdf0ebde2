"""The Breaking the chain page's controller without Streamlit: a plain dict as the visitor's
state and a tiny random model (tests/tiny.py), so these run in the fast suite. (The page on the
real model: tests/ui/test_breaking_the_chain.py.)"""

from __future__ import annotations

import time
from typing import Any

import pytest

from engine import DraftModel, LoadedModel, PromptLookup, SettingsError
from ui.controllers import breaking_the_chain as bc
from ui.server.deployment import current_deployment
from ui.session.keys import CHAIN
from ui.session.run_clock import RUN_FRAME_S

PROMPT = "abc abc abc abc"


def lookup(lm: LoadedModel, method: str):
    if method != bc.PROMPT_LOOKUP:
        raise SettingsError("draft model", method, "prompt lookup (this test has no other)")
    return PromptLookup(lm.eos_ids)


@pytest.fixture()
def state(tiny_lm: LoadedModel) -> dict[str, Any]:
    """A visitor's first run: the widgets' defaults, a prompt, and the lanes they make."""
    state: dict[str, Any] = {}
    bc.init_defaults(state)
    state.update({CHAIN.prompt: PROMPT, CHAIN.chat: False, CHAIN.max_new_tokens: 8})
    bc.sync(state, tiny_lm, lookup)
    return state


def lanes(state: dict[str, Any]) -> bc.Lanes:
    pair = bc.current_lanes(state)
    assert pair is not None
    return pair


def test_step_takes_one_round_and_the_plain_lane_catches_up(state) -> None:
    bc.step(state, lookup)
    bc.step(state, lookup)
    pair = lanes(state)
    assert len(pair.speculative.rounds) == 2
    assert len(pair.plain.steps) == len(pair.speculative.generated_ids) >= 2
    assert pair.identical


def test_a_prompt_typed_and_stepped_in_one_click_takes_its_round(state) -> None:
    """As on the Step page: the click that takes the focus from the prompt field must step the
    new prompt's lanes, not the old ones the page would then replace with empty lanes."""
    bc.step(state, lookup)
    state[CHAIN.prompt] = "xyz xyz xyz"
    bc.step(state, lookup)
    pair = lanes(state)
    assert pair.speculative.prompt == "xyz xyz xyz" and len(pair.speculative.rounds) == 1 and pair.identical


def test_while_the_prompt_is_empty_step_and_run_do_nothing_and_say_why(state, tiny_lm) -> None:
    bc.step(state, lookup)
    old = lanes(state)
    state[CHAIN.prompt] = "  "
    bc.start_run(state, lookup)
    assert not bc.is_running(state)
    bc.step(state, lookup)
    assert lanes(state) is old and len(old.speculative.rounds) == 1
    assert bc.message(state, "buttons").startswith("Fix the prompt and settings above first: The prompt is empty")


def test_a_run_goes_round_by_round_and_ends_when_the_lanes_finish(state) -> None:
    bc.start_run(state, lookup)
    rounds = 0
    while bc.is_running(state):
        bc.advance_run(state, now=time.monotonic())
        rounds += 1
        assert rounds <= 8
    pair = lanes(state)
    assert pair.speculative.finished and rounds == len(pair.speculative.rounds)
    assert pair.speculative.generated_ids == pair.plain.generated_ids and len(pair.plain.steps) == 8
    bc.step(state, lookup)
    assert "finished" in bc.message(state, "buttons")


def test_a_run_keeps_each_round_on_screen_for_a_frame(state) -> None:
    bc.start_run(state, lookup)
    bc.advance_run(state, now=100.0)
    assert bc.run_frame_wait(state, now=100.1) == pytest.approx(RUN_FRAME_S - 0.1)
    assert bc.run_frame_wait(state, now=101.0) == 0.0


def test_reset_starts_both_lanes_over_and_stops_a_run(state, tiny_lm) -> None:
    bc.step(state, lookup)
    before = lanes(state)
    bc.start_run(state, lookup)
    bc.reset(state, tiny_lm, lookup)
    assert lanes(state) is not before and lanes(state).speculative.rounds == () and not bc.is_running(state)


def test_choosing_a_preset_fills_the_widgets(state) -> None:
    preset = bc.PRESETS[-1]
    state[CHAIN.preset] = preset.name
    bc.choose_preset(state)
    assert (state[CHAIN.prompt], state[CHAIN.chat], state[CHAIN.temperature]) == (preset.prompt, preset.chat, 0.7)


def test_the_self_draft_methods_draft_with_the_shared_copy_and_lookup_needs_none(tiny_lm) -> None:
    copies: list[str] = []

    def self_copy(lm: LoadedModel, kind: str) -> LoadedModel:
        copies.append(kind)
        return lm

    assert isinstance(bc.draft_method(tiny_lm, bc.PROMPT_LOOKUP, self_copy), PromptLookup) and copies == []
    draft = bc.draft_method(tiny_lm, bc.SELF_INT8, self_copy)
    assert isinstance(draft, DraftModel) and draft.name == "self-draft-int8" and copies == ["int8"]


class Upload:
    """An uploaded file that must not be read."""

    name = "big.json"

    def __init__(self, size: int) -> None:
        self.size = size

    def getvalue(self) -> bytes:
        raise AssertionError("a file refused by its size was read")


def test_a_trace_too_large_for_the_server_is_refused_before_it_is_read(state, tiny_lm) -> None:
    kept = lanes(state)
    bc.upload_trace(state, tiny_lm, lookup, Upload(current_deployment().limits.max_upload_bytes + 1))
    assert bc.message(state, "trace_error").startswith("big.json: The file is")
    assert lanes(state) is kept
    bc.upload_trace(state, tiny_lm, lookup, None)  # the uploader emptied: nothing happens
    assert lanes(state) is kept


def test_lanes_the_server_put_away_while_idle_are_rebuilt_on_the_next_step(state, idle_server) -> None:
    bc.step(state, lookup)
    bc.step(state, lookup)
    before = lanes(state)
    tokens = before.speculative.generated_ids
    assert idle_server.away(59) == 0
    assert idle_server.away(2) == 2  # both lanes were registered with the server's releaser
    assert before.speculative.closed and before.plain.closed
    bc.step(state, lookup)
    after = lanes(state)
    assert after is not before and not after.speculative.closed and not after.plain.closed
    assert after.speculative.generated_ids[:len(tokens)] == tokens and len(after.speculative.rounds) == 3
    assert after.identical
    assert bc.message(state, "idle").startswith("Welcome back. Your two lanes were put away after")
    assert bc.message(state, "idle").endswith("have been rebuilt exactly from their 2 rounds.")
    assert idle_server.away(61) == 2  # the rebuilt lanes are registered too


def test_a_method_switch_is_a_note_and_a_method_that_cannot_be_built_a_problem(state, tiny_lm) -> None:
    bc.step(state, lookup)
    state[CHAIN.method] = bc.PROMPT_LOOKUP
    bc.choose_method(state, tiny_lm, lookup)
    switched = bc.notice(state, "method")
    assert switched.level == "info" and switched.text.startswith("From round 2 on")
    state[CHAIN.method] = bc.LOOKAHEAD  # `lookup` builds prompt lookup only
    bc.choose_method(state, tiny_lm, lookup)
    refused = bc.notice(state, "method")
    assert refused.level == "error" and refused.text.startswith(f"{bc.LOOKAHEAD}: ")


def test_the_lanes_story_and_costs_are_made_for_the_page_to_lay_out(state) -> None:
    assert bc.story(lanes(state)) is None  # before the first round
    for _ in range(3):
        bc.step(state, lookup)
    story, costs = bc.story(lanes(state)), bc.costs(lanes(state))
    assert story.heading.startswith("### Round 3") and story.kv.startswith("**4 · KV cache**")
    assert costs.why.startswith("A decode step at batch 1") and "Time per token so far" in costs.time_per_token
    assert bc.measured_note(state) is None
