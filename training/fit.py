"""What both training scripts share: the run's settings, the reduced-vocabulary targets, the
optimiser and its schedule, the log, and writing the weights with their manifest entry."""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from engine import load_model
from engine.loading import LoadedModel
from engine.speculative.heads import MANIFEST, MANIFEST_FORMAT, sha256_of
from training.distill import Distilled, Recipe, Sequences, distill, draft_vocabulary

# One thread, not two: on a 2-core machine that other work shares, a two-thread product waits
# for a core at every split (a decode step measured 0.2-2.9 s on two threads, 0.26-0.39 s on
# one, batch 48, while another job ran); one thread is also what makes the run reproducible.
THREADS = 1
IGNORE = -100  # a target outside the draft vocabulary (or past the sequence's end): no loss, counted as a miss


@dataclass(frozen=True)
class RunConfig:
    """One training run's settings (recorded in the manifest)."""

    seed: int = 0
    epochs: int = 4
    batch: int = 512  # rows (hidden states) per optimiser step
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 30
    draft_vocab: int = 8192  # LM-head rows the draft reads (most frequent tokens of the training data)
    soft_weight: float = 0.5  # share of the loss on the target's own distribution (the rest: its greedy token)


class Log:
    """Prints each line and appends it to a log file."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")

    def __call__(self, line: str) -> None:
        print(line, flush=True)
        if self.path is not None:
            with self.path.open("a") as handle:
                handle.write(line + "\n")


def arguments(description: str, default_log: Path, defaults: RunConfig,
              max_new_tokens: int = Recipe.max_new_tokens) -> argparse.Namespace:
    """The command line both scripts take (the defaults: the run that made the shipped weights)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--epochs", type=int, default=defaults.epochs)
    parser.add_argument("--batch", type=int, default=defaults.batch)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--draft-vocab", type=int, default=defaults.draft_vocab)
    parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens, help="the continuations' length")
    parser.add_argument("--prompts", type=int, default=None, help="use only the first n prompts (a smoke run)")
    parser.add_argument("--out", type=Path, default=MANIFEST.parent, help="folder for the weights and manifest")
    parser.add_argument("--log", type=Path, default=default_log)
    parser.add_argument("--cache", type=Path, default=None, help="distillation-data cache folder")
    parser.add_argument("--threads", type=int, default=THREADS, help="torch threads (see THREADS)")
    return parser.parse_args()


def prepare(args: argparse.Namespace, log: Log) -> tuple[LoadedModel, Distilled]:
    torch.set_num_threads(args.threads)
    lm = load_model()
    recipe = Recipe(max_new_tokens=args.max_new_tokens, prompt_limit=args.prompts)
    return lm, distill(lm, recipe, cache=args.cache, log=log)


def reduced_index(vocab_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """`[vocab_size]`: each token's place in the draft vocabulary, IGNORE outside it."""
    index = torch.full((vocab_size,), IGNORE, dtype=torch.long)
    index[vocab_ids] = torch.arange(vocab_ids.numel())
    return index


def offsets(seqs: Sequences, shifts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every row as (hidden `[N, H]`, own token `[N]`, row index `[N, shifts]`): column s is the
    flat index of the row s + 1 places on in the same sequence, or -1 past its end."""
    hidden = torch.cat(seqs.hidden)
    tokens = torch.cat(seqs.tokens)
    ahead = []
    start = 0
    for seq in seqs.tokens:
        n = seq.numel()
        rows = torch.arange(n).unsqueeze(1) + torch.arange(1, shifts + 1)  # [n, shifts]
        ahead.append(torch.where(rows < n, rows + start, -1))
        start += n
    return hidden, tokens, torch.cat(ahead)


def schedule(step: int, total: int, warmup: int) -> float:
    """Linear warm-up, then cosine decay to 10 %."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def batches(rows: int, batch: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    order = torch.randperm(rows, generator=generator)
    for start in range(0, rows, batch):
        yield order[start:start + batch]


def train_loop(net: nn.Module, rows: int, config: RunConfig, loss_of: Callable[[torch.Tensor], torch.Tensor],
               evaluate: Callable[[], dict], log: Log) -> list[dict]:
    """AdamW over shuffled row batches for `config.epochs`, evaluating after each epoch."""
    generator = torch.Generator().manual_seed(config.seed)
    optimiser = torch.optim.AdamW(net.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    total = config.epochs * math.ceil(rows / config.batch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: schedule(s, total, config.warmup_steps))
    history, step, started = [], 0, time.perf_counter()
    for epoch in range(1, config.epochs + 1):
        net.train()
        losses = []
        for index in batches(rows, config.batch, generator):
            loss = loss_of(index)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            scheduler.step()
            losses.append(loss.item())
            step += 1
        net.eval()
        with torch.no_grad():
            figures = evaluate()
        figures = {"epoch": epoch, "train_loss": round(sum(losses) / len(losses), 4), **figures,
                   "seconds": round(time.perf_counter() - started, 1)}
        history.append(figures)
        log(json.dumps(figures))
    return history


def save(method: str, net: nn.Module, vocab_ids: torch.Tensor, out: Path, entry: dict) -> dict:
    """The weights as fp16 safetensors (the draft vocabulary as int32) and the method's manifest
    entry with the file's SHA-256; the other method's entry is kept."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{method.replace('-', '_')}.safetensors"
    tensors = {name: value.detach().to(torch.float16).contiguous() for name, value in net.state_dict().items()}
    tensors["vocab_ids"] = vocab_ids.to(torch.int32)
    save_file(tensors, str(path))
    manifest_path = out / MANIFEST.name
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    manifest["format"] = MANIFEST_FORMAT
    entry = {"file": path.name, "sha256": sha256_of(path), "bytes": path.stat().st_size, **entry}
    manifest[method] = entry
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    # loaded back as the engine loads it: the fp16 round trip is what ships
    return entry


def finish(method: str, net: nn.Module, lm: LoadedModel, data: Distilled, config: RunConfig,
           vocab_ids: torch.Tensor, out: Path, log: Log, net_config: dict, history: list[dict], full: dict,
           started: float) -> dict:
    """Log the whole-head figures, save the weights and return the manifest entry: the
    network's config, the run's settings, the data recipe, every epoch's held-out figures."""
    log(f"held-out with the whole LM head (49k rows) instead of the draft vocabulary: {full}")
    held = torch.cat(data.held.tokens)
    covered = float(torch.isin(held, vocab_ids).float().mean()) if held.numel() else 0.0
    entry = {"trained_for": lm.name, "run": asdict(config), "data": data.info,
             "draft_vocab_coverage_held_out": round(covered, 4),
             "config": {"hidden_size": int(lm.model.config.get_text_config().hidden_size),
                        "vocab_size": lm.vocab_size, "draft_vocab": vocab_ids.numel(), **net_config},
             "history": history, "held_out": history[-1] if history else {}, "held_out_full_head": full,
             "train_seconds": round(time.perf_counter() - started, 1)}
    return save(method, net, vocab_ids, out, entry)


def script(description: str, default_log: Path, defaults: RunConfig,
           train: Callable[[LoadedModel, Distilled, RunConfig, Path, Log], dict],
           max_new_tokens: int = Recipe.max_new_tokens) -> None:
    """A training script's main: arguments, the model and its data, the run, a last line."""
    args = arguments(description, default_log, defaults, max_new_tokens)
    log = Log(args.log)
    started = time.perf_counter()
    lm, data = prepare(args, log)
    config = replace(defaults, seed=args.seed, epochs=args.epochs, batch=args.batch, lr=args.lr,
                     draft_vocab=args.draft_vocab)
    entry = train(lm, data, config, args.out, log)
    log(f"wrote {args.out / entry['file']} ({entry['bytes']:,} bytes, sha256 {entry['sha256']}); "
        f"whole run {time.perf_counter() - started:.0f} s")


def draft_vocab_for(lm: LoadedModel, data: Distilled, config: RunConfig, log: Log) -> torch.Tensor:
    vocab_ids = draft_vocabulary(lm, data.train, config.draft_vocab)
    held = torch.cat(data.held.tokens)
    if held.numel():
        log(f"draft vocabulary: {vocab_ids.numel():,} tokens cover "
            f"{float(torch.isin(held, vocab_ids).float().mean()):.1%} of the held-out continuations' tokens")
    return vocab_ids
