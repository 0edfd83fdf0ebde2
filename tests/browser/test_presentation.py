"""Presentation mode at a projector's sizes: one screen per token, driven from the keyboard (a
presenter remote sends PageDown / PageUp). Screenshots go to test-artifacts/ for a person to judge."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.browser.conftest import ARTIFACTS
from tests.browser.runs import SLOW, TWO_FRAMES, settle
from ui.domain.lesson import STAGES

pytestmark = pytest.mark.browser
SIZES = [(1280, 720), (1920, 1080)]
STEPS = "Number(document.querySelector('.tbt-chips')?.dataset.steps ?? -1)"
ON_STEP_SCREEN = {
    "newest chip": ".tbt-newest",
    "chips": ".tbt-chip-window",
    "distribution chart": ".tbt-bars",
    "the pick's row": ".tbt-bars-pick",
    "sampler decision": ".tbt-decision",
    "termination line": ".tbt-check",
}


def presentation_on(page) -> None:
    """The sidebar toggle, as a teacher turns it on; the sidebar then goes away."""
    page.get_by_test_id("stSidebar").get_by_text("Presentation mode").click()
    page.get_by_role("button", name=re.compile("Exit presentation")).wait_for(timeout=SLOW)
    settle(page)
    assert not page.get_by_test_id("stSidebar").is_visible()


def press_and_wait(page, key: str, steps: int) -> None:
    page.keyboard.press(key)
    page.wait_for_function(f"{STEPS} === {steps}", timeout=SLOW)
    settle(page)


def outside_viewport(page, selectors: dict[str, str], width: int, height: int) -> list[str]:
    """The named elements whose box is not wholly inside the viewport (or that are missing)."""
    outside = []
    for name, selector in selectors.items():
        box = page.locator(selector).first.bounding_box()
        if box is None or box["x"] < 0 or box["y"] < 0 or box["x"] + box["width"] > width + 1 or (
                box["y"] + box["height"] > height + 1):
            outside.append(f"{name}: {box}")
    return outside


def font_px(page, selector: str) -> float:
    return page.evaluate(f"parseFloat(getComputedStyle(document.querySelector('{selector}')).fontSize)")


def test_step_page_fits_one_screen_and_steps_from_the_keyboard(browser, app_url):
    """Driven at the first size; the window is then resized to each size (presentation mode's type
    and layout follow the viewport) and the step's screen must fit there."""
    width, height = SIZES[0]
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    try:
        page.goto(app_url)
        page.wait_for_function(f"{STEPS} === 0", timeout=SLOW)
        presentation_on(page)

        # keys typed into the prompt stay there: no step
        page.get_by_text("Prompt and settings").click()
        prompt = page.get_by_label("Prompt", exact=True)
        prompt.click()
        for key in ("PageDown", "ArrowRight", "Space", ".", "Backspace", "Backspace"):  # the text ends unchanged
            prompt.press(key)
        page.wait_for_timeout(1500)
        assert page.evaluate(STEPS) == 0
        page.evaluate("document.activeElement.blur()")
        page.get_by_text("Prompt and settings").click()  # folded again
        page.mouse.move(width / 2, height / 2)
        page.mouse.wheel(0, -10_000)  # back to the top, as the teacher would scroll
        settle(page)
        assert page.evaluate(STEPS) == 0

        for count in (1, 2, 3):  # a presenter remote's "next"
            press_and_wait(page, "PageDown", count)
        press_and_wait(page, "PageUp", 2)  # its "previous": Back
        press_and_wait(page, "ArrowRight", 3)
        for _ in range(5):  # presses faster than a step: each one is one token, none dropped
            page.keyboard.press("PageDown")
            page.wait_for_timeout(60)
        page.wait_for_function(f"{STEPS} === 8", timeout=SLOW)
        for _ in range(5):
            page.keyboard.press("PageUp")
            page.wait_for_timeout(60)
        page.wait_for_function(f"{STEPS} === 3", timeout=SLOW)
        page.wait_for_function("document.getElementById('tbt-key-queue')?.hidden !== false", timeout=SLOW)
        settle(page)
        for width, height in SIZES:
            page.set_viewport_size({"width": width, "height": height})
            page.evaluate(TWO_FRAMES)  # laid out again at this size
            page.mouse.move(width - 5, height - 5)
            assert outside_viewport(page, ON_STEP_SCREEN, width, height) == [], (width, height)
            window, newest = (page.locator(s).first.bounding_box() for s in (".tbt-chip-window", ".tbt-newest"))
            assert window["y"] <= newest["y"] and newest["y"] + newest["height"] <= window["y"] + window["height"] + 1
            assert page.locator(".tbt-bars-pick").first.inner_text().startswith("▶")
            assert font_px(page, ".tbt-bars-label") >= 0.022 * height  # 24 px at 1080p, scaled at 720p
            assert font_px(page, ".tbt-decision") >= 0.024 * height
            page.screenshot(path=str(ARTIFACTS / f"presentation_step_{width}x{height}.png"))

        page.get_by_role("button", name=re.compile("Exit presentation")).click()
        page.get_by_role("heading", name="Step through").wait_for(timeout=SLOW)
        page.get_by_test_id("stSidebar").wait_for(state="visible", timeout=30_000)  # back with the toggle
        assert page.evaluate(STEPS) == 3  # the generation survives leaving the mode
    finally:
        context.close()


def test_inside_the_pass_fits_the_projector_screen_and_follows_each_step(browser, app_url):
    """One click from the distribution: every layer's guess, the attention sink and what the pass
    read, on one 1280x720 screen, the next Step's own pass opened up in its place."""
    width, height = SIZES[0]
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    try:
        page.goto(app_url)
        page.wait_for_function(f"{STEPS} === 0", timeout=SLOW)
        presentation_on(page)
        press_and_wait(page, "PageDown", 1)
        page.get_by_text("Inside the pass", exact=True).click()
        page.locator(".tbt-lens-cell").first.wait_for(timeout=SLOW)
        settle(page)
        press_and_wait(page, "PageDown", 2)  # the presenter keys still step
        page.get_by_text("Step 2", exact=True).wait_for(timeout=SLOW)
        page.mouse.move(width - 5, height - 5)
        cells = page.locator(".tbt-lens-cell")
        assert cells.count() > 2
        assert outside_viewport(page, {"first layer": ".tbt-lens-cell", "chips": ".tbt-chip-window",
                                       "last layer": f".tbt-lens-cell >> nth={cells.count() - 1}"},
                                width, height) == []
        read = page.get_by_text(re.compile("^This pass took"))
        assert read.bounding_box()["y"] + read.bounding_box()["height"] <= height + 1, "the pass's bytes are cut off"
        page.screenshot(path=str(ARTIFACTS / f"presentation_inside_{width}x{height}.png"))
    finally:
        context.close()


def test_lesson_shows_each_stage_on_one_screen_and_follows_the_keys(browser, app_url):
    width, height = SIZES[0]
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    try:
        page.goto(app_url)
        page.get_by_role("link", name="Lesson").click()
        page.get_by_role("heading", name="Prompt → tokens").wait_for(timeout=SLOW)
        settle(page)
        presentation_on(page)
        total = len(STAGES)
        stage = page.get_by_role("heading", name=re.compile(rf"^Stage \d of {total}"))
        for number in range(1, total + 1):
            assert stage.inner_text().startswith(f"Stage {number} of {total}"), stage.inner_text()
            # the whole stage sits above the folded preset, and that starts on screen
            assert page.get_by_text("Preset and prompt").bounding_box()["y"] < height
            page.mouse.move(width - 5, height - 5)
            page.screenshot(path=str(ARTIFACTS / f"presentation_lesson_stage{number}_{width}x{height}.png"))
            if number < total:
                page.keyboard.press("PageDown" if number % 2 else "ArrowRight")
                page.get_by_role("heading", name=re.compile(f"^Stage {number + 1} of {total}")).wait_for(timeout=SLOW)
                settle(page)
        page.keyboard.press("ArrowLeft")
        page.get_by_role("heading", name=re.compile(f"^Stage {total - 1} of {total}")).wait_for(timeout=SLOW)
    finally:
        context.close()


def test_a_chip_window_shows_whole_rows_however_many_lines_the_text_breaks_into(browser, lm, tmp_path) -> None:
    """The projector's chip window is sized in rows: every row the same height, a newline adding
    none (it used to add a row gap, so four 'rows' showed three and a half)."""
    from engine import Generation, SamplerSettings, StopSettings
    from ui.views.chips import CHIP_CSS, chip_window, context_html, prompt_chips
    from ui.widgets.presentation import PRESENTATION_CSS

    gen = Generation(lm, "Write a short poem about the sea.", chat=True, sampler=SamplerSettings(temperature=0),
                     stop=StopSettings(max_new_tokens=60))
    list(gen.run())
    assert sum("\n" in s.token.text for s in gen.steps) >= 3  # lines that break the chips
    chips = context_html(prompt_chips(gen.prompt_pieces), gen.steps, legend=False)
    page_file = tmp_path / "chips.html"
    # the presentation styles last, as the app's page draws them: chips at 1.3rem
    page_file.write_text(f"<html><head>{CHIP_CSS}</head><body style='width:1240px'>{chip_window(chips, 4)}"
                         f"{PRESENTATION_CSS}</body></html>")
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    try:
        page = context.new_page()
        page.goto(page_file.as_uri())
        shown = page.evaluate("""() => {
          const w = document.querySelector('.tbt-chip-window'), r = w.getBoundingClientRect();
          const cs = [...w.querySelectorAll('.tbt-chip')].map(c => c.getBoundingClientRect());
          const inside = cs.filter(c => c.top >= r.top - 0.5 && c.bottom <= r.bottom + 0.5).map(c => c.top);
          const tops = [...inside].sort((a, b) => a - b).filter((t, i, all) => i === 0 || t - all[i - 1] > 8);
          return {cut: cs.filter(c => c.bottom > r.top + 0.5 && c.top < r.top - 0.5).length, rows: tops.length};
        }""")
    finally:
        context.close()
    assert shown == {"cut": 0, "rows": 4}


@contextmanager
def projector_page(browser, url: str, scheme: str = "light") -> Iterator:
    """A tab at the projector's 1280x720 (its own visitor) opened on `url`, closed afterwards."""
    width, height = SIZES[0]
    context = browser.new_context(viewport={"width": width, "height": height}, color_scheme=scheme)
    try:
        page = context.new_page()
        page.goto(url)
        yield page
    finally:
        context.close()


def boxes_overlap(a: dict, b: dict) -> bool:
    return (a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"]
            and a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"])


def test_the_projected_screen_keeps_its_corner_clear_rings_no_whole_screen_and_darkens_its_cells(browser, app_url):
    """The Pages / Exit bar covers nothing at the top of the screen; a click on an empty spot
    then a remote's key does not ring the whole projected screen; in dark mode the lens's
    cells are dark boxes, not light ones."""
    width, height = SIZES[0]
    with projector_page(browser, f"{app_url}/lesson", "dark") as page:
        page.get_by_role("heading", name="Prompt → tokens").wait_for(timeout=SLOW)
        settle(page)
        presentation_on(page)
        stage = page.get_by_role("heading", name=re.compile(r"^Stage 1 of"))
        bar = page.locator(".st-key-app_presentation_bar").bounding_box()
        assert not boxes_overlap(bar, stage.bounding_box()), (bar, stage.bounding_box())
        assert bar["y"] + bar["height"] <= stage.bounding_box()["y"]

        page.mouse.click(width * 0.75, height - 40)  # an empty spot, as a teacher's stray click
        assert page.evaluate("document.activeElement.tagName") == "MAIN"  # the click focused the page itself
        for number in (2, 3):
            page.keyboard.press("PageDown")
            page.get_by_role("heading", name=re.compile(f"^Stage {number} of")).wait_for(timeout=SLOW)
            settle(page)
        ring = page.evaluate("""(() => { const main = document.querySelector('main');
            const before = getComputedStyle(main, '::before');
            const shadow = before.display === 'none' ? 'none' : before.boxShadow;
            return [getComputedStyle(main).outlineStyle, shadow]; })()""")
        assert ring == ["none", "none"], f"the whole projected screen has a focus ring: {ring}"

        page.locator(".tbt-lens-cell").first.wait_for(timeout=SLOW)
        plain_cell = page.locator(".tbt-lens-cell:not(.tbt-lens-pick)").first
        background = plain_cell.evaluate("e => getComputedStyle(e).backgroundColor")
        channels = [int(c) for c in re.findall(r"\d+", background)[:3]]
        assert max(channels) < 80, f"a light lens cell on the dark page: {background}"
        page.mouse.move(width - 5, height - 5)
        page.screenshot(path=str(ARTIFACTS / "presentation_lesson_lens_dark.png"))


def test_the_newest_chip_keeps_its_whole_ring_when_it_starts_a_line(browser, app_url):
    with projector_page(browser, app_url) as page:
        page.wait_for_function(f"{STEPS} === 0", timeout=SLOW)
        presentation_on(page)
        page.get_by_text("Prompt and settings").click()
        page.get_by_label("Prompt", exact=True).fill("A list of fruit:\n")  # the first new token starts a line
        page.get_by_label("Prompt", exact=True).press("Control+Enter")
        settle(page)
        page.evaluate("document.activeElement.blur()")
        press_and_wait(page, "PageDown", 1)
        window, newest = (page.locator(s).first.bounding_box() for s in (".tbt-chip-window", ".tbt-newest"))
        ring = 4  # the outline's 3 px and its 1 px offset
        assert newest["x"] - ring >= window["x"], (newest, window)  # not cut at the window's left edge


def test_the_lessons_remote_goes_back_a_token_and_plays_the_prediction_rounds_on_one_screen(browser, app_url):
    """PageUp from a later token's first screen returns to the token before's screens; in the
    prediction exercise the remote reveals, then starts the next round, whose button a 720-pixel
    screen shows without scrolling."""
    width, height = SIZES[0]
    with projector_page(browser, f"{app_url}/lesson") as page:
        page.get_by_role("heading", name="Prompt → tokens").wait_for(timeout=SLOW)
        settle(page)
        presentation_on(page)
        total = len(STAGES)
        for number in range(2, total + 2):  # token 1's screens, then token 2's first
            page.keyboard.press("PageDown")
            expected = number if number <= total else 2
            page.get_by_role("heading", name=re.compile(f"^Stage {expected} of {total}")).wait_for(timeout=SLOW)
            settle(page)
        page.get_by_role("heading", name=re.compile(f"^Stage 2 of {total}.*token 2$")).wait_for(timeout=SLOW)
        page.keyboard.press("PageUp")
        page.get_by_role("heading", name=re.compile(f"^Stage {total} of {total}.*token 1$")).wait_for(timeout=SLOW)
        settle(page)

        page.get_by_text("Predict the next token").click()
        choices = page.get_by_role("radiogroup", name="Your prediction for the next token")
        choices.wait_for(timeout=SLOW)
        settle(page)
        choices.locator("label").first.click()
        settle(page)
        page.mouse.click(width - 20, height - 20)
        page.keyboard.press("PageDown")  # the remote's "next": reveal
        next_round = page.get_by_role("button", name=re.compile("Next round"))
        next_round.wait_for(timeout=SLOW)
        settle(page)
        page.mouse.move(width - 5, height - 5)
        page.screenshot(path=str(ARTIFACTS / f"presentation_lesson_predict_{width}x{height}.png"))
        box = next_round.bounding_box()
        assert box["y"] + box["height"] <= height, f"Next round is below the screen: {box}"
        page.keyboard.press("PageDown")  # and again: the next round
        page.get_by_role("button", name="Reveal the model's distribution").wait_for(timeout=SLOW)
        assert not choices.locator("input").first.is_disabled()
