"""Trace save: what saving a class room's trace after a Step costs as the lesson grows.

    .venv/bin/python -m bench.trace_save [--steps 400]

One generation of the real bundled model (temperature 0.8, EOS ignored). After every Step its
trace is made the way a class room saves it (`TraceText.of`: each step encoded once, while it
stands); every 100 steps, also the whole trace encoded again (`json.dumps(to_trace(...))`, as
rooms saved it before). Prints both times, the text's size, and whether the two load as the
same trace. The room saves under its lock on every presenter Step: docs/class.md.
"""

from __future__ import annotations

import argparse
import json
import time

from engine import Generation, SamplerSettings, StopSettings, TraceText, load_model, to_trace

EVERY = 100


def timed(make) -> tuple[str, float]:
    """`make()`'s text and how long it took, in milliseconds."""
    started = time.perf_counter()
    text = make()
    return text, (time.perf_counter() - started) * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, choices=range(EVERY, 2001), default=400, metavar=f"{EVERY}-2000")
    args = parser.parse_args(argv)
    generation = Generation(load_model(), "Write a story about a lighthouse keeper.", seed=1,
                            sampler=SamplerSettings(temperature=0.8),
                            stop=StopSettings(max_new_tokens=args.steps + 1, ignore_eos=True))
    kept = TraceText()
    for step in range(1, args.steps + 1):
        generation.step()
        text, kept_ms = timed(lambda: kept.of(generation))
        if step % EVERY == 0:
            whole, whole_ms = timed(lambda: json.dumps(to_trace(generation)))
            print(f"step {step}: TraceText.of {kept_ms:.1f} ms, json.dumps(to_trace) {whole_ms:.1f} ms, "
                  f"{len(text) / 1e6:.2f} MB, same trace: {json.loads(text) == json.loads(whole)}", flush=True)


if __name__ == "__main__":
    main()
