"""Presentation mode (the sidebar toggle), shared by every page: one screen for a projector.

- Type follows the viewport: the root font is set from the window's height (and width), and
  everything sized in rem follows it, so a 1280x720 projector and a 1920x1080 one show the same
  screen in the same proportions (24 px type at 1080p).
- The sidebar is hidden by CSS, whenever the mode is turned on: Streamlit's
  `initial_sidebar_state` applies only at a page's first load. An "Exit presentation" button in
  the top right corner turns the mode off again and brings the sidebar back.
- A presenter remote drives the page's buttons: it sends PageDown / PageUp (some send → / ←,
  and "." from the blank-screen button). `presenter_keys` maps keys to buttons with one small
  key handler. (Streamlit's own `st.button(shortcut=...)` takes one key per button, cannot use
  ".", and a focused slider would both move and step on PageDown: it does not fit here.)
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import streamlit as st

from ui.session.keys import APP
from ui.views.format import esc
from ui.widgets.frame import app_pages

# The root font follows the viewport (rem-sized things follow it): 24 px at 1920x1080, 16 px at
# 1280x720; the width term keeps a tall, narrow window from getting type too wide for it.
# The Pages / Exit bar stays in the top right corner, in a strip the page's top padding keeps
# free, so it never covers a heading or a notice.
PRESENTATION_CSS = """<style>
html{font-size:clamp(16px,min(2.25vh,1.3vw),40px)}
[data-testid="stSidebar"],[data-testid="stSidebarCollapsedControl"],[data-testid="stExpandSidebarButton"],
header[data-testid="stHeader"],[data-testid="stElementContainer"]:has(.tbt-keys){display:none}
[data-testid="stMainBlockContainer"]{padding:1.5rem 1.2rem 3rem 1.2rem;max-width:none}
.st-key-app_presentation_bar{position:fixed;top:.25rem;right:.6rem;z-index:999990;width:auto}
.st-key-app_presentation_bar button{min-height:2rem;padding:.1rem .6rem}
[data-testid="stButton"] button p,[data-testid="stWidgetLabel"] p,[data-testid="stMetricLabel"] p,
[data-testid="stTable"] table{font-size:1.05rem}
.tbt-chips{font-size:1.3rem}
.tbt-cdf{font-size:.9rem;height:1.9rem;margin:1.4rem 0}.tbt-seg{padding-top:.3rem}.tbt-u{top:-1.3rem}
.tbt-scale{bottom:-1.3rem}
.tbt-key-queue{position:fixed;left:.6rem;bottom:.6rem;z-index:999990;padding:.2rem .6rem;border-radius:6px;
 background:#212529;color:#f8f9fa;font-size:.9rem}
.tbt-key-queue[hidden]{display:none}
</style>"""


@dataclass(frozen=True)
class PresenterKey:
    """A key a presenter remote or a keyboard sends, and how a button's hint names it."""

    event_key: str  # KeyboardEvent.key
    hint: str


PAGE_DOWN, PAGE_UP = PresenterKey("PageDown", "PgDn"), PresenterKey("PageUp", "PgUp")
RIGHT, LEFT = PresenterKey("ArrowRight", "→"), PresenterKey("ArrowLeft", "←")
SPACE, PERIOD = PresenterKey(" ", "Space"), PresenterKey(".", "“.”")
FORWARD = (PAGE_DOWN, RIGHT, SPACE)  # Step, Next
BACKWARD = (PAGE_UP, LEFT)  # Back, Previous
RUN = (PERIOD,)  # Run / Stop (a remote's blank-screen button sends ".")

# Installed once per browser tab; on every key press it reads the map the page drew (none: not
# in presentation mode, nothing happens). Keys typed into a field never act; arrows stay with a
# focused slider, radio or tab, and Space with a focused checkbox or radio. Space on a focused
# button or expander steps, as on a slide deck (Enter still presses it). One press is one action:
# Streamlit merges the clicks that reach a button while a run is under way into one, so presses
# wait in a queue (shown in a corner, read out to a screen reader) and each is clicked only once
# the run the previous one started has ended. A press for a disabled button is dropped, and the
# queue after it, with a word in the corner, so the page does not scroll instead.
KEY_HANDLER = """<script>
(() => {
  if (window.tbtPresenterKeys) return;
  window.tbtPresenterKeys = true;
  const TEXT = "textarea, select, [contenteditable=''], [contenteditable='true'], input:not([type=checkbox])"
    + ":not([type=radio]):not([type=range]):not([type=button]):not([type=submit]):not([type=reset])";
  const USES_ARROWS = "input, [role=slider], [role=radio], [role=radiogroup], [role=tab], [role=tablist], "
    + "[role=listbox], [role=option], [role=combobox], [role=menu], [role=menuitem]";
  const USES_SPACE = "input, [role=checkbox], [role=switch], [role=radio], [role=option]";
  const queue = [];
  let clicking = false;
  const running = () => !!document.querySelector("[data-testid='stStatusWidget']");
  const buttonFor = (target) => document.querySelector(".st-key-" + target + " button");
  const say = (text) => {
    let note = document.getElementById("tbt-key-queue");
    if (!note) {
      note = document.createElement("div");
      note.id = "tbt-key-queue";
      note.className = "tbt-key-queue";
      note.setAttribute("role", "status");
      note.setAttribute("aria-live", "polite");
      document.body.appendChild(note);
    }
    note.textContent = text;
    note.hidden = !text;
  };
  const shown = () => say(queue.length ? queue.length + (queue.length === 1 ? " press waits" : " presses wait")
    + " for the step under way" : "");
  const pump = () => {
    if (clicking || !queue.length || running()) return;
    const button = buttonFor(queue[0]);
    if (!button || button.disabled) {
      const dropped = queue.length;
      queue.length = 0;
      say(dropped === 1 ? "That key does nothing here now" : dropped + " presses dropped: the button is off now");
      setTimeout(() => { if (!queue.length) say(""); }, 2500);
      return;
    }
    queue.shift();
    clicking = true;
    shown();
    button.click();
    // the click's run: wait until it has shown as running and ended (or never showed, for a quick one)
    const since = Date.now();
    let seen = false;
    const watch = setInterval(() => {
      seen = seen || running();
      if ((seen && !running()) || Date.now() - since > (seen ? 300000 : 600)) {
        clearInterval(watch);
        clicking = false;
        pump();
      }
    }, 40);
  };
  setInterval(pump, 100);
  window.addEventListener("keydown", (event) => {
    const map = document.querySelector(".tbt-keys");
    if (!map || event.ctrlKey || event.metaKey || event.altKey || event.isComposing) return;
    const keys = JSON.parse(map.dataset.keys);
    const target = keys[event.key];
    if (!target) return;
    const focus = document.activeElement;
    if (focus && (focus.isContentEditable || focus.matches(TEXT))) return;
    if (event.key.startsWith("Arrow") && focus && focus.closest(USES_ARROWS)) return;
    if (event.key === " " && focus && focus.closest(USES_SPACE)) return;
    if (!buttonFor(target)) return;
    // a click on an empty spot focuses the page's scrolling area, and a key then shows its focus
    // ring round the whole projected screen: a remote's key takes the focus off it first (a Tab
    // still rings it, for a keyboard's reader)
    if (focus && focus.matches("main, [data-testid=stMain]")) focus.blur();
    event.preventDefault();
    event.stopPropagation();
    queue.push(target);
    shown();
    pump();
  }, true);
})();
</script>"""


# Inside another page (Streamlit's ?embed=true: a course page's iframe, about 850x450): no sidebar,
# no header and no page title (the course page has its own), little padding and half the gap
# between elements (with the usual gap the Step page's last candidate row falls below 450 px), so a
# page's working part fills the frame (the pages use their one-screen projector layout there, see `embedded`)
EMBED_CSS = """<style>
[data-testid="stSidebar"],[data-testid="stSidebarCollapsedControl"],[data-testid="stExpandSidebarButton"],
header[data-testid="stHeader"]{display:none}
[data-testid="stMainBlockContainer"]{padding:.5rem .8rem 1rem .8rem;max-width:none}
[data-testid="stVerticalBlock"]{gap:.5rem}
[data-testid="stHeading"]:has(h1){display:none}
</style>"""


EMBED_ROWS = 3  # candidates shown in an embed's 450-pixel frame, with the pick and all the others


def embedded() -> bool:
    """Whether the page is shown inside another page (the address has Streamlit's embed=true)."""
    return bool(st.context.is_embedded)


def presenting() -> bool:
    """Whether the page takes its one-screen layout: presentation mode is on, or the page is
    inside another page (an embed's small frame wants the same one screen)."""
    return projecting() or embedded()


def projecting() -> bool:
    """Whether presentation mode (the sidebar toggle) is on: a projector and its remote's keys."""
    return bool(st.session_state.get(APP.presentation))


def leave_presentation() -> None:
    """Turn presentation mode off (the sidebar toggle's value)."""
    st.session_state[APP.presentation] = False


def page_style() -> None:
    """Apply presentation mode (the sidebar toggle) to the page being drawn: viewport-sized type,
    the sidebar hidden, and a button in the top right corner that turns the mode off. Inside
    another page (embed), the sidebar and the header go and the padding shrinks."""
    if not presenting():
        return
    st.html(PRESENTATION_CSS)
    if embedded():  # no way out of the frame's layout, and no room for a bar in its corner
        st.html(EMBED_CSS)
        return
    with st.container(key=APP.presentation_bar, horizontal=True, gap="small"):
        with st.popover("Pages", icon=":material/menu:", help="Go to another page; presentation mode stays on."):
            for page in app_pages():
                st.page_link(page)
        st.button("Exit presentation", key=APP.exit_presentation, icon=":material/close:",
                  on_click=leave_presentation, help="Presentation mode off: the sidebar comes back.")


def key_hints_css(buttons: Mapping[str, Sequence[PresenterKey]]) -> str:
    """A small hint after each button's label naming its keys."""
    hints = "".join(f'.st-key-{key} button::after{{content:"{" · ".join(k.hint for k in keys)}"}}'
                    for key, keys in buttons.items())
    every = ",".join(f".st-key-{key} button::after" for key in buttons)
    return (f"<style>{hints}{every}{{font-size:.7em;opacity:.8;border:1px solid currentColor;border-radius:4px;"
            "padding:0 .3em;margin-left:.5em;white-space:nowrap}</style>")


def presenter_keys(buttons: Mapping[str, Sequence[PresenterKey]]) -> None:
    """In presentation mode, let the keys (a presenter remote's among them) press the page's
    buttons, given by key (ui/session/keys.py), and name the keys on the buttons."""
    if not projecting():  # an embed has the layout, not the remote
        return
    by_key = {k.event_key: button for button, keys in buttons.items() for k in keys}
    st.html(f'<div class="tbt-keys" data-keys="{esc(json.dumps(by_key))}"></div>' + KEY_HANDLER
            + key_hints_css(buttons), unsafe_allow_javascript=True)
