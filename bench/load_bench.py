"""Load benchmark: N headless visitors click Step on one real server at once.

    .venv/bin/python -m bench.load_bench [--visitors 1,5,10,20,30] [--clicks 32]
                                         [--think 0] [--think 0.5-1.5] [--quick]

For each visitor count N and each think mode, the benchmark starts a fresh `streamlit run
app.py` on a loopback port, warms it up with one visitor (the model loads on the first run),
reads the server's resident memory, then opens N visitors (bench/streamlit_client.py: the
websocket protocol of Streamlit's browser frontend, no rendering). Visitor i opens its own
share link (its own prompt and seed, sampled at temperature 0.8 / top-k 40 / top-p 0.95, EOS
ignored) and clicks Step `--clicks` times: each click as soon as the previous click's run has
finished (think 0), or after a uniform pause in the given range. It prints per configuration:

  p50 / p95 / max click latency: from sending a click's BackMsg to receiving the
      script_finished that ends the fragment run it started (all visitors' clicks pooled);
  tokens/s: the visitors' tokens together, over the click phase's wall time;
  RSS/visitor: the server's resident memory after the clicks minus before the visitors
      connected, over N;
  errors: exception elements, error or warning boxes, failed or timed-out runs, and clicks whose
      run ended without exactly one new token in the share link, over all visitors;
  mismatched: visitors whose tokens differ from a lone run of their link, computed in this
      process with the engine after the servers are gone;
  client CPU: this process's CPU time over the click phase's wall time (the visitors' own cost,
      taken from the cores the server runs on).

Results go to bench/results/load_bench.json. Every loop is bounded in count and time; the
benchmark stops its servers by itself. Figures taken while other work runs on the machine are
inflated: the load average is printed with them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlencode

from websockets.exceptions import WebSocketException

from bench.appserver import served_app_process
from bench.streamlit_client import Visitor, VisitorError

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
STEP_KEY = "st_step"
SAMPLER_CODE = "0.8/40/0.95/0.0/1.0/transformers"  # temperature/top_k/top_p/min_p/repetition_penalty/chain
PROMPTS = (
    "The capital of France is", "Once upon a time", "The best way to learn to code is",
    "In the year 2050, cities will", "My favourite recipe for soup starts with",
    "The ocean is deep because", "A good teacher always", "The train left the station and",
    "Photosynthesis is the process by which", "The old lighthouse keeper",
)
OPEN_TIMEOUT_S = 180.0  # opening a page: its first run waits behind every other visitor's
CLICK_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Link:
    """What one visitor opens: its own prompt and seed, with room for every click."""

    prompt: str
    seed: int
    max_new_tokens: int

    def query(self) -> str:
        return urlencode({"prompt": self.prompt, "seed": str(self.seed), "sampler": SAMPLER_CODE,
                          "max": str(self.max_new_tokens), "ignore_eos": "1"})


def link_for(index: int, clicks: int) -> Link:
    """Visitor `index`'s link: prompts cycle, seeds never repeat."""
    return Link(PROMPTS[index % len(PROMPTS)], seed=1000 + index, max_new_tokens=clicks + 4)


@dataclass(frozen=True)
class Think:
    """The pause before each click: none, or uniform in [low, high] seconds."""

    low: float
    high: float

    @property
    def label(self) -> str:
        return "0" if self.high == 0 else f"{self.low:g}-{self.high:g}"


def parse_think(text: str) -> Think:
    low, _, high = text.partition("-")
    try:
        think = Think(float(low), float(high or low))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--think '{text}': a number of seconds or a range like 0.5-1.5") from exc
    if not 0 <= think.low <= think.high <= 60:
        raise argparse.ArgumentTypeError(f"--think '{text}': seconds from 0 to 60, low before high")
    return think


def parse_visitors(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--visitors '{text}': whole numbers separated by commas") from exc
    if not all(1 <= n <= 100 for n in counts):
        raise argparse.ArgumentTypeError(f"--visitors '{text}': each count from 1 to 100")
    return counts


# ---- the server --------------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    """A process's resident memory (VmRSS) in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


# ---- the visitors ------------------------------------------------------------------------


@dataclass(frozen=True)
class VisitorRun:
    """What one visitor saw."""

    index: int
    latencies: tuple[float, ...]  # seconds, one per click that finished
    tokens: tuple[int, ...]
    errors: tuple[str, ...]


# what a visitor meets when the server drops, refuses or never answers it
VISIT_FAILURES = (VisitorError, OSError, WebSocketException)


async def open_visitor(url: str, link: Link) -> Visitor:
    return await Visitor.open(url, link.query(), timeout=OPEN_TIMEOUT_S, button_keys=(STEP_KEY,))


async def open_or_fail(url: str, link: Link) -> Visitor | str:
    """A visitor on its link, or why the page could not be opened."""
    try:
        return await open_visitor(url, link)
    except VISIT_FAILURES as exc:
        return f"the page did not open: {exc or type(exc).__name__}"


async def click_through(index: int, visitor: Visitor | str, clicks: int, think: Think) -> VisitorRun:
    """Click Step `clicks` times, pausing before each click as `think` says; an error ends the visit."""
    if isinstance(visitor, str):
        return VisitorRun(index, (), (), (visitor,))
    rng = random.Random(index)  # each visitor's pauses are its own and repeatable
    visitor.timeout = CLICK_TIMEOUT_S
    latencies, problems = [], []
    for _ in range(clicks):
        if think.high > 0:
            await asyncio.sleep(rng.uniform(think.low, think.high))
        before = len(visitor.tokens)
        try:
            run = await visitor.click(STEP_KEY)
        except VISIT_FAILURES as exc:
            problems.append(str(exc) or type(exc).__name__)
            break
        latencies.append(run.seconds)
        if len(visitor.tokens) != before + 1:  # the run ended, but the visitor's token is not there
            problems.append(f"click {len(latencies)} ended with {len(visitor.tokens) - before} new tokens, not 1")
            break
    return VisitorRun(index, tuple(latencies), tuple(visitor.tokens), tuple(visitor.errors + problems))


async def warm_up(url: str) -> None:
    """One visitor opens the page and steps once: the model loads, the first run's imports happen."""
    visitor = await open_visitor(url, Link(PROMPTS[0], seed=1, max_new_tokens=4))
    await visitor.click(STEP_KEY)
    await visitor.close()


async def load_round(url: str, pid: int, count: int, clicks: int, think: Think) -> dict:
    """N visitors on one server; returns the raw measurements."""
    await warm_up(url)
    await asyncio.sleep(1.0)
    idle = rss_mb(pid)
    links = [link_for(i, clicks) for i in range(count)]
    visitors = await asyncio.gather(*(open_or_fail(url, link) for link in links))
    started, client_cpu = time.perf_counter(), time.process_time()
    runs = await asyncio.gather(*(click_through(i, v, clicks, think) for i, v in enumerate(visitors)))
    seconds, client_cpu = time.perf_counter() - started, time.process_time() - client_cpu
    end = rss_mb(pid)
    await asyncio.gather(*(v.close() for v in visitors if isinstance(v, Visitor)), return_exceptions=True)
    return {"runs": runs, "links": links, "seconds": seconds, "client_cpu_s": client_cpu, "rss_idle_mb": idle,
            "rss_end_mb": end}


# ---- the lone runs -----------------------------------------------------------------------


def lone_tokens(links: list[Link], clicks: int) -> dict[Link, tuple[int, ...]]:
    """Each link's first `clicks` tokens from the engine alone, as a single visitor gets them."""
    from engine import Generation, SamplerSettings, StopSettings, load_model

    t, k, p, min_p, rep, chain = SAMPLER_CODE.split("/")
    sampler = SamplerSettings(temperature=float(t), top_k=int(k), top_p=float(p), min_p=float(min_p),
                              repetition_penalty=float(rep), chain=chain)
    lm = load_model()
    tokens = {}
    for link in links:
        generation = Generation(lm, link.prompt, seed=link.seed, sampler=sampler,
                                stop=StopSettings(max_new_tokens=link.max_new_tokens, ignore_eos=True))
        tokens[link] = tuple(generation.step().token_id for _ in range(clicks))
    return tokens


# ---- figures -----------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN when there are no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def summarise(count: int, clicks: int, think: Think, raw: dict, lone: dict[Link, tuple[int, ...]]) -> dict:
    runs: list[VisitorRun] = raw["runs"]
    latencies = [s for run in runs for s in run.latencies]
    tokens = sum(len(run.tokens) for run in runs)
    mismatched = [run.index for run, link in zip(runs, raw["links"], strict=True)
                  if run.tokens != lone[link][:clicks]]
    return {
        "visitors": count, "clicks": clicks, "think_s": think.label,
        "p50_s": percentile(latencies, 50), "p95_s": percentile(latencies, 95),
        "max_s": max(latencies, default=math.nan), "tokens_per_s": tokens / raw["seconds"],
        "seconds": raw["seconds"], "tokens": tokens,
        "client_cpu_share": raw["client_cpu_s"] / raw["seconds"],  # this process's CPU, taken from the server's
        "errors": sum(len(run.errors) for run in runs), "mismatched": len(mismatched),
        "mismatched_visitors": mismatched, "error_texts": sorted({e for run in runs for e in run.errors}),
        "rss_idle_mb": raw["rss_idle_mb"], "rss_end_mb": raw["rss_end_mb"],
        "rss_per_visitor_mb": (raw["rss_end_mb"] - raw["rss_idle_mb"]) / count,
    }


HEADER = (f"{'visitors':>8} {'think s':>7} {'p50 s':>6} {'p95 s':>6} {'max s':>6} {'tok/s':>6} "
          f"{'RSS/visitor MB':>14} {'errors':>6} {'mismatched':>10} {'client CPU':>10}")


def row(result: dict) -> str:
    return (f"{result['visitors']:>8} {result['think_s']:>7} {result['p50_s']:>6.2f} {result['p95_s']:>6.2f} "
            f"{result['max_s']:>6.2f} {result['tokens_per_s']:>6.1f} {result['rss_per_visitor_mb']:>14.1f} "
            f"{result['errors']:>6} {result['mismatched']:>10} {result['client_cpu_share']:>10.0%}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--visitors", type=parse_visitors, default=(1, 5, 10, 20, 30),
                        help="visitor counts, comma-separated (default 1,5,10,20,30)")
    parser.add_argument("--clicks", type=int, default=32, choices=range(1, 257), metavar="1..256",
                        help="Step clicks per visitor (default 32)")
    parser.add_argument("--think", type=parse_think, action="append",
                        help="pause before each click: 0 or a range like 0.5-1.5 (repeatable; default both)")
    parser.add_argument("--quick", action="store_true", help="1 and 5 visitors, 8 clicks, no think time")
    args = parser.parse_args(argv)
    if args.quick:
        args.visitors, args.clicks, args.think = (1, 5), 8, [Think(0, 0)]
    args.think = args.think or [Think(0, 0), Think(0.5, 1.5)]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    load_before = os.getloadavg()
    raws = []
    for think in args.think:
        for count in args.visitors:
            with served_app_process(None, "--server.fileWatcherType", "none") as (url, pid):
                raws.append((count, think, asyncio.run(load_round(url, pid, count, args.clicks, think))))
            print(f"  {count} visitor(s), think {think.label} s: done in {raws[-1][2]['seconds']:.1f} s", flush=True)
    load_after = os.getloadavg()
    lone = lone_tokens([link_for(i, args.clicks) for i in range(max(args.visitors))], args.clicks)
    results = [summarise(count, args.clicks, think, raw, lone) for count, think, raw in raws]
    print(f"\n{args.clicks} Step clicks per visitor; latency = click sent -> its run's script_finished received")
    print(HEADER)
    for result in results:
        print(row(result))
    for result in results:
        for text in result["error_texts"][:3]:
            print(f"  error ({result['visitors']} visitors, think {result['think_s']}): {text}")
    print(f"load average before/after: {load_before[0]:.2f} / {load_after[0]:.2f} on {os.cpu_count()} CPUs "
          "(other work on the machine inflates every number)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "load_bench.json"
    out.write_text(json.dumps({"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "load_average_1min": [load_before[0], load_after[0]],
                               "links": [asdict(link_for(i, args.clicks)) for i in range(max(args.visitors))],
                               "results": results}, indent=1))
    print(f"written to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
