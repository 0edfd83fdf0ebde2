"""How long a packed pass takes beside busy page scripts, at several GIL switch intervals.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python -m bench.gil_bench [--rows 15] [--scripts 1,3]
                                                                 [--intervals 5,0.5,0.2,0.1]

A packed decode pass (engine/serving/packed.py, exact batching) runs again and again on the real model
for `rows` visitors, alone and then beside N threads that imitate a visitor's page script
(10 ms of pure Python, then 10 ms of waiting), in its two forms:
  - eager (the twin model, as any model but a plain Llama gets it): the pass gives up the GIL
    and takes it back around every torch op, thousands of times; each take waits until the
    script thread lets go, which Python forces after its switch interval (5 ms by default);
  - scripted (engine/fast/scripted_llama.py, what the bundled model gets): one call, one take.
Prints the median pass time per form, interval and script count. The scheduler sets the
interval it picks from these figures for eager passes (engine/serving/scheduler.py SWITCH_INTERVAL_S).
Run it with the server's OMP_WAIT_POLICY (PASSIVE), which `make run` and the Dockerfile set.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

from engine import load_model
from engine.forward import cache_length, cache_prefix, forward_one, new_cache
from engine.serving.packed import forward_packed

SCRIPT_BUSY_S = 0.010
SCRIPT_WAIT_S = 0.010


def script_like(stop: threading.Event) -> None:
    """A page script's rhythm: a burst of pure Python, then a wait (I/O, the next click)."""
    while not stop.is_set():
        started = time.perf_counter()
        while time.perf_counter() - started < SCRIPT_BUSY_S:
            {i: str(i) for i in range(200)}
        time.sleep(SCRIPT_WAIT_S)


def median_pass_ms(lm, caches: list, seconds: float, scripts: int, eager: bool) -> float:
    stop = threading.Event()
    threads = [threading.Thread(target=script_like, args=(stop,)) for _ in range(scripts)]
    for thread in threads:
        thread.start()
    times, started = [], time.perf_counter()
    try:
        while time.perf_counter() - started < seconds or len(times) < 3:
            views = [cache_prefix(c, cache_length(c)) for c in caches]  # the caches stay as they are
            begun = time.perf_counter()
            forward_packed(lm, [5] * len(caches), views, eager=eager)
            times.append(time.perf_counter() - begun)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    return 1e3 * statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=15, help="visitors in each packed pass (default 15)")
    parser.add_argument("--scripts", default="1,3", help="busy script threads, comma-separated (default 1,3)")
    parser.add_argument("--intervals", default="5,0.5,0.2,0.1", help="switch intervals in ms (default 5,0.5,0.2,0.1)")
    parser.add_argument("--seconds", type=float, default=4.0, help="time per configuration (default 4)")
    args = parser.parse_args(argv)
    lm = load_model()
    caches = []
    for i in range(args.rows):
        caches.append(new_cache(lm))
        forward_one(lm, list(range(100 + i, 130 + i)), caches[-1])
    before = sys.getswitchinterval()
    try:
        for form, eager in (("eager", True), ("scripted", False)):
            print(f"{form} packed pass of {args.rows} rows, alone: "
                  f"{median_pass_ms(lm, caches, args.seconds, 0, eager):.0f} ms")
            for interval in (float(x) for x in args.intervals.split(",")):
                sys.setswitchinterval(interval / 1e3)
                cells = [f"{n} script thread(s): {median_pass_ms(lm, caches, args.seconds, n, eager):5.0f} ms"
                         for n in (int(x) for x in args.scripts.split(","))]
                print(f"  switch interval {interval:>4} ms: " + "   ".join(cells))
            sys.setswitchinterval(before)
    finally:
        sys.setswitchinterval(before)


if __name__ == "__main__":
    main()
