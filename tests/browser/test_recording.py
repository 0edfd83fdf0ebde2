"""A recording (engine/recording.py): one web page that replays a generation with no server. It
opens from disk with the network blocked, steps through every token showing the trace's own
numbers, follows a dark setting, passes axe, and carries its trace back into the app."""

from __future__ import annotations

import json
import re

import pytest

from engine import Generation, SamplerSettings, StopSettings, parse_trace, replay, save_recording, to_trace
from tests.browser.axe_audit import serious_violations
from tests.browser.conftest import ARTIFACTS

pytestmark = pytest.mark.browser
TOKENS = 64


def percent(p: float) -> str:
    """As the page writes a probability (the script formats, never computes)."""
    if p >= 0.001 or p == 0:
        return f"{100 * p:.1f}%"
    if p >= 1e-5:
        return f"{100 * p:.3f}%"
    mantissa, exponent = f"{p:.1e}".split("e")
    return f"{mantissa} × 10^{int(exponent)}"


@pytest.fixture(scope="module")
def recorded(lm, tmp_path_factory):
    generation = Generation(lm, "Once upon a time", sampler=SamplerSettings(temperature=0.8, top_k=40), seed=3,
                            stop=StopSettings(max_new_tokens=TOKENS, ignore_eos=True))
    for _ in generation.run():
        pass
    path = save_recording(generation, tmp_path_factory.mktemp("recording") / "recording.html",
                          share_query="prompt=Once+upon+a+time&seed=3")
    return generation, path


def test_a_recording_stays_small_and_carries_its_trace_back_into_a_live_generation(lm, recorded) -> None:
    generation, path = recorded
    assert path.stat().st_size < 2 * 2**20  # 64 tokens
    trace = parse_trace(path.read_text(encoding="utf-8"))  # the page, as the app's uploader reads it
    assert trace == json.loads(json.dumps(to_trace(generation)))
    again = replay(lm, trace).generation
    assert again.generated_ids == generation.generated_ids and not replay(lm, trace).mismatched_steps


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_recording_opens_offline_and_steps_through_every_token_with_the_traces_numbers(browser, recorded,
                                                                                        scheme) -> None:
    generation, path = recorded
    trace = to_trace(generation)
    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme=scheme, offline=True)
    asked: list[str] = []
    context.route("**/*", lambda route: (asked.append(route.request.url), route.continue_()
                                         if route.request.url.startswith("file:") else route.abort()))
    page = context.new_page()
    try:
        page.goto(path.as_uri())
        assert "A recording made with" in page.locator("#about").inner_text()
        assert "Seed 3; temperature 0.8, top-k 40" in page.locator("#about").inner_text()
        assert "prompt=Once+upon+a+time&seed=3" in page.locator("#share").inner_text()
        for number, step in enumerate(trace["steps"], start=1):
            page.keyboard.press("PageDown" if number % 2 else "ArrowRight")
            status = page.locator("#status").inner_text()
            assert status.startswith(f"Step {number} of {TOKENS}: the model wrote {json.dumps(step['text'])}"), status
            assert page.locator(".chip.gen").count() == number
            pick = page.locator("tr.pick td").all_inner_texts()
            assert pick[2].startswith(percent(step["prob"])) and pick[3].startswith(percent(step["final_prob"]))
            detail = page.locator("#detail").inner_text()
            assert f"u = {step['draw']['u']:.6f}" in detail
            assert f"{step['kv_cache']['tokens']:,} positions, {step['kv_cache']['bytes']:,} bytes" in detail
        assert page.locator("#step").is_disabled()
        assert page.locator("#text").inner_text() == trace["steps"][-1]["output_text"]
        page.keyboard.press("PageUp")
        assert page.locator(".chip.gen").count() == TOKENS - 1
        page.get_by_role("button", name="Reset").click()
        assert page.locator(".chip.gen").count() == 0 and page.locator("#back").is_disabled()
        page.keyboard.press("Space")
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        channels = [int(c) for c in re.findall(r"\d+", background)[:3]]
        assert (max(channels) < 80) == (scheme == "dark"), background
        page.screenshot(path=str(ARTIFACTS / f"recording_{scheme}.png"), full_page=True)
        assert not serious_violations(page)
        assert [url for url in asked if not url.startswith("file:")] == []  # nothing asked of a network
    finally:
        context.close()
