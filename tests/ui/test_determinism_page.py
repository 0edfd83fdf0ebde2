"""Same prompt, different answers: the page runs the engine's experiment on the visitor's prompt
through the server's queue and shows its numbers; bad settings are named and the visitor's work
kept; one experiment is measured once for everyone; the views say what a flip looks like."""

from __future__ import annotations

import pytest
import torch
from streamlit.testing.v1 import AppTest

from engine import SamplerSettings
from engine.serving import repeated_experiment, sum_in_two_orders
from tests.planted import PLANTED_PROMPT, PLANTED_STEP, planted_near_tie
from tests.ui.apptest import open_page
from ui.controllers import determinism as det
from ui.server.measurement_board import MeasurementBoard
from ui.session.keys import DETERMINISM as DET
from ui.views.determinism import closest_calls, sampled_closest, step_table, sum_line, texts_html, verdict

SMALL = {DET.runs: 2, DET.tokens: 6, DET.batch: 4}


@pytest.fixture(scope="module")
def page() -> AppTest:
    """The page after one small experiment on its default prompt."""
    at = open_page("pages/determinism.py", timeout=300)
    assert at.info and "Run the experiment" in at.info[0].value  # nothing measured before the visitor asks
    for key, value in SMALL.items():
        at.number_input(key=key).set_value(value)
    at.button(key=DET.run).click().run()
    assert not at.exception and not at.error, [e.value for e in (*at.exception, *at.error)]
    return at


def test_the_page_shows_the_experiments_own_numbers(page) -> None:
    experiment, result = page.session_state[DET.result]
    assert experiment == det.Experiment(det.DEFAULT.prompt, runs=2, tokens=6, batch=4)
    assert result.exact.max_abs_logit_diff == 0.0 and result.exact.distinct_completions == 1
    metrics = {m.label: m.value for m in page.metric}
    assert metrics["exact: completions"] == "1 of 2"
    assert metrics["fast: completions"] == f"{result.fast.distinct_completions} of 2"
    assert metrics["published, ordinary kernels"] == "80 of 1,000"
    said = [m.value for m in page.markdown]
    assert verdict(result) in said
    assert any(f"**exact {result.speed.exact_ms:.1f} ms**" in text for text in said)
    table = next(d.value for d in page.dataframe if "batch" in d.value)  # the runs, one row each
    assert list(table["batch"]) == [run.batch for run in result.fast.runs]
    assert list(table["exact: first difference"]) == ["none", "none"]


def test_the_why_section_computes_its_sums_on_the_spot(page) -> None:
    said = "\n".join(m.value for m in page.markdown)
    assert "In float32: (100000000 + -100000000) + 0.100000001 = **0.100000001**, but 100000000 + " \
           "(-100000000 + 0.100000001) = **0**." in said
    assert sum_line(sum_in_two_orders(1.0, 0.003, 0.003, torch.bfloat16)) in said
    assert "differ in **" in said  # one row alone and in a batch of 8, through the model's own weight


def test_an_empty_prompt_is_named_and_the_visitors_work_and_result_are_kept(page) -> None:
    before = page.session_state[DET.result]
    page.text_area(key=DET.prompt).set_value("   ")
    page.button(key=DET.run).click().run()
    assert [e.value for e in page.error] == ["The prompt is empty: type the text the model should go on from."]
    assert page.session_state[DET.result] is before and page.text_area(key=DET.prompt).value == "   "
    assert not page.exception


@pytest.mark.parametrize(("change", "words"), [
    ({"runs": 17}, "Runs is 17: it must be from 1 to 16."),
    ({"batch": 1}, "Largest batch is 1: it must be from 2 to 8."),
    ({"temperature": 2.0}, "Temperature is 2: it must be from 0 to 1.5."),
    ({"prompt": " ".join(["word"] * 300)}, "The prompt is 300 tokens: this lab reads at most 256"),
    ({"prompt": "x"}, "The prompt is one token"),
])
def test_each_setting_out_of_bounds_is_named_with_what_is_allowed(lm, change, words) -> None:
    fields = {"prompt": det.DEFAULT.prompt, **change}
    assert det.problem(lm, det.Experiment(**fields)).startswith(words)


def test_one_experiment_is_measured_once_for_everyone_through_the_given_queue(tiny_lm) -> None:
    board, passes = MeasurementBoard(), []

    def queue(job):
        passes.append(1)
        return job()

    first, second = {}, {}
    for state in (first, second):
        det.init_defaults(state)
        state.update({DET.prompt: "abc", DET.runs: 2, DET.tokens: 4, DET.batch: 3})
    assert det.run(first, tiny_lm, board, run_pass=queue)
    measured = len(passes)
    assert measured > 0
    assert det.run(second, tiny_lm, board, run_pass=queue)  # the same experiment: taken from the board
    assert len(passes) == measured and second[DET.result][1] is first[DET.result][1]


@pytest.fixture(scope="module")
def flipped():
    planted = planted_near_tie()
    return planted, repeated_experiment(planted, PLANTED_PROMPT, runs=3, tokens=8, batch=8, seed=0)


def test_a_flip_is_said_marked_in_the_text_and_found_among_the_near_ties(flipped) -> None:
    lm, result = flipped
    assert f"3 of 3 runs left the lone run's text, first at token {PLANTED_STEP + 1}" in verdict(result)
    shown = texts_html(lm, result.lone, [("In company, exact", result.exact.runs[0]),
                                         ("In company, fast", result.fast.runs[0])])
    assert f"In company, fast · differs from token {PLANTED_STEP + 1}" in shown
    assert "In company, exact · same as alone" in shown and shown.count('class="tbt-det-diverged"') == 1
    first = closest_calls(lm, result)[0]
    assert first.startswith(f"token {PLANTED_STEP + 1} (") and "a flip can happen" in first
    table = step_table(lm, result, 0)
    assert table["fast picks"][PLANTED_STEP].endswith("✗ differs")
    assert table["fast: largest change"][PLANTED_STEP + 1] == "— (contexts differ)"
    assert set(table["exact: largest change"]) == {"0"}


def test_a_sampled_run_says_how_near_its_draws_came_to_a_bands_edge(flipped) -> None:
    lm, _ = flipped
    result = repeated_experiment(lm, PLANTED_PROMPT, runs=2, tokens=6, batch=4, seed=0,
                                 sampler=SamplerSettings(temperature=0.01))
    note = sampled_closest(result)
    nearest = min(step.band_gap for step in result.lone.steps)
    # the planted tie swaps the pick with its rival, however far its draw was from an edge
    rival = result.lone.steps[PLANTED_STEP].rival_gap
    assert rival == min(step.rival_gap for step in result.lone.steps) and rival < 2 * result.fast.max_abs_logit_diff
    assert f"**{nearest:.2e}**" in note and f"**{rival:.2g}**" in note and note.endswith("So a draw could move here.")
    assert result.fast.first_divergence[0] == PLANTED_STEP
    assert sampled_closest(repeated_experiment(lm, PLANTED_PROMPT, runs=1, tokens=2, batch=2, seed=0)) is None
