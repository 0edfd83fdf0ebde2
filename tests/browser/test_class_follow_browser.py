"""A student's screen hears the presenter's Step from the follow endpoint, not from its timer: in a
real browser the page's long poll answers with the room's new view, which the follow element shows
at once, before it sets its trigger; the browser then asks the server to rerun the follow fragment
alone (its id in the BackMsg, no run of the page)."""

from __future__ import annotations

import re

import pytest
from streamlit.proto.BackMsg_pb2 import BackMsg

from tests.browser.conftest import ARTIFACTS
from tests.browser.runs import SLOW
from tests.browser.test_class_browser import SHOWN, start_class

pytestmark = pytest.mark.browser


def reruns(page) -> list[BackMsg]:
    """Every rerun the page asks the server for, as it sends them."""
    sent: list[BackMsg] = []

    def on_frame(payload) -> None:
        if isinstance(payload, bytes):
            msg = BackMsg()
            msg.ParseFromString(payload)
            if msg.WhichOneof("type") == "rerun_script":
                sent.append(msg)

    page.on("websocket", lambda socket: socket.on("framesent", on_frame))
    return sent


# In the page: when the status first shows `steps`, and when the page first sends the follow
# element's trigger (a BackMsg carrying its "moved" event), on the page's own clock.
WATCH = """steps => {
  window.tbtShownAt = null; window.tbtTriggeredAt = null;
  const send = WebSocket.prototype.send;
  WebSocket.prototype.send = function (data) {
    const binary = data instanceof ArrayBuffer || ArrayBuffer.isView(data);
    if (window.tbtTriggeredAt === null && binary && new TextDecoder().decode(data).includes('"event":"moved"'))
      window.tbtTriggeredAt = performance.now();
    return send.call(this, data);
  };
  new MutationObserver(() => {
    if (window.tbtShownAt === null && Number(document.querySelector('.tbt-class-status')?.dataset.steps) === steps)
      window.tbtShownAt = performance.now();
  }).observe(document.body, { subtree: true, childList: true, attributes: true });
}"""


def test_a_presenters_step_shows_from_the_endpoint_then_reruns_only_the_follow_fragment(browser, app_url):
    teacher = browser.new_context(viewport={"width": 1280, "height": 900})
    presenter = teacher.new_page()
    code = start_class(presenter, app_url)

    student = browser.new_context(viewport={"width": 390, "height": 844}).new_page()
    sent = reruns(student)
    polls = []
    student.on("request", lambda request: polls.append(request.url) if "/version?" in request.url else None)
    student.goto(f"{app_url}/class?room={code}")
    student.wait_for_function(f"{SHOWN} === 0", timeout=SLOW)
    view = student.locator(".st-key-cls_follow_view")
    view.wait_for(state="attached", timeout=10_000)
    assert view.locator(".tbt-class-status").count() == 1  # the element holds the shared view
    presenter.get_by_role("button", name="Step").wait_for(timeout=SLOW)
    student.wait_for_timeout(500)  # the poll is held now
    assert polls and all(f"/rooms/{code}/version?token=" in url for url in polls)
    before = len(sent)
    student.evaluate(WATCH, 1)

    presenter.get_by_role("button", name="Step").click()
    student.wait_for_function(f"{SHOWN} === 1", timeout=10_000)
    student.wait_for_function("window.tbtTriggeredAt !== null", timeout=10_000)
    shown_at, triggered_at = student.evaluate("[window.tbtShownAt, window.tbtTriggeredAt]")
    assert shown_at is not None and shown_at <= triggered_at  # on screen from the answer, before any rerun
    said = view.get_by_role("status").text_content()  # what a screen reader announces of the step
    assert said.startswith("1 token generated") and "The newest token: '" in said
    triggered = [msg.rerun_script for msg in sent[before:] if any(
        widget.json_trigger_value for widget in msg.rerun_script.widget_states.widgets)]
    assert triggered, "the step reached the page by its timer, not by the endpoint"
    first = triggered[0]
    assert first.fragment_id and not first.is_auto_rerun  # the fragment alone, asked for by the trigger
    [widget] = [w for w in first.widget_states.widgets if w.json_trigger_value]
    assert re.fullmatch(r'\[\{"event":"moved","value":\d+\}\]', widget.json_trigger_value)
    assert all(msg.rerun_script.fragment_id for msg in sent[before:])  # no run of the whole page
    student.get_by_text(re.compile("revealed: the model wrote")).wait_for(timeout=10_000)  # the rerun's part
    student.screenshot(path=str(ARTIFACTS / "class_follow_student.png"), full_page=True)
