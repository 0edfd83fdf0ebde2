"""A student's page shows each new room version at once: a components-v2 element, drawn inside the
follow fragment, that holds the part of the view every student shares (the context, the text so
far) and whose script long-polls the follow endpoint (ui/server/follow_endpoint.py). The endpoint
answers a new version with that view, which the script puts on the page as the answer lands; then
it sets a trigger value, which reruns the fragment it is drawn in (and only that fragment, as a
click on a button inside it does) for what is the student's own: the guess field, their score.

Where the endpoint cannot be reached (a proxy that does not pass the port, a page on https polling
plain http, a host with one port such as a Space) or is off, the script reruns the fragment every
TICK_MS itself, as the page's old timer did, so no student follows slower than before; it asks the
endpoint again after a back-off that doubles up to a minute, and never spins. The fragment's own
slow timer stays as the last safety net (a page whose script does not run).

The view is HTML the server built from the room (every text in it escaped by ui/views), never
anything a page sent; it is set as the element's content, as st.html would draw it.
"""

from __future__ import annotations

from functools import cache

import streamlit as st

from classroom import ClassHall
from ui.server.follow_endpoint import follow_address
from ui.session.keys import CLASS
from ui.views.format import SR_ONLY_STYLE

MOVED = "moved"  # the trigger's event: the room's version the endpoint reported
TICK_MS = 750  # without the endpoint: a rerun this often (the fragment timer's old interval)

# Streamlit calls the default export again, with the new data, each time the fragment redraws the
# element, and calls the function it returned only when the element goes: one poller per element,
# kept by its parent and told of each version drawn.
JS = """
const pollers = new WeakMap();

// The view of the newest version this page has: from the fragment's run or from the endpoint,
// whichever came with the later version (an answer can land before the run it triggers).
function show(poller, version, view) {
  if (typeof view !== "string" || version <= poller.shown) return;
  poller.shown = version;
  poller.view.innerHTML = view;
  // a screen reader hears the status line (count, newest token) when it changes, not the whole view
  const said = poller.view.querySelector(".tbt-class-status")?.textContent ?? "";
  if (said !== poller.live.textContent) poller.live.textContent = said;
}

function urlOf(data, after) {
  const base = data.base || `${location.protocol}//${location.hostname}:${data.port}`;
  return `${base}${data.path}&after=${after}`;
}

function napped(poller, ms) {
  return new Promise((resolve) => { poller.wake = resolve; poller.timer = setTimeout(resolve, ms); });
}

// No endpoint to ask (off, or failing): rerun the fragment every __TICK__ ms for `ms`, as a timer would.
async function ticking(poller, ms) {
  const until = Date.now() + ms, path = poller.data.path;
  while (!poller.stopped && Date.now() < until && poller.data.path === path) {
    await napped(poller, Math.min(__TICK__, Math.max(0, until - Date.now())));
    if (!poller.stopped && Date.now() <= until + 5) poller.trigger("__MOVED__", -1);
  }
}

// Until the fragment has drawn what the trigger asked for (or `ms`): its run reads the room as it
// is then, so a version that comes meanwhile (the candidates, just after a reveal) needs no rerun of its own.
function landed(poller, ms) {
  return new Promise((resolve) => {
    const done = () => { clearTimeout(timer); poller.landed = undefined; resolve(); };
    const timer = setTimeout(done, ms);
    poller.landed = done;
  });
}

async function poll(poller) {
  while (!poller.stopped) {
    if (!poller.data.path) {  // the endpoint is off on this server
      await ticking(poller, 60000);
      continue;
    }
    const after = Math.max(poller.data.version, poller.asked);
    const started = Date.now();
    let pause = 0;
    try {
      poller.abort = new AbortController();
      const response = await fetch(urlOf(poller.data, after), { signal: poller.abort.signal, cache: "no-store" });
      if (!response.ok) throw new Error(`follow endpoint: ${response.status}`);
      const { version, view } = await response.json();
      poller.failures = 0;
      if (Number.isInteger(version) && version > Math.max(poller.data.version, poller.asked)) {
        show(poller, version, view);
        poller.asked = version;
        poller.trigger("__MOVED__", version);
        await landed(poller, 5000);
      } else if (Date.now() - started < 1000) {
        pause = 1000;  // an answer that did not wait: never ask again at once
      }
    } catch (error) {
      if (poller.stopped) return;
      if (error.name === "AbortError") continue;  // moved to a new address: ask it now
      poller.failures += 1;  // 2, 4, 8 ... 60 s, jittered, ticking meanwhile
      await ticking(poller, Math.min(60000, 1000 * 2 ** poller.failures) * (0.5 + Math.random() / 2));
      continue;
    }
    if (pause && !poller.stopped) await napped(poller, pause);
  }
}

export default function (component) {
  const { data, parentElement, setTriggerValue } = component;
  let poller = pollers.get(parentElement);
  if (poller === undefined) {
    const view = document.createElement("div"), live = document.createElement("div");
    view.className = "tbt-follow-view";
    live.setAttribute("role", "status");
    live.style.cssText = "__SR_ONLY__";
    parentElement.replaceChildren(view, live);
    poller = { data, asked: -1, failures: 0, stopped: false, trigger: setTriggerValue, view, live, shown: -1 };
    pollers.set(parentElement, poller);
    show(poller, data.version, data.view);
    poll(poller);
  } else {
    show(poller, data.version, data.view);
    const moved = data.path !== poller.data.path || data.base !== poller.data.base || data.port !== poller.data.port;
    poller.data = data;
    poller.trigger = setTriggerValue;
    if (data.version >= poller.asked) poller.landed?.();
    if (moved) {  // another room or a restarted server: ask the new address now
      poller.failures = 0;
      poller.asked = -1;
      poller.shown = -1;
      show(poller, data.version, data.view);
      poller.abort?.abort();
      clearTimeout(poller.timer);
      poller.wake?.();
    }
  }
  return () => {
    poller.stopped = true;
    poller.landed?.();
    poller.abort?.abort();
    clearTimeout(poller.timer);
    poller.wake?.();
    pollers.delete(parentElement);
  };
}
""".replace("__MOVED__", MOVED).replace("__TICK__", str(TICK_MS)).replace("__SR_ONLY__", SR_ONLY_STYLE)


@cache
def _signal():
    # not isolated: the view is styled as st.html's panels are, by the page's and its own CSS
    return st.components.v2.component("tbt_follow_view", js=JS, isolate_styles=False)


def follow_view(hall: ClassHall, code: str, version: int, view: str) -> None:
    """Draw `view` (HTML of room `code` at `version`) in the element that shows each later version
    the moment the endpoint tells it, and then reruns the enclosing fragment (every TICK_MS when
    the follow endpoint is off)."""
    address = follow_address(hall, code)
    where = {"base": "", "port": 0, "path": ""} if address is None else \
        {"base": address.base, "port": address.port, "path": address.path}
    _signal()(key=CLASS.follow_view, data={**where, "version": version, "view": view})
