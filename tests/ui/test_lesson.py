"""The Lesson: every preset really fires its termination condition on the real model, the
walk steps through the seven stages, and the prediction exercise scores against the model."""

from __future__ import annotations

import json
import re

import pytest
from streamlit.testing.v1 import AppTest

from engine import Generation
from tests.ui.apptest import open_page
from ui.domain.lesson import GREEDY, PRESETS, STAGES, candidates, score, start, tally
from ui.session.keys import APP, LESSON
from ui.session.presets import preset_named
from ui.views.charts import RAW_COLOUR
from ui.views.format import quoted
from ui.widgets.presentation import PRESENTATION_CSS


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.fires + ("_ignored" if p.stop.ignore_eos else ""))
def test_each_preset_fires_its_termination_condition(lm, preset):
    generation = start(lm, preset)
    steps = list(generation.run())
    assert generation.finish_reason == preset.fires
    generated = generation.generated_ids
    if preset.stop.ignore_eos:  # the model did end its turn, and went on regardless
        assert any(i in lm.eos_ids for i in generated[:-1])
        assert len(steps) == preset.stop.max_new_tokens
    if preset.fires == "stop_sequence":  # "10" arrives as two tokens, "1" then "0"
        assert [s.token.text for s in steps[-2:]] == ["1", "0"]
        assert generation.text.endswith("9, ") and "10" not in generation.text
    if preset.fires == "eos":
        assert generated[-1] in lm.eos_ids and "Paris" in generation.text


def test_candidates_are_the_top_tokens_in_an_order_that_gives_nothing_away(lm):
    generation = Generation(lm, "The capital of France is", sampler=GREEDY)
    step = generation.step()
    offered = candidates(step)
    assert {c.token_id for c in offered} == {c.token_id for c in step.distribution.top[:6]}
    assert [c.token_id for c in offered] != [c.token_id for c in step.distribution.top[:6]]
    second = step.distribution.top[1]
    guess = score(step, second.token_id)
    assert not guess.matched and guess.gave_up == pytest.approx(step.prob - second.prob)
    assert score(step, step.token_id).matched
    result = tally([guess, score(step, step.token_id)])
    assert (result.rounds, result.matches, result.match_rate) == (2, 1, 0.5)
    with pytest.raises(ValueError, match="not among"):
        score(step, step.distribution.top[-1].token_id + 10**6)


def lesson() -> AppTest:
    return open_page("pages/lesson.py")


def stage(at: AppTest) -> str:
    return at.header[0].value


def test_next_and_previous_walk_the_seven_stages_on_the_real_model(lm):
    at = lesson()
    seen = [stage(at)]
    for _ in range(len(STAGES) - 1):
        at.button(key="lesson_next").click().run()
        assert not at.exception
        seen.append(stage(at))
    assert seen == list(STAGES)
    expected = start(lm, PRESETS[0]).step()
    assert at.button(key="lesson_next").label == "Next token ▶"
    at.button(key="lesson_previous").click().run()
    assert stage(at) == STAGES[-2]
    shown = {m.label: m.value for m in at.metric}
    assert shown["positions in the cache"] == f"{expected.kv.positions:,}"
    at.button(key="lesson_previous").click().run()
    assert stage(at) == STAGES[4]
    assert {m.label: m.value for m in at.metric}["picked"] == quoted(expected.token.text)


def test_the_inside_stage_shows_each_layers_guess_and_the_attention_of_the_step_it_follows(lm):
    """The stage after the forward pass opens that very pass up: one lens cell per layer with the
    engine's own numbers, the pick's cells marked in text, the attention heatmap of the step's
    fed token; in presentation mode the heatmap gives way so the stage fits one screen."""
    at = lesson()
    at.button(key="lesson_next").click().run()
    at.button(key="lesson_next").click().run()
    assert not at.exception and stage(at) == STAGES[2] == "Inside the pass → each layer's guess"
    generation = at.session_state[LESSON.walk][1]
    view = Generation(lm, generation.prompt, chat=generation.chat, sampler=GREEDY)
    view.step()
    expected = view.inside_view()
    cells = next(h.proto.body for h in at.get("html") if "tbt-lens" in h.proto.body)
    assert cells.count('role="listitem"') == lm.geometry.layers + 1
    for layer in (expected.layers[0], expected.layers[-1]):
        assert f"predicts {quoted(layer.top_text)}".replace("'", "&#x27;") in cells
    marked = re.findall(r'role="listitem" aria-label="[^"]*">(★ )?(▶ )?', cells)
    assert [bool(pick) for _, pick in marked] == [layer.top_token_id == generation.steps[0].token_id
                                                  for layer in expected.layers]
    assert [bool(lead) for lead, _ in marked] == [layer.layer == expected.first_lead for layer in expected.layers]
    heatmap = json.loads(at.get("plotly_chart")[0].proto.spec)["data"][0]
    assert len(heatmap["z"]) == lm.geometry.layers and len(heatmap["x"]) == len(generation.prompt_ids)
    last = expected.layers[-1].attention  # per head, over positions: the heatmap's row is their mean
    assert heatmap["z"][-1] == pytest.approx([sum(h) / len(h) for h in zip(*last, strict=True)])
    assert any("attention sink" in m.value for m in at.markdown)
    at.session_state[APP.presentation] = True
    at.run()
    assert not at.exception and not at.get("plotly_chart")
    assert any("tbt-lens" in h.proto.body for h in at.get("html"))


def test_running_the_stop_sequence_preset_to_the_end_reports_it(lm):
    at = lesson()
    preset = preset_named(PRESETS, "A stop sequence appears")
    at.selectbox(key="lesson_preset").set_value(preset.name).run()
    at.button(key="lesson_next").click().run()  # tokens -> first forward pass
    for _ in range(len(STAGES) - 2):
        at.button(key="lesson_next").click().run()
    at.button(key="lesson_run").click().run()
    assert not at.exception
    assert "stop sequence" in at.success[0].value and "stop_sequence" in at.success[0].value
    generation = start(lm, preset)
    list(generation.run())
    assert at.code[-1].value == generation.text
    assert at.button(key="lesson_next").disabled


def test_prediction_rounds_are_scored_against_the_models_own_probabilities(lm):
    at = lesson()
    at.radio(key="lesson_mode").set_value("Predict the next token").run()
    reference = Generation(lm, "The capital of France is", sampler=GREEDY)
    first = reference.step()
    wrong = next(c for c in candidates(first) if c.token_id != first.token_id)
    at.radio(key="lesson_guess_1").set_value(wrong.token_id).run()
    at.button(key="lesson_reveal").click().run()
    # the reveal marks the student's guess and the model's pick, in the raw softmax's colour
    reveal = json.loads(at.get("plotly_chart")[-1].proto.spec)["data"][0]
    assert f"{quoted(wrong.text)}  ◆ your guess" in reveal["y"]
    assert f"{quoted(first.token.text)}  ▶ the model" in reveal["y"]
    assert reveal["marker"]["color"] == RAW_COLOUR
    at.button(key="lesson_next_round").click().run()
    second = reference.step()
    at.radio(key="lesson_guess_2").set_value(second.token_id).run()
    at.button(key="lesson_reveal").click().run()
    assert not at.exception
    shown = {m.label: m.value for m in at.metric}
    assert shown["rounds"] == "2"
    assert shown["you matched the model"] == "1 of 2"
    assert shown["probability given up"] == f"{first.prob - wrong.prob:.2f} in all"


def test_presentation_mode_sizes_type_from_the_viewport_and_wires_the_presenter_keys():
    at = lesson()
    assert not any("tbt-keys" in h.proto.body or h.proto.body == PRESENTATION_CSS for h in at.get("html"))
    at.session_state[APP.presentation] = True
    at.run()
    assert any(h.proto.body == PRESENTATION_CSS for h in at.get("html"))
    keys = next(h.proto.body for h in at.get("html") if "tbt-keys" in h.proto.body)
    for key, button in (("PageDown", LESSON.next), ("ArrowRight", LESSON.next), ("PageUp", LESSON.previous),
                        ("ArrowLeft", LESSON.previous)):
        assert f"&quot;{key}&quot;: &quot;{button}&quot;" in keys
    at.button(key=LESSON.next).click().run()
    assert not at.exception
    # the stage named in the button row
    assert at.markdown[0].value.startswith(f"#### Stage 2 of {len(STAGES)}: " + STAGES[1])
    assert not at.get("plotly_chart")  # bars sized from the viewport instead


def test_ignored_eos_is_pointed_out_and_the_loop_goes_on(lm):
    at = lesson()
    preset = preset_named(PRESETS, "End-of-sequence ignored")
    at.selectbox(key="lesson_preset").set_value(preset.name).run()
    reference = start(lm, preset)
    eos_step = next(s.index for s in reference.run() if s.token_id in lm.eos_ids)
    while len(at.session_state[LESSON.walk][1].steps) < eos_step or stage(at) != STAGES[-1]:
        at.button(key="lesson_next").click().run()
    assert not at.exception
    assert "ignores end tokens" in at.warning[0].value
    assert "Nothing fired" in at.info[0].value
    assert not at.button(key="lesson_next").disabled


def test_the_lessons_generations_run_their_passes_through_the_servers_scheduler():
    at = lesson()
    at.button(key="lesson_next").click().run()
    walk = at.session_state[LESSON.walk][1]
    assert walk.scheduler is not None and walk.steps  # its pass went through the shared queue
    assert walk.scheduler.stats().passes >= 1
