"""The trained draft methods against plain decoding: tokens per forward pass, acceptance per
guessed position, and wall time per token, greedy, on free-form prompts (none of them in
training/prompts.txt; prompt lookup and the copy-heavy prompt are bench.speculative_bench's).

    .venv/bin/python -m bench.heads_bench [--rounds 2] [--tokens 40] [--threads N]

Methods: plain decoding (engine.Generation), Medusa heads (k = 1 and 3 on the draft vocabulary, 3
on the whole LM head) and the MTP module (k = 1, 2, 3 on the draft vocabulary; k = 3 on the whole head).
Every configuration runs once per round and the rounds are interleaved, so all see the same
machine; the median and the fastest round are kept. Each run must give plain decoding's tokens
exactly. Beside each speed-up: the measured acceptance α (kept
/ checked), the tokens a round adds if each guess survived with probability α independently,
(1 - α^(k+1)) / (1 - α), and the tokens per round measured. Writes
bench/results/heads_bench.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engine import Generation, LoadedModel, SamplerSettings, StopSettings, load_model
from engine.speculative.generation import SpeculativeGeneration
from engine.speculative.heads import MedusaHeads, MtpDraft
from engine.speculative.rule import expected_tokens_per_round

RESULTS = Path(__file__).parent / "results"
PROMPTS = {  # name: (prompt, chat)
    "free-form": ("The history of the printing press", False),
    "chat": ("Explain why the sky is blue.", True),
    "story": ("Write a short story about a lighthouse on the moon.", True),
    "essay": ("The best thing about living near the sea is", False),
    "question": ("How do submarines dive and come back up?", True),
}
GREEDY = SamplerSettings(temperature=0)
# (label, factory key, k): k is the most a round guesses; the drafts stop sooner when unsure
# (engine/speculative/heads.py GO_ON), except the "every guess" rows, which always guess k
CONFIGS = [("plain", "plain", 1), ("medusa-heads", "medusa", 1), ("medusa-heads", "medusa", 3),
           ("medusa-heads, every guess", "medusa-all", 3), ("medusa-heads, whole head", "medusa-full", 3),
           ("mtp", "mtp", 1), ("mtp", "mtp", 2), ("mtp", "mtp", 3), ("mtp", "mtp", 4),
           ("mtp, every guess", "mtp-all", 2), ("mtp, every guess", "mtp-all", 3), ("mtp, whole head", "mtp-full", 3)]
SURE_BANDS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)  # the draft's probability of its guess


@dataclass(frozen=True)
class Run:
    seconds: float
    ids: tuple[int, ...]
    passes: int
    checked_at: tuple[int, ...]  # per guessed position: rounds that checked it
    accepted_at: tuple[int, ...]  # per guessed position: rounds that kept it
    draft_ms: float  # median per round


def run_plain(lm: LoadedModel, prompt: str, chat: bool, tokens: int) -> Run:
    generation = Generation(lm, prompt, chat=chat, sampler=GREEDY, stop=StopSettings(max_new_tokens=tokens))
    started = time.perf_counter()
    list(generation.run())
    seconds = time.perf_counter() - started
    return Run(seconds, tuple(generation.generated_ids), len(generation.steps), (), (), 0.0)


def run_speculative(lm: LoadedModel, prompt: str, chat: bool, tokens: int, draft, k: int) -> Run:
    generation = SpeculativeGeneration(lm, prompt, chat=chat, draft=draft, k=k, sampler=GREEDY,
                                       stop=StopSettings(max_new_tokens=tokens))
    started = time.perf_counter()
    list(generation.run())
    seconds = time.perf_counter() - started
    rounds = generation.rounds
    checked = [sum(len(r.checks) > i for r in rounds) for i in range(k)]
    accepted = [sum(r.accepted > i for r in rounds) for i in range(k)]
    return Run(seconds, tuple(generation.generated_ids), len(rounds), tuple(checked), tuple(accepted),
               statistics.median(r.timing.draft_ms for r in rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--prompts", default=",".join(PROMPTS), help="comma-separated names of PROMPTS")
    parser.add_argument("--out", default="heads_bench.json", help="file name under bench/results/")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_model()
    drafts = {"medusa": MedusaHeads(lm), "medusa-all": MedusaHeads(lm, go_on=0.0),
              "medusa-full": MedusaHeads(lm, full_head=True),
              "mtp": MtpDraft(lm), "mtp-all": MtpDraft(lm, go_on=0.0), "mtp-full": MtpDraft(lm, full_head=True)}
    names = args.prompts.split(",")
    runs: dict[tuple[str, str, int], list[Run]] = {}
    for round_number in range(args.rounds):
        for name in names:
            prompt, chat = PROMPTS[name]
            for label, key, k in CONFIGS:
                run = (run_plain(lm, prompt, chat, args.tokens) if key == "plain"
                       else run_speculative(lm, prompt, chat, args.tokens, drafts[key], k))
                runs.setdefault((name, label, k), []).append(run)
                if run.ids != runs[(name, "plain", 1)][0].ids:
                    raise SystemExit(f"{label} k={k} on {name} gave other tokens than plain decoding")
        print(f"round {round_number + 1}/{args.rounds} done", flush=True)
    rows = [summary(name, label, k, results, runs[(name, "plain", 1)]) for (name, label, k), results in runs.items()]
    print_table(rows)
    bands = kept_by_sureness(lm, drafts["mtp-all"], names, args.tokens)
    print_bands(bands)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / args.out
    out.write_text(json.dumps({"threads": torch.get_num_threads(), "tokens": args.tokens, "rounds": args.rounds,
                               "rows": rows, "mtp_kept_by_sureness": bands}, indent=1))
    print(f"wrote {out}")


def summary(name: str, label: str, k: int, results: list[Run], plain: list[Run]) -> dict:
    per_token = [r.seconds / len(r.ids) * 1e3 for r in results]
    plain_per_token = [r.seconds / len(r.ids) * 1e3 for r in plain]
    first = results[0]
    checked, accepted = sum(first.checked_at), sum(first.accepted_at)
    alpha = accepted / checked if checked else None
    return {"prompt": name, "method": label, "k": None if label == "plain" else k,
            "ms_per_token": statistics.median(per_token), "fastest_ms_per_token": min(per_token),
            "speedup": statistics.median(plain_per_token) / statistics.median(per_token),
            "speedup_fastest": min(plain_per_token) / min(per_token),
            "tokens": len(first.ids), "target_passes": first.passes, "tokens_per_pass": len(first.ids) / first.passes,
            "alpha": alpha, "expected_tokens_per_round": expected_tokens_per_round(alpha, k) if alpha else None,
            "acceptance_per_position": [round(a / c, 3) if c else None
                                        for a, c in zip(first.accepted_at, first.checked_at, strict=True)],
            "draft_ms_per_round": statistics.median(r.draft_ms for r in results),
            "runs_ms_per_token": per_token}


def kept_by_sureness(lm: LoadedModel, draft: MtpDraft, names: list[str], tokens: int, k: int = 4) -> list[dict]:
    """How often the target kept an MTP guess, by the draft's own probability of it (its
    softmax, what GO_ON reads), from untimed runs that always guess k: per band, the guesses
    checked and kept at the first position and at the later ones."""
    checked, kept = {}, {}
    draft.picturing = True
    try:
        for name in names:
            prompt, chat = PROMPTS[name]
            generation = SpeculativeGeneration(lm, prompt, chat=chat, draft=draft, k=k, sampler=GREEDY,
                                               stop=StopSettings(max_new_tokens=tokens))
            while not generation.finished:
                record = generation.step()
                picture = draft.last_picture
                for check in record.checks if picture is not None else ():
                    sure = picture.leaders[check.index][0].prob  # greedy guesses the draft's own top token
                    band = (min(int(sure * 10), 9), "first" if check.index == 0 else "later")
                    checked[band] = checked.get(band, 0) + 1
                    kept[band] = kept.get(band, 0) + check.accepted
    finally:
        draft.picturing = False
    return [{"from": SURE_BANDS[b], "to": SURE_BANDS[b + 1], "position": where, "checked": checked[(b, where)],
             "kept": kept[(b, where)]} for (b, where) in sorted(checked)]


def print_bands(bands: list[dict]) -> None:
    print("\nMTP guesses kept, by the draft's probability of the guess (every guess made, k = 4):")
    for where in ("first", "later"):
        cells = [f"{b['from']:.1f}-{b['to']:.1f}: {b['kept']}/{b['checked']}" for b in bands if b["position"] == where]
        print(f"  {where:<6} " + "  ".join(cells))


def print_table(rows: list[dict]) -> None:
    print(f"\n{'prompt':<10} {'method':<25} {'k':>2} {'ms/tok':>7} {'speed-up':>8} {'fastest':>8} {'tok/pass':>8} "
          f"{'alpha':>6} {'formula':>7} {'draft ms':>8}  acceptance per position")
    for row in rows:
        alpha = "" if row["alpha"] is None else f"{row['alpha']:.2f}"
        formula = "" if row["expected_tokens_per_round"] is None else f"{row['expected_tokens_per_round']:.2f}"
        positions = " ".join("-" if a is None else f"{a:.2f}" for a in row["acceptance_per_position"])
        print(f"{row['prompt']:<10} {row['method']:<25} {row['k'] or '':>2} {row['ms_per_token']:>7.1f} "
              f"{row['speedup']:>7.2f}x {row['speedup_fastest']:>7.2f}x {row['tokens_per_pass']:>8.2f} {alpha:>6} "
              f"{formula:>7} {row['draft_ms_per_round']:>8.2f}  {positions}")


if __name__ == "__main__":
    main()
