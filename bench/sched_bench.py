"""Engine benchmark for many visitors at once: N generations stepping as fast as they can.

    .venv/bin/python -m bench.sched_bench [--visitors 1,5,10,30] [--steps 12] [--modes direct,exact,fast]

Each of N threads runs its own Generation (its own prompt, seed and sampler settings) for
`steps` steps, all starting together, in one of three modes:
  - direct: every thread runs its own forward passes (what the server did before the scheduler);
  - exact, fast, off: every pass goes through one shared ForwardScheduler with that batching
    setting (TBT_BATCHING): waiting decode steps batched row by row (exact), in one matrix
    product (fast), or not at all (off: one pass at a time).
Prints, per mode and N: p50 / p95 step latency (the whole Generation.step, wall time; all
steps, and the decode steps after each visitor's first, whose prompt waits its turn), the
forward part of a step (waiting for and running the pass) and the sampler part, tokens/s
across all threads, the scheduler's mean batch, and whether each thread's tokens equal its
lone run's (computed first, one generation at a time, no scheduler).
Writes bench/results/sched.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from engine import Generation, SamplerSettings, StopSettings, load_model
from engine.serving.scheduler import ForwardScheduler

RESULTS = Path(__file__).parent / "results"
PROMPTS = [
    "The capital of France is", "Once upon a time, in a small village by the sea,", "def fibonacci(n):",
    "Roses are red,", "In 1492 Columbus sailed", "The quick brown fox", "Water boils at",
    "My favourite food is", "The best way to learn a language is", "Photosynthesis is the process",
]
SAMPLERS = [SamplerSettings(temperature=0), SamplerSettings(temperature=0.9, top_k=40, top_p=0.95),
            SamplerSettings(temperature=0.7, min_p=0.05, repetition_penalty=1.2)]


@dataclass(frozen=True)
class Visitor:
    prompt: str
    sampler: SamplerSettings
    seed: int


def visitors(count: int) -> list[Visitor]:
    return [Visitor(PROMPTS[i % len(PROMPTS)], SAMPLERS[i % len(SAMPLERS)], seed=100 + i) for i in range(count)]


def generation(lm, visitor: Visitor, steps: int, scheduler: ForwardScheduler | None = None) -> Generation:
    return Generation(lm, visitor.prompt, sampler=visitor.sampler, seed=visitor.seed,
                      stop=StopSettings(max_new_tokens=steps, ignore_eos=True), scheduler=scheduler)


def lone_tokens(lm, people: list[Visitor], steps: int) -> list[list[int]]:
    """Each visitor's tokens when it has the machine to itself."""
    out = []
    for visitor in people:
        alone = generation(lm, visitor, steps)
        list(alone.run())
        out.append(alone.generated_ids)
    return out


def percentile_ms(ordered: list[float], q: float) -> float:
    return 1e3 * ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def run_mode(lm, mode: str, people: list[Visitor], steps: int, expected: list[list[int]]) -> dict:
    scheduler = None if mode == "direct" else ForwardScheduler(lm, batching=mode)
    generations = [generation(lm, v, steps, scheduler) for v in people]
    latencies: list[list[float]] = [[] for _ in people]
    start = threading.Barrier(len(people) + 1)

    def visit(index: int) -> None:
        start.wait()
        for _ in range(steps):
            began = time.perf_counter()
            generations[index].step()
            latencies[index].append(time.perf_counter() - began)

    threads = [threading.Thread(target=visit, args=(i,)) for i in range(len(people))]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    stats = scheduler.stats() if scheduler else None
    if scheduler:
        scheduler.close()
    every = sorted(x for per in latencies for x in per)
    later = sorted(x for per in latencies for x in per[1:])  # decode steps only: the prompts are read
    records = [s for g in generations for s in g.steps]
    return {
        "mode": mode, "visitors": len(people), "steps": steps, "wall_s": wall,
        "p50_ms": percentile_ms(every, 0.5), "p95_ms": percentile_ms(every, 0.95),
        "decode_p50_ms": percentile_ms(later, 0.5), "decode_p95_ms": percentile_ms(later, 0.95),
        "forward_ms": statistics.mean(s.timing.forward_ms for s in records),
        "sampling_ms": statistics.mean(s.timing.sampling_ms for s in records),
        "tokens_per_s": len(every) / wall,
        "mean_batch": (stats.tokens / stats.passes) if stats and stats.passes else 1.0,
        "identical": sum(g.generated_ids == e for g, e in zip(generations, expected, strict=True)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--visitors", default="1,5,10,30")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--modes", default="direct,exact,fast")
    args = parser.parse_args()
    counts = [int(n) for n in args.visitors.split(",")]
    lm = load_model()
    everyone = visitors(max(counts))
    started = time.perf_counter()
    expected = lone_tokens(lm, everyone, args.steps)
    print(f"lone runs: {time.perf_counter() - started:.1f} s for {len(everyone)} visitors x {args.steps} steps")
    print(f"{'mode':>9} {'N':>3} {'p50 ms':>7} {'p95 ms':>7} {'dec p50':>8} {'dec p95':>8} {'fwd ms':>7} "
          f"{'smp ms':>7} {'tok/s':>6} {'batch':>5}  identical to lone   (dec: steps after the first)")
    rows = []
    for n in counts:
        for mode in args.modes.split(","):
            row = run_mode(lm, mode, everyone[:n], args.steps, expected[:n])
            rows.append(row)
            print(f"{mode:>9} {n:>3} {row['p50_ms']:>7.0f} {row['p95_ms']:>7.0f} {row['decode_p50_ms']:>8.0f} "
                  f"{row['decode_p95_ms']:>8.0f} {row['forward_ms']:>7.0f} "
                  f"{row['sampling_ms']:>7.1f} {row['tokens_per_s']:>6.1f} {row['mean_batch']:>5.1f}  "
                  f"{row['identical']}/{n}", flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sched.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
