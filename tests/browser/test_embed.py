"""The app inside a course page: a plain HTML page, served from this machine, holds it in an
850x450 iframe with Streamlit's embed=true, as a course's text holds a small app beside it. The
Step page's working part (the prompt, Step / Back / Reset, the context chips and the candidates
with the pick) fits the frame without scrolling, in light and dark; a link opens the Lesson at a
given preset and stage."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.browser.conftest import ARTIFACTS

pytestmark = pytest.mark.browser
SLOW = 240_000
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
        outside = [name for name, locator in parts.items() if not inside_frame(frame, locator.first)]
        assert outside == [], f"not in the 850x450 frame without scrolling: {outside}"
        assert frame.locator(".tbt-newest").inner_text() == "."  # "The capital of France is Paris."
        page.screenshot(path=str(ARTIFACTS / f"embed_step_{scheme}.png"))
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
