"""Waiting for the app's own runs in a real browser, instead of for fixed times.

Streamlit's page carries its run's state on `[data-testid=stApp]` (`data-test-script-state`:
`running`, then `notRunning`), for a fragment's run as for the whole page's. Every tab the
browser tests open watches that attribute and the visitor's last action (a click, a key, a typed
value), so `settle` returns as soon as the run an action started is over, and waits no longer
than `QUIET_MS` after an action that starts none.
"""

from __future__ import annotations

SLOW = 240_000  # ms: a first visit measures or runs the model on 2 CPU cores
QUIET_MS = 400  # an action followed by no run for this long started none
TAIL_MS = 150  # the page draws what the run's last messages carried
# Resolves once the browser has drawn twice: a resized window or a switched colour scheme laid out
TWO_FRAMES = "new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))"

# Installed before any of the page's own scripts (BrowserContext.add_init_script), in every frame
WATCH_RUNS = """(() => {
  if (window.__tbtRuns) return;
  const runs = window.__tbtRuns = {acted: 0, changed: 0, ended: 0};
  const now = () => performance.now();
  new MutationObserver(records => {
    for (const record of records) {
      runs.changed = now();
      if (record.oldValue === 'running') runs.ended = runs.changed;
    }
  }).observe(document, {subtree: true, attributes: true, attributeOldValue: true,
                        attributeFilter: ['data-test-script-state']});
  for (const type of ['pointerdown', 'keydown', 'input', 'change'])
    addEventListener(type, () => { runs.acted = now(); }, true);
})()"""

SETTLED = """(quietMs) => {
  const runs = window.__tbtRuns, app = document.querySelector("[data-testid='stApp']");
  if (!app || app.dataset.testScriptState !== 'notRunning') return false;
  return runs.ended > runs.acted || performance.now() - Math.max(runs.acted, runs.changed) > quietMs;
}"""


class WatchingBrowser:
    """A Playwright browser whose every new context watches the app's runs (`WATCH_RUNS`)."""

    def __init__(self, browser) -> None:
        self._browser = browser

    def new_context(self, **options):
        context = self._browser.new_context(**options)
        context.add_init_script(WATCH_RUNS)
        return context

    def __getattr__(self, name: str):
        return getattr(self._browser, name)


def settle(page, tail_ms: int = TAIL_MS) -> None:
    """Wait until the run the last action started is over and its page drawn (or, after an action
    that started no run, until `QUIET_MS` has passed without one)."""
    if not page.evaluate("Boolean(window.__tbtRuns)"):  # a tab opened without the watch
        page.wait_for_timeout(QUIET_MS)
        page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=SLOW)
    else:
        page.wait_for_function(SETTLED, arg=QUIET_MS, timeout=SLOW)
    page.wait_for_timeout(tail_ms)
