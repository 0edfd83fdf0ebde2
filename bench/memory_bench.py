"""Memory one visitor's generation holds after N steps, on the real model.

    .venv/bin/python -m bench.memory_bench [--steps 1000]

Runs one Generation (the bundled model, sampling at temperature 0.8 / top-k 40 / top-p 0.95,
EOS ignored) for `steps` steps and reports what it holds:
  - records and other Python objects: what tracemalloc counts as allocated by the generation
    while it ran and still alive (tensor storage is not counted by tracemalloc: it is below);
  - kept raw logits: the tensors of the latest steps (engine.generation.KEEP_LOGITS);
  - KV cache: the bytes of the cache's key and value tensors.
The issue's budget (kept logits and records) is the first two together; the KV cache is the
model's own working memory and grows by one position a step.
"""

from __future__ import annotations

import argparse
import gc
import tracemalloc

from engine import Generation, SamplerSettings, StopSettings, load_model
from engine.generation import KEEP_LOGITS

PROMPT = "Write a long story about a lighthouse keeper and the sea."
MB = 1e6


def kept_logit_bytes(generation: Generation) -> int:
    return sum(kept.raw_logits.numel() * kept.raw_logits.element_size()
               for kept in generation._kept if kept.raw_logits is not None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000, help="steps to run (default 1000)")
    args = parser.parse_args(argv)
    lm = load_model()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    generation = Generation(lm, PROMPT, seed=7, sampler=SamplerSettings(temperature=0.8, top_k=40, top_p=0.95),
                            stop=StopSettings(max_new_tokens=args.steps, ignore_eos=True))
    for _ in range(args.steps):
        generation.step()
    gc.collect()
    python_bytes = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    logits, kv = kept_logit_bytes(generation), generation.kv.bytes
    print(f"{len(generation.steps)} steps ({len(generation.output_text):,} characters of output):")
    per_step_kb = python_bytes / len(generation.steps) / 1e3
    print(f"  records and other Python objects  {python_bytes / MB:6.1f} MB  ({per_step_kb:.1f} kB a step)")
    print(f"  kept raw logits (latest {KEEP_LOGITS} steps)    {logits / MB:6.1f} MB")
    print(f"  budget: records + kept logits     {(python_bytes + logits) / MB:6.1f} MB")
    print(f"  KV cache ({generation.kv.positions:,} positions)          {kv / MB:6.1f} MB")


if __name__ == "__main__":
    main()
