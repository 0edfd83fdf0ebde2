"""Same prompt, different answers: one prompt decoded many times beside random company, exact
and fast batching, every step against the lone run.

    .venv/bin/python -m bench.determinism_bench --prompt "The capital of France is" --runs 16 --tokens 48 \\
        --batch 8 [--seed 0] [--temperature 0] [--threads 2] [--json bench/results/determinism.json]

Runs engine.serving.repeated_experiment on the real bundled model: the prompt alone (batch-1
steps, the reference), then `--runs` times in each mode, each run beside fresh company (a batch
size from 2 to `--batch`, the visitor at a random row, the others' contexts of random lengths),
both modes meeting the same company. Greedy, or sampled with `--temperature` (the same seeded
draws in every run). Reports per mode:
  - distinct completions (token sequences) over the runs;
  - the largest |logit - lone logit| over runs and steps, up to each run's first divergence;
  - per run, the first token that differs from the lone run's (or null);
  - the median packed pass at `--batch`, both modes interleaved on the same rows;
and the lone run's smallest top-two margin, with the steps below twice each mode's largest change
(the only steps where that change could flip greedy).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

from engine import LoadedModel, SamplerSettings, load_model
from engine.serving import DeterminismResult, ModeResult, near_ties, packed_pass_path, repeated_experiment

RESULTS = Path(__file__).parent / "results"


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, or what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(lm: LoadedModel) -> str:
    return torch.cuda.get_device_name(lm.device) if lm.device.type == "cuda" else lm.device.type


def mode_figures(lm: LoadedModel, result: DeterminismResult, mode: ModeResult) -> dict[str, Any]:
    ties = near_ties(result.lone, 2 * mode.max_abs_logit_diff)
    return {"path": packed_pass_path(lm, exact=mode.mode == "exact"),
            "distinct_completions": mode.distinct_completions, "max_abs_logit_diff": mode.max_abs_logit_diff,
            "first_divergence": list(mode.first_divergence), "ms_per_step": mode.ms_per_step,
            "runs_diverged": sum(d is not None for d in mode.first_divergence),
            "batch_per_run": [run.batch for run in mode.runs],
            "step_ms_per_run": [round(run.step_ms, 1) for run in mode.runs], "near_ties": list(ties),
            "texts": sorted(set(mode.texts))}


def figures(lm: LoadedModel, result: DeterminismResult, args: argparse.Namespace, seconds: float) -> dict[str, Any]:
    margins = [step.margin for step in result.lone.steps]
    gaps = [step.band_gap for step in result.lone.steps if step.band_gap is not None]
    return {
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "device": device_name(lm),
                    "threads": torch.get_num_threads(), "platform": platform.platform()},
        "model": lm.name,
        "torch": torch.__version__,
        "arguments": {"prompt": args.prompt, "runs": args.runs, "tokens": args.tokens, "batch": args.batch,
                      "seed": args.seed, "temperature": args.temperature},
        "exact": mode_figures(lm, result, result.exact),
        "fast": mode_figures(lm, result, result.fast),
        "ms_per_step": {"batch": result.speed.batch, "exact": result.speed.exact_ms, "fast": result.speed.fast_ms},
        "lone": {"text": result.lone.text, "smallest_margin": min(margins),
                 "smallest_margin_step": margins.index(min(margins)),
                 "smallest_band_gap": min(gaps) if gaps else None},  # sampled: u's distance to its band's edge
        "seconds": seconds,
    }


def summary(out: dict[str, Any]) -> str:
    args, lone = out["arguments"], out["lone"]
    lines = [f"{args['prompt']!r}: {args['runs']} runs x {args['tokens']} tokens, batch 2-{args['batch']}, "
             f"seed {args['seed']}, temperature {args['temperature']:g} ({out['seconds']:.0f} s, "
             f"{out['machine']['cpu']}, {out['machine']['threads']} threads)",
             f"  lone: {lone['text']!r}",
             f"  smallest top-two margin of the lone run: {lone['smallest_margin']:.3g} (step "
             f"{lone['smallest_margin_step']})"]
    if lone["smallest_band_gap"] is not None:
        lines.append(f"  closest a draw came to its CDF band's edge: {lone['smallest_band_gap']:.3g}")
    for name in ("exact", "fast"):
        m = out[name]
        lines.append(f"  {name:>5}: {m['distinct_completions']} distinct of {args['runs']}, max |Δlogit| "
                     f"{m['max_abs_logit_diff']:.3g}, diverged {m['runs_diverged']} (first at "
                     f"{[d for d in m['first_divergence'] if d is not None] or '-'}), steps with margin < 2 x "
                     f"that: {m['near_ties'] or 'none'}, {out['ms_per_step'][name]:.1f} ms a packed step at "
                     f"batch {out['ms_per_step']['batch']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", default="The capital of France is")
    parser.add_argument("--runs", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--batch", type=int, default=8, help="the largest batch; each run draws its own from 2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy; above: sampled, seeded draws")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", default=None, help="the engine's default when left out")
    parser.add_argument("--json", type=Path, default=RESULTS / "determinism.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model(device=args.device)
    sampler = SamplerSettings(temperature=args.temperature) if args.temperature > 0 else None
    started = time.perf_counter()
    result = repeated_experiment(lm, args.prompt, args.runs, args.tokens, args.batch, args.seed, sampler=sampler)
    out = figures(lm, result, args, time.perf_counter() - started)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2, ensure_ascii=False))
    print(summary(out))


if __name__ == "__main__":
    main()
