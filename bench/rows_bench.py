"""The exact rows kernel by row count: each kind of the bundled model's products, every layer.

    .venv/bin/python -m bench.rows_bench [--rows 1,2,3,5,9,12,17,30] [--repeats 11]

For each kind of product a decode pass makes (query, key and value in one call; the output
projection; gate and up in one call; down; the 49,152 x 576 head), the time of all 30 layers'
worth for 1 to 30 rows through the kernel as the passes call it (`sequence_rows_linears`: a
verify pass's or a packed pass's rows), median of `--repeats`. A verify pass of k guesses has
k + 1 rows; a packed pass, one row per visitor. Where a pass of a few rows costs about what one
row costs, the weights are read once for all of them. Writes bench/results/rows.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from engine import load_model
from engine.fast import exact_rows_kernel
from engine.fast.scripted_llama import LAYER_WEIGHTS, llama_weights

RESULTS = Path(__file__).parent / "results"
KINDS = {"query, key, value": (1, 2, 3), "output projection": (4,), "gate and up": (6, 7), "down": (8,)}


def median_ms(x: torch.Tensor, calls: list[list[torch.Tensor]], repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        for weights in calls:
            torch.ops.token_by_token.sequence_rows_linears(x, weights)
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times[1:])  # the first warms up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,3,5,9,12,17,30")
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args()
    counts = [int(n) for n in args.rows.split(",")]
    lm = load_model()
    if not exact_rows_kernel.kernel_available() or exact_rows_kernel.sum_order() == "none":
        raise SystemExit("the exact rows kernel is not in use on this machine")
    weights = llama_weights(lm.model)
    layers = list(weights.layers)
    count = len(layers) // LAYER_WEIGHTS
    per_kind = {name: [[layers[layer * LAYER_WEIGHTS + i] for i in which] for layer in range(count)]
                for name, which in KINDS.items()}
    per_kind["language-model head"] = [[weights.head]]
    results: dict[str, dict[int, float]] = {}
    with torch.inference_mode():
        for name, calls in per_kind.items():
            width = calls[0][0].shape[1]
            results[name] = {rows: median_ms(torch.randn((rows, width)), calls, args.repeats) for rows in counts}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "rows.json").write_text(json.dumps({"order": exact_rows_kernel.sum_order(),
                                                   "threads": torch.get_num_threads(), "ms": results}, indent=2))
    print(f"the exact rows kernel ({exact_rows_kernel.sum_order()} order, {torch.get_num_threads()} threads): "
          f"ms for every layer's products, median of {args.repeats}")
    print(f"  {'rows':<22}" + "".join(f"{rows:>8}" for rows in counts))
    for name, by_rows in results.items():
        print(f"  {name:<22}" + "".join(f"{by_rows[rows]:8.2f}" for rows in counts))


if __name__ == "__main__":
    main()
