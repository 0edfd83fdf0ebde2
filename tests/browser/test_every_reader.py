"""The Step page for readers who do not use a mouse on a laptop: a keyboard alone walks a Step (the
branch pills and the presenter's keys included), with the focus always visible and never trapped;
a screen reader hears each new token from a live region and reads the chart in words; a phone
(390 x 844) shows the page with no sideways scroll, Step on the first screen, the chips wrapped
and the chart inside the screen; a switch to dark while the page is open recolours it. Screenshots
go to test-artifacts/ for a person to look at."""

from __future__ import annotations

import re

import pytest

from tests.browser.conftest import ARTIFACTS
from tests.browser.runs import SLOW, settle
from tests.browser.test_accessibility import unreadable_chart_text
from tests.contrast import rgb
from ui.views.theme import PAGE_COLOURS

pytestmark = pytest.mark.browser
STEPS = "Number(document.querySelector('.tbt-chips')?.dataset.steps ?? -1)"
PHONE = {"width": 390, "height": 844}

# Where the keyboard's focus is, and whether the focus showed on the element it just left: that
# element (or the few boxes around it, where Streamlit draws a field's ring on its frame) looked
# different focused than it does now. Judged once the focus has moved on, so nothing is blurred
# by hand (a blur would commit a field, and a script's focus() is not a keyboard's).
FOCUS = """() => {
  const chainOf = el => [el, el.parentElement, el.parentElement?.parentElement, el.closest('label')].filter(Boolean);
  const look = chain => chain.map(n => { const s = getComputedStyle(n);
    return [s.outlineStyle, s.outlineWidth, s.outlineColor, s.boxShadow, s.borderColor].join('|'); });
  const before = window.tbtFocus;
  const left = before && before.chain[0].isConnected && before.chain[0] !== document.activeElement
    ? {name: before.name, key: before.key, shown: look(before.chain).some((v, i) => v !== before.look[i])} : null;
  const el = document.activeElement;
  const key = (el.closest('[class*="st-key-"]')?.className.match(/st-key-[\\w-]+/) || [''])[0];
  const name = (el.getAttribute('aria-label') || el.innerText || el.value || el.tagName).trim().slice(0, 40);
  const chain = chainOf(el);
  window.tbtFocus = el === document.body ? null : {chain, look: look(chain), name, key};
  return {name: el === document.body ? 'BODY' : name, key, body: el === document.body, left};
}"""


def tab_to(page, found, limit: int = 60, key: str = "Tab") -> list[dict]:
    """Press Tab (or `key`) until `found(focus)` holds; every stop on the way, in order."""
    stops = []
    for _ in range(limit):
        page.keyboard.press(key)
        focus = page.evaluate(FOCUS)
        stops.append(focus)
        if found(focus):
            return stops
    raise AssertionError(f"not reached in {limit} presses: {[s['name'] for s in stops]}")


def hidden_focus(stops: list[dict]) -> list[str]:
    """The stops whose focus did not show (each judged when the next key moved the focus on)."""
    return [f"{s['left']['name']} ({s['left']['key']})" for s in stops if s["left"] and not s["left"]["shown"]]


def accessible_names(page, role: str) -> list[str]:
    """Chromium's own accessibility tree: the names it gives every node of `role`."""
    tree = page.context.new_cdp_session(page).send("Accessibility.getFullAXTree")["nodes"]
    return [n.get("name", {}).get("value", "") for n in tree if n.get("role", {}).get("value") == role]


def test_a_keyboard_alone_steps_branches_and_presents_with_the_focus_always_shown(browser, app_url) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    try:
        page.goto(app_url)
        page.wait_for_function(f"{STEPS} === 0", timeout=SLOW)
        settle(page)

        # from the top of the page to Step, through the sidebar and the settings: every stop ringed
        stops = tab_to(page, lambda f: f["key"] == "st-key-st_step")
        assert hidden_focus(stops) == []
        assert any(s["name"] == "Prompt" for s in stops)  # the settings come before the buttons
        page.keyboard.press("Enter")
        page.wait_for_function(f"{STEPS} === 1", timeout=SLOW)
        settle(page)
        assert page.evaluate(FOCUS)["key"] == "st-key-st_step"  # the focus stays on Step after its rerun
        page.keyboard.press("Space")
        page.wait_for_function(f"{STEPS} === 2", timeout=SLOW)
        settle(page)

        # on to the branch pills: the pick's pill takes the Tab, the arrows move along the row
        stops = tab_to(page, lambda f: f["key"].startswith("st-key-st_force_"))
        assert [s["name"] for s in stops[:3]] == ["Run", "Back", "Reset"]
        page.keyboard.press("ArrowRight")
        other = page.evaluate(FOCUS)
        assert other["key"].startswith("st-key-st_force_") and other["left"]["shown"]  # the pick's pill showed
        page.keyboard.press("ArrowRight")
        assert page.evaluate(FOCUS)["left"]["shown"]  # and so did the next
        page.keyboard.press("ArrowLeft")
        page.evaluate(FOCUS)
        page.keyboard.press("Enter")  # force that token: a branch
        page.locator(".tbt-forced").first.wait_for(timeout=SLOW)
        settle(page)
        assert page.evaluate(STEPS) == 2

        # no trap: Tab goes on through the sampler controls and round to the page's start
        stops = tab_to(page, lambda f: f.get("body") or f["name"] == "Skip to main content", limit=80)
        assert hidden_focus(stops) == []
        assert any(s["key"] == "st-key-st_temperature" for s in stops)
        page.keyboard.press("Shift+Tab")  # and back again
        assert page.evaluate(FOCUS)["name"] != "Skip to main content"

        # presentation mode from the keyboard: its keys step and go back, the buttons name their keys
        page.get_by_role("switch", name="Presentation mode").focus()
        page.keyboard.press("Space")
        page.get_by_role("button", name=re.compile("Exit presentation")).wait_for(timeout=SLOW)
        settle(page)
        page.evaluate("document.activeElement.blur()")
        page.keyboard.press("PageDown")
        page.wait_for_function(f"{STEPS} === 3", timeout=SLOW)
        settle(page)
        page.keyboard.press("PageUp")
        page.wait_for_function(f"{STEPS} === 2", timeout=SLOW)
        settle(page)
        buttons = accessible_names(page, "button")
        assert any(name.startswith("Step") and "PgDn" in name for name in buttons), buttons
        assert any(name.startswith("Back") and "PgUp" in name for name in buttons), buttons
        stops = tab_to(page, lambda f: "Exit presentation" in f["name"])
        assert hidden_focus(stops) == []
        page.keyboard.press("Enter")
        page.get_by_test_id("stSidebar").wait_for(state="visible", timeout=SLOW)
        assert page.evaluate(STEPS) == 2
    finally:
        context.close()


def test_a_screen_reader_hears_each_new_token_and_reads_the_chart_in_words(page) -> None:
    live = page.locator("[role=status][aria-live=polite]")
    live.wait_for(state="attached", timeout=SLOW)
    assert live.inner_text().startswith("No token generated yet")
    page.evaluate("window.tbtLive = document.querySelector('[role=status][aria-live=polite]')")
    for count in (1, 2):
        page.get_by_role("button", name="Step", exact=True).click()
        page.wait_for_function(f"{STEPS} === {count}", timeout=SLOW)
        page.wait_for_function(f"window.tbtLive.textContent.startsWith('Step {count}:')", timeout=SLOW)
    # the same element throughout: a live region announces changes to itself, not a new one
    assert page.evaluate("window.tbtLive.isConnected && document.querySelectorAll('[aria-live]').length === 1")
    assert re.match(r"Step 2: '.+', raw p [\d.]+%, final p [\d.]+%\. 2 tokens generated\.", live.inner_text())
    box = live.bounding_box()
    assert box is None or box["width"] <= 1  # not seen, only heard
    words = page.locator(".tbt-sr", has_text="Chart of the next-token distribution").first.text_content()
    pick = page.locator(".tbt-newest").first.inner_text()
    assert f"The pick is '{pick}'." in words and "raw" in words and "final" in words
    assert page.get_by_role("heading", name="Next-token distribution at step 2", exact=True).evaluate(
        "h => h.tagName") == "H3"


def test_a_switch_to_dark_recolours_the_pages_own_text_at_once_and_the_chart_at_the_next_step(page) -> None:
    """The system (or Streamlit's menu) turns dark while the page is open, as a projector's laptop
    may at dusk: the page's own text takes the dark theme's colours at once, without a run; the
    chart, drawn by the script, takes them at the next Step."""
    page.get_by_role("button", name="Step", exact=True).click()
    page.wait_for_function(f"{STEPS} === 1", timeout=SLOW)
    settle(page)
    caption = page.get_by_test_id("stCaptionContainer").locator("p").first
    assert caption.evaluate("e => getComputedStyle(e).color") == css_rgb(PAGE_COLOURS["light"]["muted"])
    page.emulate_media(color_scheme="dark")
    page.wait_for_function("([e, colour]) => getComputedStyle(e).color === colour",  # no run comes between
                           arg=[caption.element_handle(), css_rgb(PAGE_COLOURS["dark"]["muted"])], timeout=10_000)
    page.get_by_role("button", name="Step", exact=True).click()
    page.wait_for_function(f"{STEPS} === 2", timeout=SLOW)
    settle(page)
    assert not unreadable_chart_text(page)


def css_rgb(hex_colour: str) -> str:
    """'#5f5b57' as a computed style says it: 'rgb(95, 91, 87)'."""
    return "rgb({}, {}, {})".format(*rgb(hex_colour))


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_on_a_phone_the_step_page_fits_its_width_and_step_is_on_the_first_screen(browser, app_url, theme) -> None:
    context = browser.new_context(viewport=PHONE, color_scheme=theme, is_mobile=True, has_touch=True)
    page = context.new_page()
    try:
        page.goto(app_url)
        page.wait_for_function(f"{STEPS} === 0", timeout=SLOW)
        settle(page)
        step = page.get_by_role("button", name="Step", exact=True)
        box = step.bounding_box()
        assert box["y"] + box["height"] <= PHONE["height"], box  # no scrolling to find it
        for count in (1, 2, 3, 4):
            step.tap()
            page.wait_for_function(f"{STEPS} === {count}", timeout=SLOW)
        settle(page)
        page.screenshot(path=str(ARTIFACTS / f"phone_step_{theme}_top.png"))
        widths = page.evaluate("""() => { const main = document.querySelector('[data-testid=stMain]');
          return {page: document.scrollingElement.scrollWidth, inner: innerWidth,
                  main: main.scrollWidth, mainBox: main.clientWidth}; }""")
        assert widths["page"] <= widths["inner"] and widths["main"] <= widths["mainBox"], widths
        chips = page.evaluate("""() => { const box = document.querySelector('.tbt-chips').getBoundingClientRect();
          const cs = [...document.querySelectorAll('.tbt-chips .tbt-chip')].map(c => c.getBoundingClientRect());
          return {past: cs.filter(c => c.right > box.right + 0.5).length,
                  rows: new Set(cs.map(c => Math.round(c.top))).size, right: box.right}; }""")
        assert chips["past"] == 0 and chips["rows"] >= 2 and chips["right"] <= PHONE["width"], chips
        chart = page.evaluate("""() => { const plot = document.querySelector('.js-plotly-plot');
          const texts = [...plot.querySelectorAll('.ytick text, .textpoint text, .legendtext')]
            .map(t => ({r: t.getBoundingClientRect(), size: parseFloat(getComputedStyle(t).fontSize)}));
          return {left: Math.min(...texts.map(t => t.r.left)), right: Math.max(...texts.map(t => t.r.right)),
                  smallest: Math.min(...texts.map(t => t.size)), count: texts.length}; }""")
        assert chart["count"] > 10 and chart["left"] >= 0 and chart["right"] <= PHONE["width"], chart
        assert chart["smallest"] >= 11, chart  # readable type, not a shrunken desktop chart
        height = page.evaluate("document.querySelector('[data-testid=stMain]').scrollHeight")
        page.set_viewport_size({"width": PHONE["width"], "height": min(height, 6000)})
        page.wait_for_timeout(600)
        page.screenshot(path=str(ARTIFACTS / f"phone_step_{theme}.png"))
    finally:
        context.close()


def test_the_readme_screenshot_in_dark(browser, app_url) -> None:
    """The dark twin of the README's screenshot (assets/screenshot.png): a few tokens into a story."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, color_scheme="dark")
    page = context.new_page()
    try:
        page.goto(app_url)
        page.wait_for_function(f"{STEPS} === 0", timeout=SLOW)
        prompt = page.locator("[data-testid='stTextArea'] textarea").first
        prompt.fill("Once upon a time, in a small village by the sea,")
        for name, key, presses in (("Temperature", "ArrowRight", 18), ("Top-p", "ArrowLeft", 10)):  # 0.9 and 0.9
            thumb = page.locator("[data-testid='stSlider']").filter(has_text=name).get_by_role("slider")
            thumb.focus()
            for _ in range(presses):
                thumb.press(key)
            settle(page)
        for count in range(1, 6):
            page.get_by_role("button", name="Step", exact=True).click()
            page.wait_for_function(f"{STEPS} === {count}", timeout=SLOW)
        settle(page)
        page.evaluate("""() => { const main = document.querySelector('[data-testid=stMain]');
          const step = [...document.querySelectorAll('.st-key-st_step button')][0];
          main.scrollTop += step.getBoundingClientRect().top - 90; }""")
        page.mouse.move(5, 995)
        page.wait_for_timeout(600)
        page.screenshot(path=str(ARTIFACTS / "readme_step_dark.png"))
        background = page.evaluate("getComputedStyle(document.querySelector('[data-testid=stApp]')).backgroundColor")
        assert background != "rgb(255, 255, 255)"  # the dark theme, as a dark-mode laptop shows it
    finally:
        context.close()
