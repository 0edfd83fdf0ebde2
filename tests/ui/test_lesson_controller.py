"""The Lesson's controller without Streamlit: a plain dict as the visitor's state and a tiny
random model (tests/tiny.py), so these run in the fast suite. (The page on the real model:
tests/ui/test_lesson.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from engine import Generation, InsideView, LoadedModel, TraceError
from ui.controllers import lesson
from ui.domain.lesson import PREDICT_PROMPTS, PRESETS, STAGES, start
from ui.session import idle_rebuild
from ui.session.keys import LESSON
from ui.session.presets import preset_named

CAPPED = preset_named(PRESETS, "The max-tokens cap is reached")  # 12 tokens, whatever the model says


@pytest.fixture()
def state() -> dict[str, Any]:
    return {}


def walking(state: dict[str, Any], lm: LoadedModel, name: str = CAPPED.name) -> tuple[Generation, int]:
    """A run of the page: the walk for the preset `name` and its screen."""
    chosen = lesson.walk(state, lm, name)
    assert chosen is not None
    return chosen


def test_next_walks_the_seven_screens_and_steps_the_loop_leaving_the_first_and_the_last(state, tiny_lm) -> None:
    generation, shown = walking(state, tiny_lm)
    assert shown == 0 and generation.steps == ()
    lesson.go_next(state)
    assert walking(state, tiny_lm) == (generation, 1) and len(generation.steps) == 1
    for expected in range(2, len(STAGES)):
        lesson.go_next(state)
        assert lesson.stage(state) == expected and len(generation.steps) == 1
    lesson.go_next(state)  # from the check screen: the loop goes round again
    assert lesson.stage(state) == 1 and len(generation.steps) == 2


def test_previous_goes_back_through_an_earlier_tokens_screens_and_next_makes_the_same_step_again(state, tiny_lm):
    generation, _ = walking(state, tiny_lm)
    for _ in range(len(STAGES)):  # token 1's screens, then token 2's first
        lesson.go_next(state)
    assert lesson.stage(state) == 1 and len(generation.steps) == 2
    second = generation.steps[1]
    lesson.go_previous(state)  # token 1's check screen: its numbers, not token 2's
    assert lesson.stage(state) == len(STAGES) - 1 and len(generation.steps) == 1
    for expected in range(len(STAGES) - 2, 0, -1):
        lesson.go_previous(state)
        assert lesson.stage(state) == expected and len(generation.steps) == 1
    lesson.go_previous(state)  # token 1's first screen: back to the prompt's tokens, the step kept
    assert lesson.stage(state) == 0 and len(generation.steps) == 1
    lesson.go_previous(state)
    assert lesson.stage(state) == 0
    for _ in range(len(STAGES)):
        lesson.go_next(state)
    assert len(generation.steps) == 2 and generation.steps[1].token_id == second.token_id  # greedy: the same step
    assert generation.steps[1].prob == second.prob


def test_the_inside_stage_repeats_the_latest_steps_pass_once_and_says_why_when_it_cannot(state, tiny_lm) -> None:
    generation, _ = walking(state, tiny_lm)
    lesson.go_next(state)
    view = lesson.inside(state, generation)
    assert isinstance(view, InsideView) and view.step == 1
    assert view.layers[-1].pick_prob == generation.steps[0].prob  # the step's own distribution
    assert lesson.inside(state, generation) is view  # remembered for the step, not recomputed
    lesson.go_next(state)
    for _ in range(len(STAGES) - 2):
        lesson.go_next(state)
    assert len(generation.steps) == 2 and lesson.inside(state, generation).step == 2
    other, _ = walking(state, tiny_lm, PRESETS[1].name)
    lesson.go_next(state)
    other.close()  # put away before its stage was shown: the engine's own message, no traceback
    assert "closed to free its memory" in lesson.inside(state, other)


def test_another_preset_or_start_over_starts_the_walk_afresh(state, tiny_lm) -> None:
    first, _ = walking(state, tiny_lm)
    lesson.go_next(state)
    other, shown = walking(state, tiny_lm, PRESETS[1].name)
    assert other is not first and shown == 0 and other.prompt == PRESETS[1].prompt
    lesson.start_over(state)
    assert LESSON.walk not in state
    again, shown = walking(state, tiny_lm, PRESETS[1].name)
    assert again is not other and shown == 0 and again.steps == ()


def test_run_to_the_end_stops_where_the_preset_says_and_shows_the_check(state, tiny_lm) -> None:
    generation, _ = walking(state, tiny_lm)
    lesson.run_to_end(state)
    assert generation.finish_reason == "max_tokens" and len(generation.steps) == CAPPED.stop.max_new_tokens
    assert lesson.stage(state) == len(STAGES) - 1
    lesson.go_next(state)  # finished: Next changes nothing
    assert lesson.stage(state) == len(STAGES) - 1 and len(generation.steps) == CAPPED.stop.max_new_tokens


def test_the_walk_is_registered_for_idle_release_and_rebuilt_exactly_after_being_put_away(
        state, tiny_lm, idle_server) -> None:
    generation, _ = walking(state, tiny_lm)
    for _ in range(len(STAGES)):  # two steps of the loop: leaving the first screen, and the last
        lesson.go_next(state)
    assert len(generation.steps) == 2
    assert idle_server.away(61) == 1 and generation.closed  # the server's releaser knew the walk
    rebuilt, shown = walking(state, tiny_lm)  # the visitor comes back: the next run rebuilds it
    assert rebuilt is not generation and not rebuilt.closed and shown == 1
    twin = start(tiny_lm, CAPPED)
    list(twin.run(max_steps=2))
    assert rebuilt.generated_ids == twin.generated_ids
    assert [s.distribution for s in rebuilt.steps] == [s.distribution for s in twin.steps]
    assert lesson.walk_message(state, "idle").startswith("Welcome back. Your generation was put away after")
    assert lesson.walk_message(state, "idle").endswith("has been rebuilt exactly from its 2 steps.")
    lesson.go_next(state)  # a click: the note goes, and the rebuilt walk steps on
    assert lesson.walk_message(state, "idle") is None and lesson.stage(state) == 2
    assert idle_server.away(61) == 1 and rebuilt.closed  # the rebuilt walk is registered too
    lesson.go_next(state)  # a click rebuilds it as well
    assert not state[LESSON.walk][1].closed and lesson.stage(state) == 3


def test_a_walk_that_cannot_be_rebuilt_says_so_and_next_does_nothing(state, tiny_lm, idle_server,
                                                                      monkeypatch) -> None:
    generation, _ = walking(state, tiny_lm)
    lesson.go_next(state)
    idle_server.away(61)
    monkeypatch.setattr(idle_rebuild, "replay", lambda *a, **k: (_ for _ in ()).throw(TraceError("the model changed")))
    lesson.go_next(state)
    assert walking(state, tiny_lm) == (generation, 1) and len(generation.steps) == 1
    assert "could not be rebuilt (the model changed). Press Start over" in lesson.walk_message(state, "buttons")


def test_prediction_rounds_are_scored_and_the_next_round_takes_a_step(state, tiny_lm) -> None:
    generation = lesson.predict_generation(state, tiny_lm, PREDICT_PROMPTS[0])
    assert generation is not None and len(generation.steps) == 1
    step = generation.steps[-1]
    lesson.reveal(state, step)  # no choice yet: nothing to score
    assert lesson.guesses(state) == [] and not lesson.revealed(state)
    state[lesson.guess_key(step)] = step.token_id
    assert lesson.choice(state, step) == step.token_id
    lesson.reveal(state, step)
    assert lesson.revealed(state) and [g.matched for g in lesson.guesses(state)] == [True]
    lesson.next_round(state)
    assert len(generation.steps) == 2 and not lesson.revealed(state)
    other = lesson.predict_generation(state, tiny_lm, PREDICT_PROMPTS[1])
    assert other is not generation and lesson.guesses(state) == []  # another text: a new score


def test_the_exercise_is_registered_for_idle_release_and_rebuilt_on_the_next_round(state, tiny_lm,
                                                                                   idle_server) -> None:
    generation = lesson.predict_generation(state, tiny_lm, PREDICT_PROMPTS[0])
    state[lesson.guess_key(generation.steps[-1])] = generation.steps[-1].token_id
    lesson.reveal(state, generation.steps[-1])
    assert idle_server.away(61) == 1 and generation.closed
    lesson.next_round(state)
    rebuilt = state[LESSON.predict][1]
    assert rebuilt is not generation and len(rebuilt.steps) == 2
    assert rebuilt.generated_ids[:1] == generation.generated_ids and len(lesson.guesses(state)) == 1
    assert lesson.predict_message(state, "idle").startswith("Welcome back. Your generation was put away")
    assert idle_server.away(61) == 1


def test_a_link_opens_the_lesson_at_a_preset_and_a_stage_once_and_says_what_it_could_not_read(state, tiny_lm):
    lesson.open_link(state, tiny_lm, {"preset": "2", "stage": "4", "other": "x"})
    generation, shown = walking(state, tiny_lm, PRESETS[1].name)
    assert shown == 3 and len(generation.steps) == 1  # the fourth screen: the first token's softmax
    lesson.go_next(state)
    lesson.open_link(state, tiny_lm, {"preset": "1", "stage": "1"})  # read on the first run only
    assert lesson.stage(state) == 4 and state[LESSON.preset] == PRESETS[1].name
    fresh: dict = {}
    lesson.open_link(fresh, tiny_lm, {"stage": "9"})
    assert lesson.walk_message(fresh, "link") == ("The link's stage '9' is not one of 1 to 7: the lesson opens at "
                                                  "its start.")
    assert LESSON.walk not in fresh
