"""Step-through latency in a real browser: click Step → new token visible, and slider move →
re-sampled distribution visible in the chart (and, reported beside it, until the decision
table under the chart has caught up too). Median of 20 each, with the default model. Then the
Sampler lab: Sampler A's temperature slider → the side-by-side chart redrawn.

    .venv/bin/python -m bench.ui_bench

Both ends of each interval are taken inside the page (performance.now()): the start when the
click or key press reaches the document, the end one animation frame after the DOM shows the
result, so Python-side polling adds nothing. Results go to bench/results/ui_bench.json.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

from bench.appserver import CHROMIUM_FLAGS, chromium_path, served_app

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
REPEATS = 20
# the targets for the Step-through page; it sets none for the Sampler lab
TARGETS_MS: dict[str, float | None] = {"step": 250.0, "slider": 150.0, "slider_whole_view": 150.0,
                                       "lab_slider": None}
# Start: sampled at temperature 0.5 (so every slider step changes the sampler table), EOS
# ignored and room for every Step.
QUERY = ("?prompt=The+capital+of+France+is&sampler=0.5%2F0%2F1.0%2F0.0%2F1.0%2Ftransformers"
         f"&max={REPEATS + 8}&ignore_eos=1")

# Arms a one-shot timer: starts at the next `event` on the document; for each condition (a JS
# expression) records when it first holds, and resolves one frame after the last one does.
# `snapshot` (a JS expression) is evaluated at arm time into window.__before, for conditions
# of the form "this changed".
ARM = """([event, conditions, snapshot]) => {
  const checks = conditions.map(c => new Function(`try { return Boolean(${c}); } catch (e) { return false; }`));
  window.__before = snapshot ? new Function(`try { return ${snapshot}; } catch (e) { return null; }`)() : null;
  window.__t0 = undefined;
  window.__latency = new Promise(resolve => {
    const seen = conditions.map(() => undefined);
    document.addEventListener(event, () => { window.__t0 = performance.now(); }, {capture: true, once: true});
    const observer = new MutationObserver(() => {
      if (window.__t0 === undefined) return;
      checks.forEach((check, i) => { if (seen[i] === undefined && check()) seen[i] = performance.now(); });
      if (seen.every(t => t !== undefined)) {
        observer.disconnect();
        requestAnimationFrame(() => {
          const painted = performance.now();
          resolve(seen.map((t, i) => (i === seen.length - 1 ? painted : t) - window.__t0));
        });
      }
    });
    observer.observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true});
  });
}"""
FINAL_BARS = "JSON.stringify(document.querySelector('.js-plotly-plot').data[1].x)"
LAB_BARS = "JSON.stringify(document.querySelector('.js-plotly-plot').data.map(trace => trace.x))"
STEPS = "document.querySelector('.tbt-chips').dataset.steps"


def _timed(page, event: str, conditions: list[str], action, snapshot: str | None = None) -> list[float]:
    page.evaluate(ARM, [event, conditions, snapshot])
    action()
    return [float(t) for t in page.evaluate("window.__latency")]


def measure_steps(page) -> list[float]:
    """Click Step; stop the clock when the chip for the new token is on screen."""
    button = page.get_by_role("button", name="Step", exact=True)
    times = []
    for n in range(1, REPEATS + 1):
        times.append(_timed(page, "click", [f"{STEPS} === '{n}'"], button.click)[0])
        page.wait_for_timeout(300)  # let the rest of the fragment settle before the next click
    return times


def measure_slider(page) -> tuple[list[float], list[float]]:
    """Press → on the temperature slider. Two clocks: until the chart shows the re-sampled
    final distribution (its bars changed), and until the whole view has caught up (the
    sampler table below the chart shows the new temperature)."""
    thumb = page.locator("[data-testid='stSlider']").filter(has_text="Temperature").get_by_role("slider")
    thumb.focus()
    chart, view = [], []
    temperature = 0.5
    for _ in range(REPEATS):
        temperature = round(temperature + 0.05, 2)
        label = f"temperature {temperature:g}"
        table = f"[...document.querySelectorAll('.tbt-table td')].some(td => td.textContent === '{label}')"
        bars = f"{FINAL_BARS} !== window.__before"
        chart_ms, view_ms = _timed(page, "keydown", [bars, table], lambda: thumb.press("ArrowRight"), FINAL_BARS)
        chart.append(chart_ms)
        view.append(view_ms)
        page.wait_for_timeout(300)
    return chart, view


def measure_lab_slider(page) -> list[float]:
    """On the Sampler lab, press → on Sampler A's temperature; stop the clock when the
    side-by-side chart (the first on the page) shows the new final distribution."""
    page.get_by_role("link", name="Sampler lab").click()
    page.get_by_text("Three samplers on the same logits").wait_for(timeout=120_000)
    page.wait_for_function("document.querySelector('.js-plotly-plot')?.data !== undefined", timeout=120_000)
    page.wait_for_timeout(2000)  # the sections below the first chart finish drawing
    thumb = page.locator("[data-testid='stSlider']").filter(has_text="temperature").first.get_by_role("slider")
    thumb.focus()
    times = []
    for _ in range(REPEATS):
        times.append(_timed(page, "keydown", [f"{LAB_BARS} !== window.__before"],
                            lambda: thumb.press("ArrowRight"), LAB_BARS)[0])
        page.wait_for_timeout(600)
    return times


def main() -> None:
    from playwright.sync_api import sync_playwright

    chromium = chromium_path() or "/usr/bin/chromium"
    load_before = os.getloadavg()
    # a file watcher over the tree costs CPU the timings should not pay
    with served_app(None, "--server.fileWatcherType", "none") as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(url + QUERY)
        page.wait_for_selector(".tbt-chips", timeout=120_000)
        page.get_by_role("button", name="Step", exact=True).click()  # warm-up: prefill, first chart
        page.wait_for_function(f"{STEPS} === '1'", timeout=60_000)
        page.get_by_role("button", name="Back", exact=True).click()
        page.wait_for_function(f"{STEPS} === '0'", timeout=60_000)
        page.wait_for_timeout(500)
        steps = measure_steps(page)
        chart, view = measure_slider(page)
        lab = measure_lab_slider(page)
        results = {"step": steps, "slider": chart, "slider_whole_view": view, "lab_slider": lab}
        browser.close()
    summary = {name: {"median_ms": round(statistics.median(times), 1), "target_ms": TARGETS_MS[name],
                      "min_ms": round(min(times), 1), "max_ms": round(max(times), 1),
                      "samples_ms": [round(t, 1) for t in times]} for name, times in results.items()}
    for name, row in summary.items():
        target = row["target_ms"]
        verdict = ("no target" if target is None else
                   f"target <= {target:.0f} ms: " + ("ok" if row["median_ms"] <= target else "OVER TARGET"))
        print(f"{name:>17}: median {row['median_ms']:.0f} ms over {REPEATS} (min {row['min_ms']:.0f}, "
              f"max {row['max_ms']:.0f}); {verdict}")
    load = os.getloadavg()
    print(f"load average before/after: {load_before[0]:.2f} / {load[0]:.2f} on {os.cpu_count()} CPUs "
          "(other work on the machine inflates every number)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "ui_bench.json"
    out.write_text(json.dumps({"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "load_average_1min": [load_before[0], load[0]], **summary}, indent=1))
    print(f"written to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
