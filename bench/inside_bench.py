"""What looking inside the forward pass costs a step (engine/inside.py).

    .venv/bin/python -m bench.inside_bench [--steps 20] [--rounds 3]

Steps greedy decode steps of the bundled model three ways, rounds interleaved so each sees the
same machine: with the view closed (no capture), with the pass captured, and captured with its
view built after each step (`Generation.inside_view`: the lens rows through the head in one
pass over it, engine/fast/lens_kernel.py, their statistics, the attention from the captured
queries). Prints the median per step of each and the parts of a view (the lens product also as
`F.linear`, to compare); writes bench/results/inside.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from engine import Generation, SamplerSettings, StopSettings, load_model
from engine.fast import lens_linear
from engine.forward import plain_head
from engine.inside import final_norm

PROMPT = "The three primary colours of light are"
RESULTS = Path(__file__).parent / "results"


def stepping(lm, steps: int, inside: bool, view: bool) -> tuple[list[float], list[float]]:
    """Per-step milliseconds of `steps` decode steps, and of each view built after them."""
    generation = Generation(lm, PROMPT, sampler=SamplerSettings(temperature=0.0),
                            stop=StopSettings(max_new_tokens=steps + 1, ignore_eos=True))
    generation.inside = inside
    generation.step()  # the prompt's pass is not a decode step
    step_ms, view_ms = [], []
    for _ in range(steps):
        started = time.perf_counter()
        generation.step()
        step_ms.append((time.perf_counter() - started) * 1e3)
        if view:
            started = time.perf_counter()
            generation.inside_view()
            view_ms.append((time.perf_counter() - started) * 1e3)
    generation.close()
    return step_ms, view_ms


def lens_product_ms(lm, product=lens_linear, repeats: int = 10) -> float:
    """The view's largest part on its own: the lens rows below the last through the final norm and
    the head (the view's own product, or another to compare with)."""
    rows = torch.randn(lm.geometry.layers, lm.model.config.hidden_size)
    norm, head = final_norm(lm.model), plain_head(lm)
    with torch.inference_mode():
        product(norm(rows[None])[0], head.weight)
        started = time.perf_counter()
        for _ in range(repeats):
            product(norm(rows[None])[0], head.weight)
    return (time.perf_counter() - started) / repeats * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    lm = load_model()
    stepping(lm, 2, inside=True, view=True)  # the twin is made and probed once, outside the timing
    ways = {"closed": (False, False), "captured": (True, False), "captured + view": (True, True)}
    steps: dict[str, list[float]] = {name: [] for name in ways}
    views: list[float] = []
    for _ in range(args.rounds):
        for name, (inside, view) in ways.items():
            step_ms, view_ms = stepping(lm, args.steps, inside, view)
            steps[name] += step_ms
            views += view_ms
    result = {name: round(statistics.median(values), 1) for name, values in steps.items()}
    result["view"] = round(statistics.median(views), 1)
    result["lens product"] = round(lens_product_ms(lm), 1)
    result["same by F.linear"] = round(lens_product_ms(lm, torch.nn.functional.linear), 1)
    result["added per step"] = round(result["captured"] - result["closed"] + result["view"], 1)
    for name, value in result.items():
        print(f"{name:>16}: {value:6.1f} ms")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "inside.json").write_text(json.dumps({"steps": args.steps, "rounds": args.rounds,
                                                     "median_ms": result}, indent=2) + "\n")


if __name__ == "__main__":
    main()
