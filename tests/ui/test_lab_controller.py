"""The Sampler lab's controller without Streamlit: a plain dict as the visitor's state and a
tiny random model (tests/tiny.py), so these run in the fast suite. (The page and its numbers on
the real model: tests/ui/test_sampler_lab.py.)"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engine import LoadedModel, SamplerSettings
from ui.controllers import sampler_lab as lab
from ui.controllers import step_through as step_controller
from ui.domain.sampler_lab import apply
from ui.session.keys import LAB, STEP
from ui.session.settings import init_defaults, step_generation

PRESET = next(iter(lab.PRESETS))


@pytest.fixture()
def state() -> dict[str, Any]:
    return {}


def with_a_step_page_generation(state: dict[str, Any], lm: LoadedModel, steps: int) -> None:
    init_defaults(state)
    state[STEP.temperature] = 0.8
    step_controller.sync_generation(state, lm)
    for _ in range(steps):
        step_controller.step(state)


def test_the_step_pages_generation_is_offered_once_it_has_a_step(state, tiny_lm) -> None:
    assert lab.sources(state, tiny_lm) == list(lab.PRESETS)
    with_a_step_page_generation(state, tiny_lm, steps=0)
    assert lab.sources(state, tiny_lm) == list(lab.PRESETS)
    step_controller.step(state)
    assert lab.sources(state, tiny_lm) == [lab.LIVE, *lab.PRESETS]


def test_a_presets_step_is_frozen_once_per_visitor(state, tiny_lm) -> None:
    key, step = lab.frozen_step(state, tiny_lm, PRESET)
    assert key == ("preset", PRESET, tiny_lm.name) and step.index == 1 and step.generation.prompt == PRESET
    assert lab.frozen_step(state, tiny_lm, PRESET) == (key, step)


def test_a_presets_generation_put_away_while_idle_is_frozen_again_the_same(state, tiny_lm, idle_server) -> None:
    _, step = lab.frozen_step(state, tiny_lm, PRESET)
    assert idle_server.away(61) == 1 and step.generation.closed  # registered with the server's releaser
    _, again = lab.frozen_step(state, tiny_lm, PRESET)
    assert again is not step and not again.generation.closed
    assert torch.equal(again.logits, step.logits) and again.u == step.u
    assert idle_server.away(61) == 1  # the new one is registered too


def test_the_step_pages_generation_put_away_while_idle_is_rebuilt_before_it_is_studied(state, tiny_lm,
                                                                                        idle_server) -> None:
    with_a_step_page_generation(state, tiny_lm, steps=3)
    _, first = lab.frozen_step(state, tiny_lm, lab.LIVE)
    put_away = step_generation(state)
    assert idle_server.away(61) == 1 and put_away.closed
    _, again = lab.frozen_step(state, tiny_lm, lab.LIVE)
    rebuilt = step_generation(state)
    assert rebuilt is not put_away and not rebuilt.closed and again.generation is rebuilt
    assert torch.equal(again.logits, first.logits) and again.u == first.u and again.index == 3


def test_a_columns_sliders_make_its_sampler_and_a_bad_value_is_its_message(state) -> None:
    column = lab.COLUMNS[1]
    values = {"_temperature": 0.7, "_top_k": 10, "_top_p": 0.9, "_min_p": 0.0, "_penalty": 1.0}
    state.update({column.key + suffix: value for suffix, value in values.items()})
    assert lab.column_sampler(state, column) == SamplerSettings(temperature=0.7, top_k=10, top_p=0.9)
    state[column.key + "_top_k"] = -1
    assert lab.column_sampler(state, column) is None and "top_k" in lab.lab_message(state, column.name)
    state[column.key + "_top_k"] = 10
    lab.column_sampler(state, column)
    assert lab.lab_message(state, column.name) is None


def test_a_slider_the_page_did_not_draw_keeps_its_columns_default(state) -> None:
    column = lab.COLUMNS[2]  # an embed draws no repetition penalty; C's defaults are not the engine's
    state.update({column.key + "_temperature": 0.5, column.key + "_top_k": 3})
    assert lab.column_sampler(state, column) == SamplerSettings(
        temperature=0.5, top_k=3, top_p=column.defaults.top_p, min_p=column.defaults.min_p,
        repetition_penalty=column.defaults.repetition_penalty)


def test_the_chain_comparisons_settings_come_from_its_four_sliders(state) -> None:
    state.update({LAB.chain_temperature: 1.5, LAB.chain_top_k: 40, LAB.chain_top_p: 0.9, LAB.chain_min_p: 2.0})
    assert lab.chain_sampler(state) is None and "min_p" in lab.lab_message(state, "chain")
    state[LAB.chain_min_p] = 0.05
    assert lab.chain_sampler(state) == SamplerSettings(temperature=1.5, top_k=40, top_p=0.9, min_p=0.05)


def test_the_draws_are_made_once_on_request_and_remembered(state, tiny_lm) -> None:
    step_key, step = lab.frozen_step(state, tiny_lm, PRESET)
    outcome = apply(step, SamplerSettings(temperature=1.0, top_k=5))
    key, counts = lab.draws(state, step_key, outcome, seed=3)
    assert counts is None and key == (*step_key, "draws", outcome.settings, 3)
    made = lab.draw(state, step_key, outcome, seed=3)
    assert sum(made.values()) == lab.DRAWS and len(made) <= 5
    assert lab.draws(state, step_key, outcome, seed=3) == (key, made)
    assert lab.draws(state, step_key, outcome, seed=4)[1] is None
