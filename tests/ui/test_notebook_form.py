"""The notebook form (ui/notebook): the engine's records drawn by IPython's own formatters, and
the Stepper widget's Python side, on a tiny model. The notebooks themselves run on the real model
in a real kernel (tests/notebooks)."""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell

from engine import Generation, PromptLookup, SamplerSettings, SpeculativeGeneration
from ui.notebook import Stepper, enable, generation_html, step_html
from ui.notebook.display import NOTEBOOK_CSS, RecordTexts, lens_pick
from ui.views.format import pct, quoted


@pytest.fixture
def gen(tiny_lm) -> Generation:
    gen = Generation(tiny_lm, "abcabcabc", sampler=SamplerSettings(temperature=0.9, top_k=5), seed=3)
    for _ in range(3):
        gen.step()
    return gen


def test_ipythons_formatter_draws_a_step_a_generation_a_round_and_a_look_inside(gen, tiny_lm) -> None:
    shell = InteractiveShell.instance()
    assert enable(shell)
    spec = SpeculativeGeneration(tiny_lm, "abcabcabcabc", draft=PromptLookup(tiny_lm.eos_ids), k=3,
                                 sampler=SamplerSettings(temperature=0))
    spec.step()
    shown = {name: shell.display_formatter.format(value)[0].get("text/html", "")
             for name, value in {"step": gen.steps[-1], "generation": gen, "speculative": spec,
                                 "round": spec.rounds[-1], "inside": gen.inside_view()}.items()}
    record = gen.steps[-1]
    assert f"Next-token distribution at step {record.index}" in shown["step"]
    assert pct(record.prob) in shown["step"] and "tbt-bars-pick" in shown["step"]
    assert shown["generation"].count('class="tbt-chip') > 3 and 'data-steps="3"' in shown["generation"]
    assert "Check: stop or go on?" in shown["generation"]
    assert "Inside step 3&#x27;s forward pass" in shown["inside"] and 'class="tbt-lens-cell' in shown["inside"]
    assert shown["round"] and shown["speculative"].startswith('<div class="tbt-nb">')
    assert all(value.startswith('<div class="tbt-nb">') and NOTEBOOK_CSS in value for value in shown.values())


def test_a_step_on_its_own_names_its_tokens_from_its_own_record(gen) -> None:
    record = gen.steps[-1]
    texts = RecordTexts(record)
    assert texts.piece(record.token_id) == record.token
    assert texts.piece(record.decision.sampler_token_id).text  # always among the recorded leaders
    with pytest.raises(KeyError):
        texts.piece(-5)
    assert quoted(record.token.text).replace("'", "&#x27;") in step_html(record)


def test_a_look_inside_on_its_own_marks_the_pick_only_where_a_layer_ranks_it_first(gen) -> None:
    view = gen.inside_view()
    pick = lens_pick(view)
    ranked_first = [layer for layer in view.layers if layer.pick_rank == 1]
    if ranked_first:
        assert pick.token_id == gen.steps[-1].token_id
    else:
        assert pick.token_id == -1  # no cell is marked as the pick


def test_the_theme_follows_the_notebook_jupyterlab_vscode_colab_or_the_system() -> None:
    for selector in ("body[data-jp-theme-light='false'] .tbt-nb", "body.vscode-dark .tbt-nb",
                     "html[theme='dark'] .tbt-nb", "@media (prefers-color-scheme: dark)"):
        assert selector in NOTEBOOK_CSS
    assert "--tbt-muted:#b8b3a8" in NOTEBOOK_CSS and "--tbt-muted:#5f5b57" in NOTEBOOK_CSS


def press(stepper: Stepper, what: str) -> None:
    """What the widget's browser side sends for a button."""
    stepper._pressed(stepper, {"do": what}, [])


def test_the_steppers_buttons_step_back_and_reset_the_real_generation(tiny_lm) -> None:
    stepper = Stepper(tiny_lm, "abcabc", sampler=SamplerSettings(temperature=0))
    assert 'data-steps="0"' in stepper.view
    press(stepper, "step")
    press(stepper, "step")
    assert len(stepper.gen.steps) == 2 and 'data-steps="2"' in stepper.view and stepper.status == "Step 2."
    second = stepper.gen.steps[-1].token_id
    press(stepper, "back")
    assert len(stepper.gen.steps) == 1 and 'data-steps="1"' in stepper.view
    press(stepper, "step")
    assert stepper.gen.steps[-1].token_id == second  # greedy: Back then Step makes it again
    stepper.prompt = "xyz"
    assert "Reset" in stepper.status and stepper.gen.prompt == "abcabc"  # read at Reset only
    press(stepper, "reset")
    assert stepper.gen.prompt == "xyz" and not stepper.gen.steps
    assert stepper.gen.steps == () and generation_html(stepper.gen) == stepper.view


def test_the_steppers_sliders_apply_from_the_next_step_and_a_bad_value_keeps_the_last(tiny_lm) -> None:
    stepper = Stepper(tiny_lm, "abcabc")
    stepper.temperature, stepper.top_k = 0.7, 4
    assert stepper.gen.sampler == SamplerSettings(temperature=0.7, top_k=4)
    stepper.top_p = 1.5
    assert "top_p" in stepper.status and stepper.gen.sampler.top_p == 1.0
    stepper.top_p = 0.9
    press(stepper, "step")
    assert stepper.gen.steps[-1].decision.stages  # drawn with the sliders' sampler
    assert stepper.gen.sampler == SamplerSettings(temperature=0.7, top_k=4, top_p=0.9)


def test_a_bad_prompt_at_reset_is_said_and_the_generation_kept(tiny_lm) -> None:
    stepper = Stepper(tiny_lm, "abc")
    press(stepper, "step")
    stepper.prompt = ""
    press(stepper, "reset")
    assert stepper.status.startswith("Not reset:") and len(stepper.gen.steps) == 1


def test_where_widgets_do_not_run_the_stepper_shows_the_generation_as_html(tiny_lm) -> None:
    stepper = Stepper(tiny_lm, "abc")
    press(stepper, "step")
    data, _ = stepper._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data
    assert "A still of the Stepper" in data["text/html"] and 'data-steps="1"' in data["text/html"]
