"""The step-through page in a real browser: Step shows a token, a slider re-samples it."""

from __future__ import annotations

import re

import pytest

from tests.browser.conftest import ARTIFACTS

pytestmark = pytest.mark.browser
STEPS = "Number(document.querySelector('.tbt-chips')?.dataset.steps ?? -1)"


def temperature_thumb(page):
    return page.locator("[data-testid='stSlider']").filter(has_text="Temperature").get_by_role("slider")


def test_step_shows_the_new_token_a_slider_resamples_it_and_stop_interrupts_run(page) -> None:
    page.get_by_role("button", name="Step", exact=True).click()
    page.wait_for_function(f"{STEPS} === 1", timeout=60_000)
    newest = page.locator(".tbt-newest").first
    assert newest.inner_text() == "␣Paris"
    assert "raw p" in newest.get_attribute("title")

    thumb = temperature_thumb(page)
    thumb.focus()
    for _ in range(16):  # 0.05 a press: temperature 0 → 0.8
        thumb.press("ArrowRight")
    note = page.get_by_text("Re-sampled step 1 from its kept logits")
    note.wait_for(timeout=30_000)
    assert page.evaluate(STEPS) == 1  # the slider made no new step
    assert "u = " in page.locator(".tbt-cdf").inner_text()  # greedy became a random draw
    assert "tokens=" in page.url  # the address bar is a share link

    page.mouse.move(5, 790)  # no tooltip over the screenshot
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "step_through_browser.png"))

    main = page.get_by_test_id("stMainBlockContainer")
    main.get_by_role("button", name="Run", exact=True).click()
    page.wait_for_function(f"{STEPS} >= 3", timeout=60_000)  # tokens appear while it runs
    main.get_by_role("button", name="Stop", exact=True).click()
    main.get_by_role("button", name="Run", exact=True).wait_for(timeout=30_000)
    stopped = page.evaluate(STEPS)
    page.wait_for_timeout(1500)
    assert page.evaluate(STEPS) == stopped < 32  # nothing more after Stop, well before max tokens

    sidebar = page.get_by_test_id("stSidebar")
    sidebar.get_by_placeholder("Hub id, model folder, or .gguf path").fill("/no/such/model.gguf")
    sidebar.get_by_role("button", name="Load model").click()
    sidebar.get_by_text("No file or folder at '/no/such/model.gguf'. The previous model stays loaded.").wait_for()
    assert page.evaluate(STEPS) == stopped  # the generation survived the failed load


def test_a_prompt_typed_and_stepped_at_once_makes_its_token_and_the_link_survives_another_page(page) -> None:
    """What a teacher does live: select the prompt, type a new one, click Step (no Enter, no
    click elsewhere first). The click makes the new prompt's first token. Then another page and
    back: the address bar holds the share link again, and a reload opens the same state."""
    prompt = page.locator("[data-testid='stTextArea'] textarea").first
    prompt.click()
    prompt.press("Control+A")
    prompt.type("The capital of Italy is")
    page.get_by_role("button", name="Step", exact=True).click()
    page.wait_for_function(f"{STEPS} === 1", timeout=60_000)
    assert "Italy" in page.locator(".tbt-chips").inner_text()
    page.get_by_role("button", name="Step", exact=True).click()
    page.wait_for_function(f"{STEPS} === 2", timeout=60_000)
    page.wait_for_function("location.search.includes('tokens=')", timeout=30_000)
    linked = page.url

    page.get_by_test_id("stSidebar").get_by_role("link", name="Sampler lab").click()
    page.wait_for_function("location.pathname.endsWith('sampler_lab')", timeout=60_000)
    page.get_by_test_id("stSidebar").get_by_role("link", name="Step through").click()
    # the lab's address carries the link too: wait for the Step page's own, not the lab's
    page.wait_for_function("!location.pathname.endsWith('sampler_lab') && location.search.includes('tokens=')",
                           timeout=60_000)
    assert page.url == linked
    page.reload()
    page.wait_for_function(f"{STEPS} === 2", timeout=90_000)
    assert "Italy" in page.locator(".tbt-chips").inner_text()


def test_step_is_unavailable_while_the_prompt_is_empty(page) -> None:
    page.get_by_role("button", name="Step", exact=True).click()
    page.wait_for_function(f"{STEPS} === 1", timeout=60_000)
    prompt = page.locator("[data-testid='stTextArea'] textarea").first
    prompt.click()
    prompt.press("Control+A")
    prompt.press("Delete")
    page.get_by_role("button", name="Step", exact=True).click()  # blurs the field: the empty prompt is read
    page.get_by_text("The prompt is empty").first.wait_for(timeout=30_000)
    step = page.get_by_role("button", name="Step", exact=True)
    page.wait_for_function("[...document.querySelectorAll('button')].some(b => b.innerText.trim() === 'Step' "
                           "&& b.disabled)", timeout=30_000)
    assert step.is_disabled() and page.evaluate(STEPS) == 1


def test_a_long_prompt_is_announced_with_its_estimate_and_its_first_step_shows_progress(page) -> None:
    """A prompt of a few thousand tokens: before Step, a warning with the time this server will
    take (from its measured prefill speed); on Step, a progress bar while the pass reads; then
    the first token, with nothing wrong."""
    text = " ".join(f"Sentence number {i} tells of a river, a town and the people who lived there." for i in range(120))
    field = page.get_by_label("Prompt", exact=True)
    field.fill(text)
    field.press("Control+Enter")
    warning = page.get_by_text(re.compile(r"^This prompt is 2,\d{3} tokens\. The first Step reads all of them"))
    warning.wait_for(timeout=120_000)
    assert re.search(r"about (\d+ min )?\d+ s on this server \(measured here: 128 tokens in", warning.inner_text())
    page.get_by_role("button", name="Step", exact=True).click()  # at once: the pass is still reading
    page.get_by_text(re.compile(r"^Reading the 2,\d{3}-token prompt in one forward pass")).wait_for(timeout=60_000)
    page.wait_for_function(f"{STEPS} === 1", timeout=240_000)
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=60_000)
    assert not page.get_by_text(re.compile(r"^This prompt is")).count()  # said before the first step only
    assert not page.get_by_test_id("stException").count()
    assert "Traceback" not in page.locator("body").inner_text()
