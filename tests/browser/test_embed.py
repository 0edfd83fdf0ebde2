"""The app inside a course page: a plain HTML page, served from this machine, holds it in an
850x450 iframe with Streamlit's embed=true, as a course's text holds a small app beside it. The
Step page's working part (the prompt, Step / Back / Reset, the context chips and the candidates
with the pick) fits the frame without scrolling, in light and dark; the Sampler lab's one
sampler beside its distribution and the KV page's first chart with its figures do too; axe finds
nothing serious inside the frame; a link opens the Lesson at a given preset and stage."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.browser.axe_audit import serious_violations
from tests.browser.conftest import ARTIFACTS
from tests.browser.runs import SLOW

pytestmark = pytest.mark.browser
FRAME = {"width": 850, "height": 450}
COURSE_PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>A course page</title></head>
<body><h1>Decoding, one token at a time</h1><p>Press Step to see the next token.</p>
<iframe id="app" src="{src}" width="850" height="450" title="Token by Token" style="border:1px solid #999"></iframe>
<p>Text after the app.</p></body></html>"""


@pytest.fixture(scope="module")
def course_site(tmp_path_factory) -> Iterator[tuple[str, object]]:
    """A plain web server for the course's own pages (a folder of HTML files)."""
    folder = tmp_path_factory.mktemp("course")
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(folder))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", folder
    finally:
        server.shutdown()


def course_page(course_site, name: str, src: str) -> str:
    base, folder = course_site
    (folder / name).write_text(COURSE_PAGE.format(src=src))
    return f"{base}/{name}"


def inside_frame(frame, locator) -> bool:
    """Whether the element's box lies wholly inside the frame's 850x450 window (no scrolling)."""
    box = locator.evaluate("e => e.getBoundingClientRect().toJSON()")
    return box["top"] >= 0 and box["left"] >= 0 and box["bottom"] <= FRAME["height"] and (
        box["right"] <= FRAME["width"])


def outside_frame(frame, parts: dict, settle_s: float = 10.0) -> list[str]:
    """The names of the parts not wholly inside the frame once its layout has settled: a part
    drawn a moment after its neighbours (a Plotly chart sizes itself after mounting) moves
    those below it, so ask again until all fit or `settle_s` has passed."""
    deadline = time.monotonic() + settle_s
    while True:
        outside = [name for name, locator in parts.items() if not inside_frame(frame, locator.first)]
        if not outside or time.monotonic() > deadline:
            return outside
        time.sleep(0.25)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_step_pages_working_part_fits_an_850_by_450_frame_in_a_course_page(browser, app_url, course_site,
                                                                              scheme) -> None:
    context = browser.new_context(viewport={"width": 1100, "height": 700}, color_scheme=scheme)
    page = context.new_page()
    try:
        page.goto(course_page(course_site, f"step_{scheme}.html", f"{app_url}/?embed=true"))
        frame = page.frame_locator("#app")
        frame.get_by_role("button", name="Step", exact=True).click(timeout=SLOW)
        frame.locator(".tbt-bars-label.tbt-bars-pick").wait_for(timeout=SLOW)
        frame.get_by_role("button", name="Step", exact=True).click()
        frame.locator(".tbt-chips[data-steps='2']").wait_for(timeout=SLOW)
        page.wait_for_timeout(800)
        app = page.frames[1]
        app.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=SLOW)
        assert app.evaluate("document.querySelector('[data-testid=stSidebar]')?.offsetWidth ?? 0") == 0
        parts = {"prompt": frame.get_by_label("Prompt"), "Step": frame.get_by_role("button", name="Step", exact=True),
                 "Back": frame.get_by_role("button", name="Back", exact=True),
                 "Reset": frame.get_by_role("button", name="Reset", exact=True),
                 "chips": frame.locator(".tbt-chip-window"), "newest chip": frame.locator(".tbt-newest"),
                 "the pick's row": frame.locator(".tbt-bars-label.tbt-bars-pick"),
                 "all the other tokens": frame.locator(".tbt-bars-label", has_text="all other")}
        outside = outside_frame(frame, parts)
        assert outside == [], f"not in the 850x450 frame without scrolling: {outside}"
        assert frame.locator(".tbt-newest").inner_text() == "."  # "The capital of France is Paris."
        page.screenshot(path=str(ARTIFACTS / f"embed_step_{scheme}.png"))
        assert serious_violations(page.frames[1]) == []  # the app's own page, in the frame
        frame.get_by_text("Settings", exact=True).click()  # the rest opens on demand, below
        frame.get_by_label("Seed", exact=True).wait_for(timeout=SLOW)
    finally:
        context.close()


def test_a_link_opens_the_lesson_in_a_frame_at_a_given_preset_and_stage(browser, app_url, course_site) -> None:
    context = browser.new_context(viewport={"width": 1100, "height": 700})
    page = context.new_page()
    try:
        page.goto(course_page(course_site, "lesson.html", f"{app_url}/lesson?embed=true&preset=3&stage=4"))
        frame = page.frame_locator("#app")
        heading = frame.get_by_role("heading", name="Stage 4 of 7: Softmax → probabilities · token 1")
        heading.wait_for(timeout=SLOW)
        assert inside_frame(frame, heading)
        frame.get_by_text("Preset and prompt").click()
        assert frame.get_by_text("Once upon a time", exact=False).first.is_visible()  # the third preset's prompt
        page.screenshot(path=str(ARTIFACTS / "embed_lesson.png"))
    finally:
        context.close()


def test_the_sampler_labs_sliders_and_what_they_do_fit_the_frame(browser, app_url, course_site) -> None:
    """One sampler's controls beside its distribution with the pick: top-k 1 leaves one token,
    the most probable, and the frame shows it without scrolling (dark, as a course page might be)."""
    context = browser.new_context(viewport={"width": 1100, "height": 700}, color_scheme="dark")
    page = context.new_page()
    try:
        page.goto(course_page(course_site, "lab.html", f"{app_url}/sampler_lab?embed=true"))
        frame = page.frame_locator("#app")
        frame.locator(".tbt-bars-label", has_text="all other").wait_for(timeout=SLOW)
        top_k = frame.get_by_label("top-k (0 = off)").first  # the chain orders' own controls follow below
        top_k.fill("1")
        top_k.press("Enter")
        title = frame.locator(".tbt-title", has_text="1 token kept")
        title.wait_for(timeout=SLOW)
        assert "Paris" in title.inner_text()
        parts = {"distribution": frame.get_by_role("combobox").first,
                 **{name: frame.get_by_label(name).first
                    for name in ("temperature", "top-p (1 = off)", "min-p (0 = off)")},
                 "top-k": top_k, "the pick's row": frame.locator(".tbt-bars-label.tbt-bars-pick"),
                 "all the other tokens": frame.locator(".tbt-bars-label", has_text="all other")}
        outside = outside_frame(frame, parts)
        assert outside == [], f"not in the 850x450 frame without scrolling: {outside}"
        assert "Paris" in frame.locator(".tbt-bars-label.tbt-bars-pick").inner_text()
        page.screenshot(path=str(ARTIFACTS / "embed_sampler_lab_dark.png"))
        assert serious_violations(page.frames[1]) == []  # the app's own page, in the frame
        frame.get_by_role("heading", name="Sweeps: one knob at a time").wait_for(timeout=SLOW)  # the rest, below
    finally:
        context.close()


def test_the_kv_pages_first_chart_and_its_figures_fit_the_frame(browser, app_url, course_site) -> None:
    context = browser.new_context(viewport={"width": 1100, "height": 700})
    page = context.new_page()
    try:
        page.goto(course_page(course_site, "kv.html", f"{app_url}/kv_speed?embed=true"))
        frame = page.frame_locator("#app")
        slower = frame.get_by_text("× slower", exact=False).first
        slower.wait_for(timeout=SLOW)
        parts = {"Measure again": frame.get_by_role("button", name="Measure again"),
                 "the cache chart": frame.locator(".js-plotly-plot").first,
                 "with the KV cache": frame.get_by_text("with the KV cache", exact=True), "× slower": slower}
        outside = outside_frame(frame, parts)
        assert outside == [], f"not in the 850x450 frame without scrolling: {outside}"
        page.screenshot(path=str(ARTIFACTS / "embed_kv_speed.png"))
        assert serious_violations(page.frames[1]) == []  # the app's own page, in the frame
        frame.get_by_role("heading", name="2 · Prefill against decode").wait_for(timeout=SLOW)  # the rest, below
    finally:
        context.close()
