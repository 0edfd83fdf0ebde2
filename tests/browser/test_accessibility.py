"""Every page, light and dark, in a realistic state (a few Steps taken, a Lesson stage or two, a
round of Breaking the chain, the KV page measured): axe-core finds no serious or critical
violation, and every piece of chart text is readable against what is really behind it in the
rendered SVG (the plot area, the paper, the page). A screenshot per page and theme goes to
test-artifacts/accessibility/ for a person to look at, with axe's full findings beside it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest
from axe_playwright_python.sync_playwright import Axe

from tests.browser.axe_audit import BLOCKING
from tests.browser.conftest import ARTIFACTS, app_tab
from tests.browser.runs import SLOW, settle
from tests.browser.test_determinism_browser import run_experiment
from tests.browser.test_teaching_pages import click_to_heading, open_page
from tests.contrast import contrast

pytestmark = pytest.mark.browser
SHOTS = ARTIFACTS / "accessibility"
THEMES = ("light", "dark")
STEPS = "Number(document.querySelector('.tbt-chips')?.dataset.steps ?? -1)"

# Every text element of every Plotly chart: its colour, and the colour behind its centre made
# from the layers Plotly draws (page, paper, plot area, the shapes under the text, the legend box)
CHART_TEXT = """() => {
  const rgba = c => { const m = c && c.match(/rgba?\\(([^)]+)\\)/); if (!m) return null;
    const p = m[1].split(',').map(Number); return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; };
  const over = (top, alpha, bottom) => { const a = top[3] * alpha;
    return [0, 1, 2].map(i => top[i] * a + bottom[i] * (1 - a)).concat([1]); };
  const backdrop = el => { for (let n = el; n; n = n.parentElement) {
      const c = rgba(getComputedStyle(n).backgroundColor); if (c && c[3] > 0) return c; }
    return [255, 255, 255, 1]; };
  const inside = (el, x, y) => { const b = el.getBoundingClientRect();
    return b.width > 0 && x >= b.left && x <= b.right && y >= b.top && y <= b.bottom; };
  const paint = (el, base) => { const s = getComputedStyle(el), c = rgba(s.fill);
    return c ? over(c, Number(s.fillOpacity) * Number(s.opacity), base) : base; };
  const out = [];
  for (const plot of document.querySelectorAll('.js-plotly-plot')) {
    const svg = plot.querySelector('svg.main-svg');
    const page = backdrop(plot);
    const paper = rgba(getComputedStyle(svg).backgroundColor);
    const base = paper ? over(paper, 1, page) : page;
    for (const t of plot.querySelectorAll('text')) {
      const text = t.textContent.trim(); const b = t.getBoundingClientRect();
      if (!text || !b.width) continue;
      const x = b.left + b.width / 2, y = b.top + b.height / 2;
      let bg = base;
      for (const r of plot.querySelectorAll('.bglayer rect.bg')) if (inside(r, x, y)) bg = paint(r, bg);
      for (const s of plot.querySelectorAll('.layer-below .shapelayer path')) if (inside(s, x, y)) bg = paint(s, bg);
      const legend = t.closest('.legend'); if (legend) bg = paint(legend.querySelector('rect.bg'), bg);
      const s = getComputedStyle(t);
      out.push({text, fg: over(rgba(s.fill), Number(s.fillOpacity) * Number(s.opacity), bg), bg,
                size: parseFloat(s.fontSize), weight: s.fontWeight});
    }
  }
  return out;
}"""


def test_contrast_follows_wcag_on_known_pairs() -> None:
    assert contrast([0, 0, 0], [255, 255, 255]) == pytest.approx(21)
    assert contrast("#767676", "#ffffff") == pytest.approx(4.54, abs=0.01)  # WCAG's AA grey


def unreadable_chart_text(page) -> list[str]:
    """Chart text under WCAG AA: 4.5:1, or 3:1 for large text (24 px, or 18.67 px bold)."""
    failures = []
    for item in page.evaluate(CHART_TEXT):
        large = item["size"] >= 24 or (item["size"] >= 18.66 and int(item["weight"]) >= 700)
        ratio = contrast(item["fg"], item["bg"])
        if ratio < (3.0 if large else 4.5):
            failures.append(f"{item['text']!r}: {ratio:.2f}:1 ({item['fg'][:3]} on {item['bg'][:3]})")
    return failures


def step_through(page) -> None:
    open_page(page, "Step through")
    page.get_by_role("button", name="Step", exact=True).wait_for(timeout=SLOW)
    for count in (1, 2, 3):
        page.get_by_role("button", name="Step", exact=True).click()
        page.wait_for_function(f"{STEPS} === {count}", timeout=SLOW)
    settle(page)


def lesson(page) -> None:
    open_page(page, "Lesson")
    page.get_by_role("heading", name="Prompt → tokens").wait_for(timeout=SLOW)
    settle(page)
    click_to_heading(page, "Next ▶", "Forward pass → logits")
    click_to_heading(page, "Next ▶", "Inside the pass → each layer's guess")
    click_to_heading(page, "Next ▶", "Softmax → probabilities")


def breaking_the_chain(page) -> None:
    open_page(page, "Breaking the chain")
    page.get_by_role("button", name="Step").wait_for(timeout=SLOW)
    settle(page)
    for _ in range(5):  # the copying preset: guesses start after the first rounds
        page.get_by_role("button", name="Step", exact=True).click()
        settle(page)
    page.get_by_role("heading", name=re.compile(r"Round 5:")).wait_for(timeout=SLOW)


def sampler_lab(page) -> None:
    open_page(page, "Sampler lab")
    page.get_by_text("Three samplers on the same logits").wait_for(timeout=SLOW)
    settle(page)


def kv_speed(page) -> None:
    open_page(page, "KV cache & speed")
    page.get_by_role("heading", name=re.compile("Batching")).wait_for(timeout=SLOW)
    page.get_by_text(re.compile(r"ms per token.* at batch 1")).wait_for(timeout=SLOW)
    settle(page)


def determinism(page) -> None:
    open_page(page, "Same prompt, different answers")
    run_experiment(page)


PAGES: dict[str, Callable] = {"step_through": step_through, "lesson": lesson,
                              "breaking_the_chain": breaking_the_chain, "sampler_lab": sampler_lab,
                              "kv_speed": kv_speed, "determinism": determinism}


@pytest.fixture(scope="module", params=THEMES)
def themed_tab(request, browser, app_url):
    """One tab a theme, on the app with the system set to light or dark (Streamlit follows it): a
    visitor going from page to page through the sidebar, each page in its own state."""
    tab = app_tab(browser, app_url, viewport={"width": 1280, "height": 900}, color_scheme=request.param)
    yield request.param, tab
    tab.context.close()


@pytest.fixture()
def themed_page(themed_tab):
    theme, tab = themed_tab
    tab.set_viewport_size({"width": 1280, "height": 900})  # the last page's test made it as tall as its page
    return theme, tab


@pytest.mark.parametrize("name", list(PAGES))
def test_every_page_in_either_theme_passes_axe_and_its_chart_text_is_readable(themed_page, name) -> None:
    theme, page = themed_page
    PAGES[name](page)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.mouse.move(2, 890)  # no tooltip over the screenshot
    # the page scrolls inside Streamlit's main block, not the document: a viewport as tall as it
    height = page.evaluate("document.querySelector('[data-testid=stMain]').scrollHeight")
    page.set_viewport_size({"width": 1280, "height": min(height, 8000)})
    page.wait_for_timeout(500)
    page.screenshot(path=str(SHOTS / f"{name}_{theme}.png"))
    violations = Axe().run(page).response["violations"]
    blocking = [f"{v['id']} ({v['impact']}): {len(v['nodes'])}× e.g. {v['nodes'][0]['html'][:160]}"
                for v in violations if v["impact"] in BLOCKING]
    # headings in order (axe rates a skipped level "moderate")
    blocking += [f"heading-order: {node['html'][:160]}" for v in violations if v["id"] == "heading-order"
                 for node in v["nodes"]]
    unreadable = unreadable_chart_text(page)
    (SHOTS / f"{name}_{theme}_axe.json").write_text(
        json.dumps({"violations": violations, "unreadable_chart_text": unreadable}, indent=1))
    assert not blocking + unreadable, "\n".join(blocking + unreadable)
