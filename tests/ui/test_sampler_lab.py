"""The Sampler lab: its numbers are the engine's (ui.lab) and its page shows them."""

from __future__ import annotations

import json
import re

import pytest
import torch
from streamlit.testing.v1 import AppTest

from engine import CHAINS, Generation, SamplerSettings
from engine.cpu_threads import on_sampler_thread
from engine.sampling import InverseCdf, decide, draw_uniform, pick_by_cdf
from tests.ui.apptest import APP, open_page
from ui.controllers.sampler_lab import COLUMNS
from ui.domain.sampler_lab import (
    apply,
    chain_outcomes,
    disputed_tokens,
    draw_many,
    freeze_generation,
    freeze_prompt,
    min_p_sweep,
    nucleus_sweep,
    outcome_distribution,
    temperature_sweep,
)
from ui.session.keys import LAB, STEP
from ui.session.settings import DEFAULT_PROMPT
from ui.views.format import quoted

# the engine's sampler on its own one-thread worker, as the lab and every step call it
decide_here = on_sampler_thread(decide)
pick_here = on_sampler_thread(pick_by_cdf)
COLUMN_DEFAULTS = {column.name: column.defaults for column in COLUMNS}  # the page's three columns


@pytest.fixture(scope="module")
def frozen(lm):
    return freeze_prompt(lm, DEFAULT_PROMPT, chat=False)


def lab(session: dict | None = None) -> AppTest:
    return open_page("pages/sampler_lab.py", session)


def picks(at: AppTest) -> list[str]:
    return [m.value for m in at.metric if m.label == "picks"]


# ---- ui.lab against the engine ------------------------------------------------------------

def test_frozen_step_keeps_the_generations_draw_so_apply_equals_resample(lm):
    generation = Generation(lm, "Once upon a time", seed=11)
    generation.step()
    generation.step()
    step = freeze_generation(generation, "test")
    assert torch.equal(step.logits, generation.raw_logits())
    for settings in [*COLUMN_DEFAULTS.values(), SamplerSettings(temperature=1.2, top_k=5)]:
        outcome = apply(step, settings)
        assert outcome.decision == generation.resample(settings).decision
        # the step's uniform draw, replayed through the engine's chain, gives the same pick
        decision, chain = decide_here(step.logits, step.context_ids, settings, InverseCdf(step.u))
        assert outcome.decision == decision
        assert torch.equal(outcome.chain.final_probs, chain.final_probs)


def test_a_multinomial_generation_keeps_its_own_draw_in_the_lab(lm):
    generation = Generation(lm, "Once upon a time", seed=4, draw="multinomial")
    generation.step()
    step = freeze_generation(generation, "test")
    assert step.u is None
    for settings in COLUMN_DEFAULTS.values():
        assert apply(step, settings).decision == generation.resample(settings).decision


def test_temperature_sweep_entropy_rises_and_top_probability_falls_with_t(frozen):
    points = temperature_sweep(frozen, [0.2, 0.5, 1.0, 2.0, 3.0])
    entropies = [p.entropy_bits for p in points]
    tops = [p.top_prob for p in points]
    assert entropies == sorted(entropies) and len(set(entropies)) == len(entropies)
    assert tops == sorted(tops, reverse=True)
    plain = decide_here(frozen.logits, frozen.context_ids, SamplerSettings(temperature=1.0), InverseCdf(frozen.u))[0]
    assert points[2].entropy_bits == pytest.approx(plain.final_entropy_bits)


def test_nucleus_grows_with_p_and_min_p_cut_is_relative_to_the_top_token(frozen):
    kept = [p.kept for p in nucleus_sweep(frozen, [0.1, 0.5, 0.9, 0.99, 1.0])]
    assert kept == sorted(kept) and kept[0] == 1 and kept[-1] == frozen.logits.numel()
    top = float(frozen.logits.softmax(dim=-1).max())
    points = min_p_sweep(frozen, [0.01, 0.1, 1.0])
    assert [p.threshold for p in points] == pytest.approx([0.01 * top, 0.1 * top, top])
    assert [p.kept for p in points] == sorted((p.kept for p in points), reverse=True)
    assert points[-1].kept == 1


def test_chain_orders_are_the_engines_and_their_kept_sets_can_differ(frozen):
    settings = SamplerSettings(temperature=1.5, top_k=40, top_p=0.9, min_p=0.05)
    outcomes = chain_outcomes(frozen, settings)
    assert list(outcomes) == list(CHAINS)
    for name, outcome in outcomes.items():
        expected = decide_here(frozen.logits, frozen.context_ids, SamplerSettings(
            temperature=1.5, top_k=40, top_p=0.9, min_p=0.05, chain=name), InverseCdf(frozen.u))[0]
        assert outcome.decision == expected
    disputed = disputed_tokens(frozen, outcomes)
    assert disputed, "these settings should make the chains keep different tokens"
    for token_id in disputed:
        assert 0 < sum(token_id in o.kept_ids for o in outcomes.values()) < len(outcomes)


def test_an_outcomes_distribution_names_its_pick_wherever_it_ranks_and_sums_to_one(lm, frozen):
    """The embed's bars: the leaders, the pick (a draw near 1 with nothing cut reaches far down)
    and the rest, in the sampler's final probabilities."""
    for settings in (SamplerSettings(temperature=1.0), SamplerSettings(temperature=1.0, top_k=2)):
        outcome = apply(frozen, settings, u=0.999)
        shown = outcome_distribution(lm, frozen, outcome, 3)
        by_id = {c.token_id: c for c in shown.top}
        assert [c.rank for c in shown.top[:3]] == [1, 2, 3]
        assert by_id[outcome.decision.token_id].final_prob == pytest.approx(outcome.decision.final_prob)
        total = sum(c.final_prob for c in shown.top) + shown.others_final_prob
        assert total == pytest.approx(1.0, abs=1e-5)
        assert shown.others_count == lm.vocab_size - len(shown.top)
    assert shown.others_final_prob == 0 and outcome.decision.draw.rank <= 2  # top-k 2: nothing else is left


def test_many_draws_pick_exactly_what_pick_by_cdf_picks_on_the_whole_vocabulary(frozen):
    final_probs = apply(frozen, COLUMN_DEFAULTS["C"]).chain.final_probs
    counts = draw_many(final_probs, 200, seed=5)
    generator = torch.Generator().manual_seed(5)
    expected: dict[int, int] = {}
    for _ in range(200):
        token_id, _draw = pick_here(final_probs, draw_uniform(generator))
        expected[token_id] = expected.get(token_id, 0) + 1
    assert dict(counts) == expected and sum(counts.values()) == 200


# ---- the page -----------------------------------------------------------------------------

def test_page_shows_each_samplers_pick_from_the_engine_for_a_preset(lm, frozen):
    at = lab()
    expected = [quoted(lm.texts.piece(apply(frozen, s).decision.token_id).text) for s in COLUMN_DEFAULTS.values()]
    assert picks(at) == expected
    assert len(at.get("plotly_chart")) >= 4  # samplers, temperature, top-p, min-p, chains
    assert any(f"{apply(frozen, COLUMN_DEFAULTS['A']).decision.final_kept:,}" in m.value for m in at.markdown)


def test_page_studies_the_step_pages_sampled_generation_with_its_own_draw():
    # the Step page's own widgets make the generation (a generation put in session_state by
    # hand would be replaced: the Step page starts over when its widgets describe another)
    at = AppTest.from_file(APP, default_timeout=240)
    for key, value in {STEP.prompt: "Once upon a time", STEP.seed: 3, STEP.temperature: 1.0}.items():
        at.session_state[key] = value
    at.run()
    at.button(key=STEP.step).click().run()
    at.button(key=STEP.step).click().run()
    generation = at.session_state[STEP.generation]
    assert (generation.seed, generation.sampler.temperature, len(generation.steps)) == (3, 1.0, 2)
    at.switch_page("pages/sampler_lab.py").run()
    assert not at.exception
    assert at.selectbox(key=LAB.source).value.startswith("Your generation")
    texts = generation.lm.texts
    expected = [quoted(texts.piece(generation.resample(s).decision.token_id).text) for s in COLUMN_DEFAULTS.values()]
    assert picks(at) == expected
    u = generation.resample(SamplerSettings()).decision.draw.u
    assert f"u = {u:.6f}" in at.checkbox(key=LAB.own_draw).label


def test_a_step_taken_on_the_step_page_is_what_the_lab_studies(lm):
    at = AppTest.from_file(APP, default_timeout=240)
    at.run()
    at.button(key="st_step").click().run()
    at.button(key="st_step").click().run()
    generation = at.session_state[STEP.generation]
    assert isinstance(generation, Generation) and len(generation.steps) == 2
    at.switch_page("pages/sampler_lab.py").run()
    assert not at.exception
    assert at.selectbox(key=LAB.source).value.startswith("Your generation")
    expected = [quoted(lm.texts.piece(generation.resample(s).decision.token_id).text) for s in COLUMN_DEFAULTS.values()]
    assert picks(at) == expected


def test_setting_temperature_zero_makes_a_column_pick_the_argmax(lm, frozen):
    at = lab()
    at.slider(key=f"{LAB.column_a}_temperature").set_value(0.0).run()
    assert not at.exception
    assert picks(at)[0] == quoted(lm.texts.piece(int(frozen.logits.argmax())).text)


def test_draw_button_shows_the_engines_thousand_draws(lm, frozen):
    at = lab()
    at.button(key=LAB.draw_button).click().run()  # Sampler B (top-k 10) is the default
    assert not at.exception
    counts = draw_many(apply(frozen, COLUMN_DEFAULTS["B"]).chain.final_probs, 1000, seed=0)
    assert len(counts) > 1
    assert any(m.value.startswith(f"{len(counts):,} different tokens came up") for m in at.markdown)


def test_a_chosen_draw_of_zero_makes_every_sampler_pick_its_most_probable_token(lm, frozen):
    at = lab()
    at.checkbox(key=LAB.own_draw).uncheck().run()
    at.slider(key=LAB.u).set_value(0.0).run()
    assert not at.exception
    expected = [quoted(lm.texts.piece(int(apply(frozen, s).chain.final_probs.argmax())).text)
                for s in COLUMN_DEFAULTS.values()]
    assert picks(at) == expected
    assert "u = 0.000" in " ".join(m.value for m in at.markdown)


def test_the_pages_tables_charts_and_u_slider_say_what_they_show(lm, frozen):
    """Issue 28: the disputed tokens' count matches the rows below it (or says how many are
    shown), one number of decimals per column, the min-p sweep's axis ends at 1, labels powers
    of ten only and names the marked setting at its line, and the u slider reads 0.999 at its
    top. (The tables' heights: the browser test.)"""
    at = lab()
    at.checkbox(key=LAB.own_draw).uncheck().run()
    at.slider(key=LAB.chain_temperature).set_value(2.0).run()
    at.number_input(key=LAB.chain_top_k).set_value(100).run()  # 19 tokens disputed on this step
    assert not at.exception
    u = at.slider(key=LAB.u)
    assert u.max == 0.999 and u.proto.format == "%.3f"
    said = next(m.value for m in at.markdown if "kept by some chains and cut by others" in m.value)
    count = int(re.search(r"\*\*([\d,]+) tokens? (?:are|is) kept", said)[1].replace(",", ""))
    rows = len(at.dataframe[-1].value)
    assert count > rows == 8 and "(the 8 most probable shown)" in said
    entropy = json.loads(at.dataframe[-2].proto.columns)["entropy (bits)"]
    assert entropy["type_config"]["format"] == "%.3f"
    charts = [json.loads(c.proto.spec)["layout"] for c in at.get("plotly_chart")]
    min_p = next(layout for layout in charts if "min-p cut" in json.dumps(layout.get("title", "")))
    assert min_p["xaxis"]["range"] == [-3.0, 0.0] and min_p["xaxis"]["tickvals"] == [0.001, 0.01, 0.1, 1.0]
    assert min_p["yaxis"]["dtick"] == 1
    assert [note["x"] for note in min_p["annotations"]] == [-1.0]  # "min-p = 0.1" at 0.1, on a log axis
