"""How far a packed (batched) decode pass moves a visitor's numbers from the lone pass's.

    .venv/bin/python -m bench.batch_parity [--steps 12] [--batches 2,4,8,16,30]

For each batch size B: B visitors with different prompts (so different cache lengths) step
together. At every step each visitor's next-token logits come from ONE "fast" packed pass
(engine.serving.packed.forward_packed, one matrix product for all rows) and, for comparison, from its
own lone batch-1 pass over the same cache (a prefix view, so the comparison pass leaves the
cache untouched). The "exact" packed pass (row by row) is run on the same caches too and must
differ by 0. Reported:
  - max |Δ logit| and max |Δ softmax probability| over every token of the vocabulary;
  - greedy flips (the argmax differs) and sampled flips (the same uniform draw picks another
    token, temperature 0.9, top-p 0.95);
  - shown-number flips: among each step's 50 leading candidates, how many probabilities
    print differently as the UI prints them (ui.views.format.prob: 4 decimals; pct with 2 decimals)
    and how many logits print differently with 2 decimals (the logit chart's labels).
The visitors follow the lone pass's greedy picks, so both see the same contexts.
Writes bench/results/batch_parity.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from engine import SamplerSettings, load_model
from engine.forward import cache_prefix, forward_one, new_cache
from engine.sampling import InverseCdf, decide
from engine.serving.packed import forward_packed
from ui.views.format import pct, prob

RESULTS = Path(__file__).parent / "results"
SAMPLED = SamplerSettings(temperature=0.9, top_p=0.95)
SHOWN = 50  # candidates a step records and a page can show
PROMPTS = [
    "The capital of France is", "Once upon a time, in a small village by the sea,", "def fibonacci(n):",
    "Roses are red,", "In 1492 Columbus sailed", "The quick brown fox", "Water boils at",
    "My favourite food is", "The best way to learn a language is", "Photosynthesis is the process",
    "Write a haiku about autumn.", "List three prime numbers:", "The mitochondria is",
    "import numpy as np\n", "Dear Sir or Madam,", "Translate to French: good morning",
]


def prompt_ids(lm, count: int) -> list[list[int]]:
    """`count` prompts of different lengths (each repeat gets a longer tail)."""
    return [lm.tokenizer(PROMPTS[i % len(PROMPTS)] + " and" * (i // len(PROMPTS)))["input_ids"]
            for i in range(count)]


def shown_flips(lone: torch.Tensor, packed: torch.Tensor) -> dict[str, int]:
    """Leading candidates whose printed numbers differ between the two passes."""
    ids = torch.topk(lone, SHOWN).indices
    lp, pp = lone.softmax(-1)[ids].tolist(), packed.softmax(-1)[ids].tolist()
    ll, pl = lone[ids].tolist(), packed[ids].tolist()
    return {"prob_4dp": sum(prob(a) != prob(b) for a, b in zip(lp, pp, strict=True)),
            "pct_2dp": sum(pct(a, 2) != pct(b, 2) for a, b in zip(lp, pp, strict=True)),
            "logit_2dp": sum(f"{a:.2f}" != f"{b:.2f}" for a, b in zip(ll, pl, strict=True)),
            "shown": SHOWN}


def measure_batch(lm, batch: int, steps: int, seed: int) -> dict[str, float]:
    generator = torch.Generator().manual_seed(seed)
    caches, last, contexts = [], [], []
    for ids in prompt_ids(lm, batch):
        cache = new_cache(lm)
        forward_one(lm, ids[:-1], cache)
        caches.append(cache)
        last.append(ids[-1])
        contexts.append(list(ids))
    worst = {"logit": 0.0, "prob": 0.0, "exact": 0.0}
    counts = {"rows": 0, "greedy_flips": 0, "sampled_flips": 0, "prob_4dp": 0, "pct_2dp": 0, "logit_2dp": 0,
              "shown": 0}
    for _ in range(steps):
        lone = torch.stack([forward_one(lm, [t], cache_prefix(c, c.get_seq_length())) for t, c in zip(last, caches,
                                                                                                       strict=True)])
        views = [cache_prefix(c, c.get_seq_length()) for c in caches]
        worst["exact"] = max(worst["exact"], (forward_packed(lm, last, views, exact=True) - lone).abs().max().item())
        packed = forward_packed(lm, last, caches, exact=False)  # [batch, vocab]
        worst["logit"] = max(worst["logit"], (packed - lone).abs().max().item())
        worst["prob"] = max(worst["prob"], (packed.softmax(-1) - lone.softmax(-1)).abs().max().item())
        counts["rows"] += batch
        counts["greedy_flips"] += int((packed.argmax(-1) != lone.argmax(-1)).sum())
        for row in range(batch):
            u = float(torch.rand((), generator=generator))
            context = torch.tensor(contexts[row])
            picks = [decide(x[row], context, SAMPLED, InverseCdf(u))[0].token_id for x in (lone, packed)]
            counts["sampled_flips"] += picks[0] != picks[1]
            for key, value in shown_flips(lone[row], packed[row]).items():
                counts[key] += value
        last = lone.argmax(-1).tolist()
        for context, token in zip(contexts, last, strict=True):
            context.append(token)
    return {"batch": batch, "steps": steps, "max_abs_logit_diff": worst["logit"], "max_abs_prob_diff": worst["prob"],
            "exact_max_abs_logit_diff": worst["exact"], **counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batches", default="2,4,8,16,30")
    args = parser.parse_args()
    lm = load_model()
    started = time.perf_counter()
    print(f"{'batch':>5} {'steps':>5} {'max|Δlogit|':>12} {'max|Δprob|':>11} {'greedy':>7} {'sampled':>8} "
          f"{'prob 4dp':>9} {'pct 2dp':>8} {'logit 2dp':>10}  (flips, of rows / of shown numbers)  exact: max|Δlogit|")
    rows = []
    for batch in args.batches.split(","):
        r = measure_batch(lm, int(batch), args.steps, seed=int(batch))
        rows.append(r)
        print(f"{r['batch']:>5} {r['steps']:>5} {r['max_abs_logit_diff']:>12.2e} {r['max_abs_prob_diff']:>11.2e} "
              f"{r['greedy_flips']:>3}/{r['rows']:<4}{r['sampled_flips']:>3}/{r['rows']:<4} "
              f"{r['prob_4dp']:>4}/{r['shown']:<5}{r['pct_2dp']:>4}/{r['shown']:<5}{r['logit_2dp']:>4}/{r['shown']}"
              f"  {r['exact_max_abs_logit_diff']:g}", flush=True)
    print(f"({time.perf_counter() - started:.0f} s)")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "batch_parity.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
