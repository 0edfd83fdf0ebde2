"""Speculative decoding benchmark: wall time per token, plain decoding against each draft method.

    .venv/bin/python -m bench.speculative_bench [--rounds 3] [--tokens 40] [--methods prompt-lookup,int8,bfloat16]
    .venv/bin/python -m bench.speculative_bench --methods lookahead,early-exit,medusa-heads,mtp --out chainless.json

Greedy, on three prompts (copy-heavy, free-form, chat), plain decoding (engine.Generation, one
forward pass per token) against SpeculativeGeneration with each draft method and k in {2, 4, 8}.
Every configuration runs once per round, and the rounds are interleaved, so all of them see the
same machine conditions; both the median and the fastest round are kept (on a shared machine other
work can only slow a run down, so the fastest is the closest to what the hardware does; the
median says what a visitor saw). Each run is checked to give
the plain run's tokens exactly. Also measured: the largest |logit difference| between a verify
pass over k + 1 positions and the same positions decoded one token at a time.
Writes bench/results/speculative_bench.json (or --out). "overhead" is everything in a pass but the
forward passes themselves (a round's checks, stop checks, crop and record; a plain step's sampler
and record), median per pass.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from engine import DraftModel, Generation, LoadedModel, PromptLookup, load_model, self_draft
from engine.forward import forward_all, forward_one, lone_pass_decision, new_cache, verify_pass_decision
from engine.speculative import DRAFT_METHODS, Entrant, RaceRow, draft_for, run_race

RESULTS = Path(__file__).parent / "results"
PROMPTS = {
    "copy-heavy": ("Fix the spelling in this sentence and write it out again: The wether in Lndon was cold and "
                   "rainy, so we stayed insid and read books all afternon.", True),
    "free-form": ("The history of the printing press", False),
    "chat": ("Explain why the sky is blue.", True),
}
KS = (2, 4, 8)


def entrants(methods: list[str], make, ks: tuple[int, ...]) -> list[Entrant]:
    """Each method at each k, a fresh draft per run (lookahead's pools and the heads' state start empty)."""
    return [Entrant(method, lambda method=method: make(method), k) for method in methods for k in ks]


def verify_logit_gap(lm: LoadedModel, prompt: str, chat: bool, continuation: tuple[int, ...], k: int) -> float:
    """max |logit difference| between one verify pass over k + 1 positions and the same positions
    decoded one token per pass, from the same cache."""
    context = Generation(lm, prompt, chat=chat).prompt_ids
    fed = [context[-1], *continuation[:k]]
    one_by_one, cache = [], new_cache(lm)
    forward_one(lm, context[:-1], cache)
    for token in fed:
        one_by_one.append(forward_one(lm, [token], cache))
    cache = new_cache(lm)
    forward_one(lm, context[:-1], cache)
    return float((forward_all(lm, fed, cache) - torch.stack(one_by_one)).abs().max())


def warm_up(lm: LoadedModel, methods: list[str], make) -> None:
    """The lone and verify passes' probes decided (seconds, which the first timed run would
    otherwise pay), then a few untimed tokens of plain decoding and of each method,
    for whatever else a first call pays."""
    lone_pass_decision(lm)
    verify_pass_decision(lm)
    run_race(lm, *PROMPTS["free-form"], entrants(methods, make, KS[:1]), tokens=4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--methods", default="prompt-lookup,int8,bfloat16",
                        help=f"comma-separated, of {', '.join(DRAFT_METHODS)} (int8 and bfloat16: the self-drafts)")
    parser.add_argument("--out", default="speculative_bench.json", help="file name under bench/results/")
    args = parser.parse_args()
    lm = load_model()
    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in ("int8", "bfloat16", *DRAFT_METHODS)]
    if unknown:
        raise SystemExit(f"unknown method {', '.join(unknown)}: one of int8, bfloat16, {', '.join(DRAFT_METHODS)}")
    drafts = {kind: self_draft(lm, kind) for kind in ("int8", "bfloat16") if kind in methods}  # copied once

    def make(method: str):  # a fresh method each run: lookahead's pools and the heads' state start empty
        if method in drafts:
            return DraftModel(drafts[method], lm)
        return PromptLookup(lm.eos_ids) if method == "prompt-lookup" else draft_for(lm, method)

    warm_up(lm, methods, make)
    runs: dict[tuple[str, str, int], list[RaceRow]] = {}
    for round_number in range(args.rounds):
        for name, (prompt, chat) in PROMPTS.items():
            result = run_race(lm, prompt, chat, entrants(methods, make, KS), args.tokens)
            if result.skipped:  # a bench measures every method it was asked for, or says why not
                raise SystemExit("; ".join(f"{s.label}: {s.reason}" for s in result.skipped))
            runs.setdefault((name, "plain", 1), []).append(result.plain)
            plain_ids = runs[(name, "plain", 1)][0].ids
            for run in result.rows:
                runs.setdefault((name, run.label, run.k), []).append(run)
                if run.ids != plain_ids:
                    raise SystemExit(f"{run.label} k={run.k} on {name} gave other tokens than plain decoding")
        print(f"round {round_number + 1}/{args.rounds} done", flush=True)

    rows = []
    for (name, method, k), results in runs.items():
        per_token = [r.seconds / r.tokens * 1e3 for r in results]
        plain = [r.seconds / r.tokens * 1e3 for r in runs[(name, "plain", 1)]]
        first = results[0]
        rows.append({"prompt": name, "method": method, "k": None if method == "plain" else k,
                     "ms_per_token": statistics.median(per_token), "fastest_ms_per_token": min(per_token),
                     "speedup": statistics.median(plain) / statistics.median(per_token),
                     "speedup_fastest": min(plain) / min(per_token), "tokens": first.tokens,
                     "target_passes": first.passes, "tokens_per_pass": first.tokens_per_pass,
                     "acceptance": first.acceptance,
                     "overhead_ms_per_pass": statistics.median(r.overhead_ms for r in results),
                     "runs_ms_per_token": [r.seconds / r.tokens * 1e3 for r in results]})
    gaps = {f"k={k}": verify_logit_gap(lm, *PROMPTS["copy-heavy"], runs[("copy-heavy", "plain", 1)][0].ids, k)
            for k in KS}
    print(f"\n{'prompt':<11} {'method':<14} {'k':>2} {'ms/token':>9} {'speed-up':>9} {'fastest':>8} "
          f"{'speed-up':>9} {'tok/pass':>9} {'accept':>7} {'overhead':>9}")
    for row in rows:
        acceptance = "" if row["acceptance"] is None else f"{row['acceptance']:.2f}"
        print(f"{row['prompt']:<11} {row['method']:<14} {row['k'] or '':>2} {row['ms_per_token']:>9.1f} "
              f"{row['speedup']:>8.2f}x {row['fastest_ms_per_token']:>8.1f} {row['speedup_fastest']:>8.2f}x "
              f"{row['tokens_per_pass']:>9.2f} {acceptance:>7} {row['overhead_ms_per_pass']:>6.1f} ms")
    print("max |logit difference|, verify pass vs one-token decode:", {k: f"{v:.2g}" for k, v in gaps.items()})
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / args.out
    out.write_text(json.dumps({"rounds": args.rounds, "tokens": args.tokens, "threads": torch.get_num_threads(),
                               "rows": rows, "verify_logit_gap": gaps,
                               "note": "median and fastest of interleaved rounds on a shared machine"}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
