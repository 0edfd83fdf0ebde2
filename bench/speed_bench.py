"""Measure what the KV cache & speed page shows, at larger sizes, and check the speed goals.

    .venv/bin/python -m bench.speed_bench            # the page's "Measure more" sizes
    .venv/bin/python -m bench.speed_bench --quick    # the page's first-visit sizes

Prints a table and writes bench/results/speed.json. Goals (not asserted in tests, because
timings depend on the machine and on whatever else it is doing):
  - the page's first visit measures everything in under 15 s on 2 CPU cores;
  - with the cache a step is faster than recomputing at every context length >= 64;
  - decode costs more per token than prefill; batch 16 costs less per token than batch 1;
  - a decode step at batch 1 sits below the device's balance point (memory-bound).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

from engine import load_model
from engine.speed import (
    MORE,
    QUICK,
    measure_batching,
    measure_cache_vs_recompute,
    measure_decode_intensity,
    measure_device,
    measure_kv,
    measure_prefill_decode,
)

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    """Measure, print, check the goals, save the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the page's first-visit sizes")
    sizes = QUICK if parser.parse_args().quick else MORE
    lm = load_model()
    started = time.perf_counter()
    cache = measure_cache_vs_recompute(lm, sizes.cache_lengths, sizes.repeats)
    prefill = measure_prefill_decode(lm, sizes.prompt_tokens, sizes.decode_steps, sizes.repeats)
    kv = measure_kv(lm, 16)
    device = measure_device(lm.device, lm.dtype)
    step = measure_decode_intensity(lm, sizes.prompt_tokens, 2 * sizes.repeats + 1)
    batch = measure_batching(lm, (1, 4, 16), sizes.batch_context, sizes.repeats)
    total = time.perf_counter() - started

    print(f"{lm.name} on {lm.device} ({str(lm.dtype).removeprefix('torch.')}); all measured in {total:.1f} s")
    print("context  cached ms  recompute ms  ratio")
    for p in cache:
        print(f"{p.context_tokens:7d}  {p.cached_ms:9.1f}  {p.recompute_ms:12.1f}  {p.ratio:5.1f}x")
    print(f"prefill {prefill.prompt_tokens} tokens: {prefill.prefill_ms:.1f} ms = {prefill.prefill_ms_per_token:.2f} "
          f"ms/token; decode {prefill.decode_ms:.1f} ms/token ({prefill.ratio:.1f}x)")
    print(f"KV cache: {kv.bytes // kv.positions:,} bytes per position (measured from {kv.positions} positions)")
    print(f"device: {device.flops_per_s / 1e9:.1f} GFLOP/s ({device.matmul_size}^3 matmul, {device.dtype}), "
          f"{device.bytes_per_s / 1e9:.1f} GB/s copy, balance {device.ridge_flops_per_byte:.1f} FLOP/byte")
    print(f"decode step at {step.context_tokens} tokens: {step.step_ms:.1f} ms, {step.flops / 1e6:.0f} MFLOP, "
          f"{step.bytes / 2**20:.1f} MiB, {step.flops_per_byte:.2f} FLOP/byte, "
          f"achieved {step.achieved_bytes_per_s / 1e9:.1f} GB/s")
    for p in batch:
        print(f"batch {p.batch:2d}: step {p.step_ms:7.1f} ms, {p.per_token_ms:6.1f} ms/token, "
              f"{p.tokens_per_s:6.1f} tokens/s")

    goals = {
        "first visit under 15 s (quick sizes only)": sizes is not QUICK or total < 15,
        "cache beats recompute from 64 tokens": all(p.ratio > 1 for p in cache if p.context_tokens >= 64),
        "decode costs more per token than prefill": prefill.ratio > 1,
        "batch 16 cheaper per token than batch 1": batch[-1].per_token_ms < batch[0].per_token_ms,
        "decode at batch 1 is memory-bound": step.flops_per_byte < device.ridge_flops_per_byte,
    }
    for goal, met in goals.items():
        print(f"{'met ' if met else 'MISSED'}  {goal}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "speed.json").write_text(json.dumps({
        "model": lm.name, "device": str(lm.device), "seconds": total, "sizes": asdict(sizes),
        "cache": [asdict(p) | {"ratio": p.ratio} for p in cache], "prefill_decode": asdict(prefill),
        "kv_bytes_per_position": kv.bytes // kv.positions, "device_speed": asdict(device),
        "decode_step": asdict(step) | {"flops_per_byte": step.flops_per_byte,
                                       "achieved_bytes_per_s": step.achieved_bytes_per_s},
        "batching": [asdict(p) | {"per_token_ms": p.per_token_ms} for p in batch], "goals": goals,
    }, indent=2))


if __name__ == "__main__":
    main()
