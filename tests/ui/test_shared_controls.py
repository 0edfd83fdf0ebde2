"""What the page controllers share lives once: the Step and Breaking-the-chain controllers read
their sampler and stop widgets through the same ui/session/settings.py functions, and keep their
generations open through the same ui/session/idle_rebuild.py function (so a fix lands in both)."""

from __future__ import annotations

from typing import Any

from engine import PromptLookup
from ui.controllers import breaking_the_chain as bc
from ui.controllers import step_through as control
from ui.session import idle_rebuild, settings
from ui.session.keys import CHAIN, STEP
from ui.session.settings import CHAIN_SETTINGS, STEP_SETTINGS


def lookup(lm, method: str):
    return PromptLookup(lm.eos_ids)


def both_pages(tiny_lm) -> tuple[dict[str, Any], dict[str, Any]]:
    step_page: dict[str, Any] = {}
    settings.init_defaults(step_page)
    step_page.update({STEP.prompt: "Hello there", STEP.temperature: 0.7, STEP.max_new_tokens: 5})
    chain_page: dict[str, Any] = {}
    bc.init_defaults(chain_page)
    chain_page.update({CHAIN.prompt: "abc abc", CHAIN.chat: False, CHAIN.temperature: 0.7, CHAIN.max_new_tokens: 5})
    return step_page, chain_page


def spy(monkeypatch, module: object, name: str) -> list[tuple]:
    """Record every call of `module.name` (its arguments), still calling the real function."""
    calls: list[tuple] = []
    real = getattr(module, name)

    def recording(*args, **kwargs):
        calls.append(args + tuple(kwargs.values()))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, recording)
    return calls


def test_both_controllers_read_their_sampler_and_stop_widgets_through_the_same_functions(tiny_lm,
                                                                                         monkeypatch) -> None:
    samplers, stops = spy(monkeypatch, settings, "sampler_from"), spy(monkeypatch, settings, "stop_from")
    step_page, chain_page = both_pages(tiny_lm)
    control.sync_generation(step_page, tiny_lm)
    lanes = bc.sync(chain_page, tiny_lm, lookup)
    widget_sets = {call[1] if len(call) > 1 else STEP_SETTINGS for call in samplers + stops}
    assert widget_sets == {STEP_SETTINGS, CHAIN_SETTINGS}
    gen = settings.step_generation(step_page)
    assert gen.sampler.temperature == lanes.speculative.sampler.temperature == lanes.plain.sampler.temperature == 0.7
    assert gen.stop.max_new_tokens == lanes.speculative.stop.max_new_tokens == 5


def test_a_page_without_a_chain_order_or_ignore_eos_widget_gets_their_defaults(tiny_lm) -> None:
    step_page, chain_page = both_pages(tiny_lm)
    one_state = step_page | chain_page | {STEP.chain: "llama.cpp", STEP.ignore_eos: True}
    assert settings.sampler_from(one_state).chain == "llama.cpp" and settings.stop_from(one_state).ignore_eos
    assert settings.sampler_from(one_state, CHAIN_SETTINGS).chain == "transformers"
    assert not settings.stop_from(one_state, CHAIN_SETTINGS).ignore_eos


def test_both_controllers_keep_their_generations_open_through_the_same_function(tiny_lm, monkeypatch,
                                                                                idle_server) -> None:
    kept = spy(monkeypatch, idle_rebuild, "keep_open")
    step_page, chain_page = both_pages(tiny_lm)
    control.sync_generation(step_page, tiny_lm)
    bc.sync(chain_page, tiny_lm, lookup)
    control.step(step_page)
    bc.step(chain_page, lookup)
    assert [call[1] for call in kept] == [STEP.generation, CHAIN.lanes]
    assert idle_server.away(61) == 3  # the Step page's generation and the two lanes
    control.step(step_page)
    bc.step(chain_page, lookup)
    for page, store in ((step_page, STEP.messages), (chain_page, CHAIN.messages)):
        assert settings.message(page, "idle", store).startswith("Welcome back.")
    assert len(settings.step_generation(step_page).steps) == 2
    assert len(bc.current_lanes(chain_page).speculative.rounds) == 2
