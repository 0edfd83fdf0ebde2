"""The exact rows kernel by row count: each kind of the bundled model's products, and whole
verify passes, against one row.

    .venv/bin/python -m bench.rows_bench [--rows 1,2,3,5,9,12,17,30] [--repeats 11]

For each kind of product a decode pass makes (query, key and value in one call; the output
projection; gate and up in one call; down; the 49,152 x 576 head), the time of all 30 layers'
worth for each row count through the kernel as a verify pass calls it (`sequence_rows_linears`;
a packed pass of several visitors calls `lone_rows_linears`, the same sums without the kernel's
helper thread). Then whole passes after a filled cache of 64 tokens: one token (a lone decode
step) and n tokens of one sequence (a verify pass of n - 1 guesses; rows up to
lone.VERIFY_MAX_ROWS), each checked equal to one-token steps (torch.equal). Medians of
`--repeats`. Where a pass of a few rows costs about what one row costs, the weights are read
once for all of them. Writes bench/results/rows.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from bench.lone_bench import median_ms
from engine import load_model
from engine.fast import LAYER_PRODUCTS, LAYER_WEIGHTS, VERIFY_MAX_ROWS, kernel_available, llama_weights, sum_order
from engine.forward import forward_all, forward_one, new_cache, verify_pass_decision
from engine.loading import LoadedModel
from engine.speed import sample_context

RESULTS = Path(__file__).parent / "results"
KINDS = ("query, key, value, all layers", "output projection, all layers", "gate and up, all layers",
         "down, all layers")  # LAYER_PRODUCTS' names


def row_counts(text: str) -> list[int]:
    try:
        counts = [int(n) for n in text.split(",")]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--rows '{text}': whole numbers separated by commas") from exc
    if not counts or any(not 1 <= n <= 256 for n in counts):
        raise argparse.ArgumentTypeError(f"--rows '{text}': each count from 1 to 256")
    return counts


def products_ms(lm: LoadedModel, counts: list[int], repeats: int) -> dict[str, dict[int, float]]:
    weights = llama_weights(lm.model)
    layers = list(weights.layers)
    per_kind = {name: [[layers[layer * LAYER_WEIGHTS + i] for i in which]
                       for layer in range(len(layers) // LAYER_WEIGHTS)]
                for name, which in zip(KINDS, LAYER_PRODUCTS, strict=True)}
    per_kind["language-model head"] = [[weights.head]]
    timed: dict[str, dict[int, float]] = {}
    for name, calls in per_kind.items():
        timed[name] = {}
        for rows in counts:
            x = torch.randn((rows, calls[0][0].shape[1]))
            timed[name][rows] = median_ms(lambda x=x, calls=calls: [torch.ops.token_by_token.sequence_rows_linears(x, w)
                                                                    for w in calls], repeats)
    return timed


def passes_ms(lm: LoadedModel, counts: list[int], repeats: int) -> dict[int, float]:
    """One pass of n tokens after the same 64-token cache (cropped back after each): n = 1 a
    lone decode step, more a verify pass; each checked against one-token steps first."""
    cache = new_cache(lm)
    forward_one(lm, sample_context(lm, 64), cache)
    tokens = sample_context(lm, max(counts), offset=64)

    def one_pass(fed: list[int]) -> torch.Tensor:  # [n, vocab]; the cache cropped back
        logits = forward_one(lm, fed, cache)[None] if len(fed) == 1 else forward_all(lm, fed, cache)
        cache.crop(-len(fed))
        return logits

    timed = {}
    for rows in counts:
        fed = tokens[:rows]
        steps = torch.stack([forward_one(lm, [t], cache) for t in fed])  # one token a pass
        cache.crop(-rows)
        assert torch.equal(one_pass(fed), steps), f"a pass of {rows} rows differs from one-token steps"
        timed[rows] = median_ms(lambda fed=fed: one_pass(fed), repeats)
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=row_counts, default=[1, 2, 3, 5, 9, 12, 17, 30])
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args()
    lm = load_model()
    if not kernel_available() or sum_order() == "none":
        raise SystemExit("the exact rows kernel is not in use on this machine")
    if not verify_pass_decision(lm).fast:
        raise SystemExit(f"the verify pass is not the kernel's here: {verify_pass_decision(lm).reason}")
    with torch.inference_mode():
        products = products_ms(lm, args.rows, args.repeats)
        passes = passes_ms(lm, [n for n in args.rows if n <= VERIFY_MAX_ROWS], args.repeats)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "rows.json").write_text(json.dumps({"order": sum_order(),
                                                   "threads": torch.get_num_threads(), "products_ms": products,
                                                   "passes_ms": passes}, indent=2))
    order, threads = sum_order(), torch.get_num_threads()
    print(f"the exact rows kernel ({order} order, {threads} threads), medians of {args.repeats}, ms")
    print(f"  {'rows':<30}" + "".join(f"{rows:>8}" for rows in args.rows))
    for name, by_rows in products.items():
        print(f"  {name:<30}" + "".join(f"{by_rows[rows]:8.2f}" for rows in args.rows))
    print(f"  {'a whole pass (1: a lone step)':<30}" + "".join(f"{passes[n]:8.2f}" if n in passes else f"{'':8}"
                                                             for n in args.rows))
    print("  every pass's logits torch.equal to one-token steps")


if __name__ == "__main__":
    main()
