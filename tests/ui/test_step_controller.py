"""The Step page's controller without Streamlit: a plain dict as the visitor's state and a
tiny random model (tests/tiny.py), so these run in the fast suite."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from engine import Generation, LoadedModel, SamplerSettings, generation_recording, to_trace
from engine.serving import ForwardScheduler
from tests.passes import counted_passes
from ui.controllers import step_through as control
from ui.session import idle_rebuild
from ui.session.keys import STEP
from ui.session.memo import recall
from ui.session.run_clock import RUN_FRAME_S
from ui.session.settings import DEFAULT_SEED, init_defaults, message, step_generation

PROMPT = "Hello there"


@pytest.fixture()
def state(tiny_lm: LoadedModel) -> dict[str, Any]:
    """A visitor's first run: the widgets' defaults, a prompt, and the generation they make."""
    state: dict[str, Any] = {}
    init_defaults(state)
    state[STEP.prompt] = PROMPT
    control.sync_generation(state, tiny_lm)
    return state


def generation(state: dict[str, Any]) -> Generation:
    gen = step_generation(state)
    assert gen is not None
    return gen


def test_the_first_run_makes_a_generation_from_the_widgets(state, tiny_lm) -> None:
    gen = generation(state)
    assert (gen.prompt, gen.chat, gen.seed, gen.steps) == (PROMPT, False, DEFAULT_SEED, ())
    assert gen.lm is tiny_lm and gen.sampler == SamplerSettings(temperature=0.0)


def test_step_back_and_reset_change_the_generation(state) -> None:
    control.step(state)
    control.step(state)
    first = generation(state)
    assert len(first.steps) == 2
    control.back(state)
    assert generation(state) is first and len(first.steps) == 1
    control.reset(state)
    assert generation(state) is not first and generation(state).steps == ()


def test_a_step_after_the_finish_becomes_the_message_beside_the_buttons(state) -> None:
    state[STEP.max_new_tokens] = 1
    control.sync_generation(state, generation(state).lm)
    control.step(state)
    control.step(state)
    assert len(generation(state).steps) == 1
    assert "Generation has finished (max_tokens)" in message(state, "buttons")
    control.back(state)
    assert message(state, "buttons") is None


def test_branch_forces_another_candidate_in_place_of_the_latest_pick(state) -> None:
    control.step(state)
    control.step(state)
    gen = generation(state)
    first, alternative = gen.steps[0], gen.steps[1].distribution.top[3]
    control.branch(state, alternative.token_id)
    assert len(gen.steps) == 2 and gen.steps[0] is first
    assert gen.steps[1].token_id == alternative.token_id and gen.steps[1].decision.forced


def test_repick_takes_the_latest_step_again_under_the_controls_settings(state) -> None:
    control.step(state)
    gen = generation(state)
    state[STEP.temperature] = 1.5
    view = control.sampler_view(state, gen)
    assert view.changed and gen.sampler.temperature == 1.5
    control.repick(state)
    assert len(gen.steps) == 1
    assert gen.steps[0].token_id == view.decision.token_id
    assert gen.steps[0].decision.settings.temperature == 1.5


def test_the_sampler_view_resamples_without_a_forward_pass_and_remembers_it(state) -> None:
    control.step(state)
    gen = generation(state)
    with counted_passes(gen.lm) as calls:
        state[STEP.temperature] = 1.2
        view = control.sampler_view(state, gen)
        again = control.sampler_view(state, gen)
    assert calls == [] and view.changed
    assert view.decision == gen.resample(gen.sampler).decision
    assert again.decision is view.decision  # the second time from the visitor's memo
    state[STEP.temperature] = 0.0
    assert not control.sampler_view(state, gen).changed


def test_a_sampler_value_out_of_range_is_a_message_and_the_sampler_stays(state) -> None:
    gen = generation(state)
    state[STEP.top_p] = 1.5
    view = control.sampler_view(state, gen)
    assert view.problem is not None and "top_p" in view.problem
    assert gen.sampler == SamplerSettings(temperature=0.0)


def test_a_new_prompt_starts_over_and_an_empty_one_keeps_the_generation(state, tiny_lm) -> None:
    control.step(state)
    kept = generation(state)
    state[STEP.prompt] = "   "
    control.sync_generation(state, tiny_lm)
    assert generation(state) is kept and "empty" in message(state, "prompt")
    state[STEP.prompt] = "Another"
    control.sync_generation(state, tiny_lm)
    assert generation(state).prompt == "Another" and message(state, "prompt") is None


def test_stop_settings_pass_on_without_starting_over(state, tiny_lm) -> None:
    control.step(state)
    kept = generation(state)
    state[STEP.stop_sequences] = "a\\nb"
    control.sync_generation(state, tiny_lm)
    assert generation(state) is kept and kept.stop.stop_sequences == ("a\nb",)
    state[STEP.stop_sequences] = "a\nb\nc\nd\ne"
    control.sync_generation(state, tiny_lm)
    assert "at most 4" in message(state, "stop") and kept.stop.stop_sequences == ("a\nb",)


def test_a_run_steps_once_per_call_and_stops_when_generation_finishes(state, tiny_lm) -> None:
    state[STEP.max_new_tokens] = 3
    control.sync_generation(state, tiny_lm)
    control.start_run(state)
    gen = generation(state)
    for _ in range(3):
        assert control.is_running(state)
        control.advance_run(state, gen, now=100.0)
    assert len(gen.steps) == 3 and gen.finished and not control.is_running(state)


def test_a_run_keeps_each_token_on_screen_for_a_frame(state) -> None:
    control.advance_run(state, generation(state), now=100.0)
    assert control.run_frame_wait(state, now=100.1) == pytest.approx(RUN_FRAME_S - 0.1)
    assert control.run_frame_wait(state, now=101.0) == 0.0


def test_choosing_a_preset_fills_the_widgets(state) -> None:
    state[STEP.preset] = "Stop sequence (Q&A)"
    control.choose_preset(state)
    assert state[STEP.stop_sequences] == "\\nB:"


def test_prompt_chips_are_built_once_per_prompt(state) -> None:
    gen = generation(state)
    html = control.prompt_html(state, gen)
    assert html.count("tbt-prompt") == len(gen.prompt_ids)
    assert control.prompt_html(state, gen) is html
    assert recall(state, STEP.memo, ("prompt_chips", gen.lm.source, tuple(gen.prompt_ids))) is html


def test_a_share_link_is_read_once_and_replays_its_steps(state, tiny_lm) -> None:
    state[STEP.temperature] = 1.0
    control.sync_generation(state, tiny_lm)
    control.sampler_view(state, generation(state))
    control.step(state)
    control.step(state)
    original = generation(state)
    params = control.share_params(original, "bundled")
    assert "model" not in params
    visitor: dict[str, Any] = {}
    init_defaults(visitor)
    shared = control.link_to_open(visitor, {k: v if isinstance(v, list) else [v] for k, v in params.items()})
    assert shared is not None and control.link_to_open(visitor, {"prompt": ["again"]}) is None
    control.open_link(visitor, tiny_lm, shared)
    copy = generation(visitor)
    assert [s.token_id for s in copy.steps] == [s.token_id for s in original.steps]
    assert visitor[STEP.temperature] == 1.0 and visitor[STEP.prompt] == PROMPT


@pytest.mark.parametrize(("params", "said"), [
    ({"prompt": ["x"], "max": [str(10**20)]},
     "Max new tokens: 100,000,000,000,000,000,000 is not allowed; a whole number from 1 to"),
])
def test_a_links_number_out_of_range_names_the_allowed_range(tiny_lm, params, said) -> None:
    visitor: dict[str, Any] = {}
    assert control.link_to_open(visitor, params) is None
    assert said in message(visitor, "link") and "whole number, not" not in message(visitor, "link")


def test_too_many_stop_sequences_are_named_in_the_widgets_words(state, tiny_lm) -> None:
    state[STEP.stop_sequences] = "a\nb\nc\nd\ne".replace("\\n", "\n")
    control.sync_generation(state, tiny_lm)
    said = message(state, "stop")
    assert said == "Stop sequences: 5 sequences is not allowed; at most 4 sequences."
    assert "(" not in said and "stop_sequences" not in said


def test_a_broken_share_link_says_why(tiny_lm) -> None:
    visitor: dict[str, Any] = {}
    assert control.link_to_open(visitor, {"prompt": ["x"], "tokens": ["4,x!"]}) is None
    assert message(visitor, "link").startswith("This link cannot be opened: ") and "'x!'" in message(visitor, "link")


def test_the_address_bar_is_rewritten_whenever_it_does_not_hold_the_link(state) -> None:
    """Read from the address itself: after another page left it bare, coming back writes the
    link again (it used to be remembered as written, and a teacher copied a bare URL)."""
    control.step(state)
    params = control.share_params(generation(state), "bundled")
    address = {key: value if isinstance(value, list) else [value] for key, value in params.items()}
    assert control.needs_publishing({}, params)  # a first visit, or back from another page
    assert not control.needs_publishing(address, params)  # already there: nothing written
    assert not control.needs_publishing(address, params)  # and every rerun says the same
    assert control.needs_publishing({**address, "tokens": ["1"]}, params)  # a stale link is replaced


def test_a_prompt_typed_and_run_in_one_click_runs_the_new_prompt(state) -> None:
    """Run's callback also comes before the page reads the widgets: empty, the field used to let
    a Run start on the stale generation (the refusal read the previous run's message)."""
    control.step(state)
    state[STEP.prompt] = ""  # cleared, then Run clicked at once
    control.start_run(state)
    assert not control.is_running(state) and len(generation(state).steps) == 1
    state[STEP.prompt] = "A new prompt"
    control.start_run(state)
    assert control.is_running(state) and generation(state).prompt == "A new prompt"


def test_a_prompt_typed_and_stepped_in_one_click_makes_its_first_token(state) -> None:
    """The click on Step is what takes the focus from the prompt field: its callback runs
    with the new prompt in the widgets before the page reads them. It must step the new
    prompt's generation, not the old one (which the page then replaced with an empty one)."""
    control.step(state)
    state[STEP.prompt] = "The capital of Italy is"  # typed, then Step clicked at once
    control.step(state)
    gen = generation(state)
    assert gen.prompt == "The capital of Italy is" and len(gen.steps) == 1


def test_while_the_prompt_is_empty_step_and_run_do_nothing_and_say_why(state, tiny_lm) -> None:
    control.step(state)
    old = generation(state)
    state[STEP.prompt] = ""
    control.sync_generation(state, tiny_lm)  # the page's run: the prompt's error shows
    assert control.prompt_problem(state).startswith("Fix the prompt above first: The prompt is empty")
    control.step(state)
    control.start_run(state)
    assert len(old.steps) == 1 and not control.is_running(state)  # the stale generation was not stepped
    assert message(state, "buttons").startswith("Fix the prompt above first")
    state[STEP.prompt] = "Again"
    control.step(state)
    assert generation(state).prompt == "Again" and len(generation(state).steps) == 1
    assert control.prompt_problem(state) is None


def test_a_trace_replays_into_the_generation_and_a_bad_one_changes_nothing(state, tiny_lm) -> None:
    control.step(state)
    control.step(state)
    trace = json.dumps(to_trace(generation(state))).encode()
    tokens = generation(state).generated_ids
    visitor: dict[str, Any] = {}
    init_defaults(visitor)
    control.load_trace(visitor, tiny_lm, "trace.json", trace)
    assert generation(visitor).generated_ids == tokens
    assert message(visitor, "trace") == "Loaded trace.json: 2 steps replayed."
    kept = generation(visitor)
    control.load_trace(visitor, tiny_lm, "bad.json", b"{not json")
    assert generation(visitor) is kept and "bad.json" in message(visitor, "trace_error")


def test_a_linked_or_loaded_generation_steps_through_the_servers_scheduler(state, tiny_lm) -> None:
    from engine.serving.scheduler import ForwardScheduler

    scheduler = ForwardScheduler(tiny_lm)
    try:
        linked: dict[str, Any] = {}
        shared = control.link_to_open(linked, {"prompt": ["Hi"], "max": ["4"], "tokens": ["5,6"]})
        control.open_link(linked, tiny_lm, shared, scheduler=scheduler)
        control.step(state)
        control.load_trace(state, tiny_lm, "t.json", json.dumps(to_trace(generation(state))).encode(),
                           scheduler=scheduler)
        for gen in (step_generation(linked), generation(state)):
            assert gen.scheduler is scheduler
            gen.step()
        assert scheduler.stats().passes > 0
    finally:
        scheduler.close()


# ---- a tab left idle -------------------------------------------------------------------------

def test_a_generation_put_away_while_idle_is_rebuilt_exactly_on_the_next_click(state, tiny_lm) -> None:
    twin_state: dict[str, Any] = {}
    init_defaults(twin_state)
    twin_state[STEP.prompt] = PROMPT
    control.sync_generation(twin_state, tiny_lm)
    for visitor in (state, twin_state):
        visitor[STEP.temperature] = 0.9  # sampled steps: the rebuild must repeat the same draws
    for _ in range(4):
        control.step(state)
        control.step(twin_state)
    put_away = generation(state)
    put_away.close()  # what the idle releaser does
    control.step(state)  # the visitor comes back and clicks Step
    control.step(twin_state)
    rebuilt, twin = generation(state), generation(twin_state)
    assert rebuilt is not put_away and not rebuilt.closed
    assert rebuilt.generated_ids == twin.generated_ids and len(rebuilt.steps) == 5
    assert [s.distribution for s in rebuilt.steps] == [s.distribution for s in twin.steps]
    assert message(state, "idle").startswith("Welcome back. Your generation was put away after 30 minutes idle")
    control.step(state)  # the next click clears the note
    assert message(state, "idle") is None


def test_a_rebuild_that_cannot_replay_says_so_and_keeps_the_records(state, tiny_lm, monkeypatch) -> None:
    control.step(state)
    put_away = generation(state)
    put_away.close()
    monkeypatch.setattr(idle_rebuild, "replay", lambda *a, **k: (_ for _ in ()).throw(
        control.TraceError("the model changed")))
    control.step(state)
    assert generation(state) is put_away and len(put_away.steps) == 1
    assert "could not be rebuilt (the model changed)" in message(state, "buttons")


def test_the_default_seeds_first_draws_are_typical_ones() -> None:
    """A first sampled demo should pick likely tokens: no draw among the default seed's first
    five lies in the outer tenth of [0, 1) (seed 0's first was 0.970)."""
    import torch

    from engine import draw_uniform

    generator = torch.Generator().manual_seed(DEFAULT_SEED)
    draws = [draw_uniform(generator) for _ in range(5)]
    assert all(0.1 < u < 0.9 for u in draws) and abs(sum(draws) / 5 - 0.5) < 0.1, draws


def test_a_link_or_trace_made_on_a_gpu_says_so_where_it_is_opened_on_the_cpu(state, tiny_lm) -> None:
    control.step(state)
    made = generation(state)
    params = {k: v if isinstance(v, list) else [v] for k, v in control.share_params(made, "bundled").items()}
    assert "device" not in params  # made on the CPU: the link is as it always was
    visitor: dict[str, Any] = {}
    init_defaults(visitor)
    shared = control.link_to_open(visitor, {**params, "device": ["cuda"]})
    assert shared is not None and shared.device == "cuda"
    control.open_link(visitor, tiny_lm, shared)
    assert "The link was made on cuda and is replayed here on cpu" in message(visitor, "link")
    trace = to_trace(made)
    trace["model"]["device"] = "cuda:0"
    control.load_trace(visitor, tiny_lm, "gpu.json", json.dumps(trace).encode())
    assert "The trace was made on cuda and is replayed here on cpu" in message(visitor, "trace")
    other: dict[str, Any] = {}  # a visitor reads one link: a bad one comes in another tab
    assert control.link_to_open(other, {**params, "device": ["cu da"]}) is None
    assert "'device' must be a device type" in message(other, "link")


@pytest.fixture()
def long_prompt(tiny_lm: LoadedModel, monkeypatch) -> Iterator[tuple[dict[str, Any], Future]]:
    """A visitor whose prompt counts as long, on a scheduler whose prompt pass ends only when the
    test ends it (the Future); the tiny model's window is far below the real one's threshold."""
    monkeypatch.setattr(control, "LONG_PROMPT_TOKENS", 2)
    scheduler, pending = ForwardScheduler(tiny_lm), Future()
    monkeypatch.setattr(scheduler, "submit", lambda token_ids, cache: pending)
    state: dict[str, Any] = {}
    init_defaults(state)
    state[STEP.prompt] = PROMPT
    control.sync_generation(state, tiny_lm, scheduler)
    try:
        yield state, pending
    finally:
        scheduler.close()


def test_a_long_prompts_first_step_is_left_to_the_page_while_its_pass_still_reads(long_prompt) -> None:
    state, pending = long_prompt
    gen = generation(state)
    assert control.is_long_prompt(gen) and control.awaiting_prompt(state, gen) is None
    control.step(state)  # the pass has not read the prompt yet: no step inside the click
    reading = control.awaiting_prompt(state, gen)
    assert reading is not None and not reading.done and gen.steps == ()
    pending.set_exception(RuntimeError("withdrawn"))  # ended (the step then reads the prompt itself)
    assert control.awaiting_prompt(state, gen).done
    control.finish_awaited_step(state)
    assert len(gen.steps) == 1 and control.awaiting_prompt(state, gen) is None
    assert not control.is_long_prompt(gen) and message(state, "buttons") is None


def test_the_class_presenters_step_waits_for_a_long_prompts_pass_inside_the_click(long_prompt) -> None:
    state, pending = long_prompt
    generation(state).read_prompt_ahead()
    threading.Timer(0.2, lambda: pending.set_exception(RuntimeError("withdrawn"))).start()
    control.step_now(state)  # waits for the pass to end, then steps
    assert len(generation(state).steps) == 1 and STEP.awaiting_prompt not in state


def test_a_recording_dropped_on_the_page_replays_its_generation(state, tiny_lm) -> None:
    control.step(state)
    control.step(state)
    recorded = generation(state)
    page = generation_recording(recorded, share_query="prompt=Hello")
    visitor: dict[str, Any] = {}
    init_defaults(visitor)
    control.load_trace(visitor, tiny_lm, "lesson.html", page.encode())
    assert message(visitor, "trace_error") is None
    assert generation(visitor).generated_ids == recorded.generated_ids
    assert message(visitor, "trace").startswith("Loaded lesson.html: 2 steps replayed.")
    control.load_trace(visitor, tiny_lm, "other.html", b"<!doctype html><html><body>a page</body></html>")
    assert message(visitor, "trace_error") == ("other.html: This web page carries no Token by Token recording (no "
                                               "trace inside it).")
