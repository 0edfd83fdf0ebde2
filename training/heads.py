"""Train K Medusa-style heads for the bundled model by self-distillation.

    .venv/bin/python -m training.heads [--epochs 3] [--seed 0] [--draft-vocab 8192] [--prompts N]

Head i (i = 1..K) reads the target's last hidden state h_t (after the final norm; through the
LM head it predicts token t+1) and predicts token t+1+i: out_i = h + SiLU(W_i h + b_i), then
the model's frozen LM head restricted to the draft vocabulary. The loss is the target's own
greedy token at t+1+i (cross-entropy) mixed with its distribution there (the LM head on the
target's state at that position). Only W_i, b_i learn. Writes assets/medusa_heads.safetensors,
its entry in assets/draft_heads.json and training/heads.log (loss and per-head top-1 accuracy
on held-out prompts after every epoch).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from engine.loading import LoadedModel
from engine.speculative.heads import MEDUSA, MedusaNet
from training.distill import Distilled
from training.fit import (
    IGNORE,
    Log,
    RunConfig,
    draft_vocab_for,
    finish,
    offsets,
    reduced_index,
    script,
    train_loop,
)

HEADS = 3
# small batches: a few hundred optimiser steps per epoch on ~40k rows (512 gave 75 steps and
# head 1 at 20 % top-1 after an epoch)
DEFAULTS = RunConfig(epochs=3, batch=128, lr=3e-3)
LOG = Path(__file__).parent / "heads.log"
EVAL_CHUNK = 1024


def _targets(tokens: torch.Tensor, ahead: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`[n, K]` the tokens heads 1..K must guess, IGNORE past the sequence's end."""
    rows = ahead[index]
    return torch.where(rows >= 0, tokens[rows.clamp(min=0)], IGNORE)


def head_accuracy(net: MedusaNet, rows: torch.Tensor, hidden: torch.Tensor, tokens: torch.Tensor,
                  ahead: torch.Tensor, head_rows: torch.Tensor, vocab_ids: torch.Tensor | None) -> dict:
    """Per head: top-1 accuracy over the rows it has a target for; per depth d: the share of
    rows where heads 1..d are all right (what a greedy round accepts), and the tokens a round of
    K guesses adds on average, 1 + sum of those."""
    correct, valid = [], []
    for start in range(0, rows.numel(), EVAL_CHUNK):
        index = rows[start:start + EVAL_CHUNK]
        scores = (net(hidden[index]) @ head_rows.T).argmax(-1)  # [n, K] in the head's rows
        guess = scores if vocab_ids is None else vocab_ids[scores]
        target = _targets(tokens, ahead, index)
        correct.append(guess == target)
        valid.append(target != IGNORE)
    right, has = torch.cat(correct), torch.cat(valid)
    per_head = [float(right[has[:, i], i].float().mean()) for i in range(right.shape[1])]
    full = has.all(dim=1)  # rows with a target for every head: the chain measured on the same rows
    chain = [float(right[full, :d + 1].all(dim=1).float().mean()) for d in range(right.shape[1])]
    return {"top1": [round(a, 4) for a in per_head], "chain": [round(c, 4) for c in chain],
            "tokens_per_round": round(1 + sum(chain), 3)}


def train_heads(lm: LoadedModel, data: Distilled, config: RunConfig, out: Path, log: Log,
                heads: int = HEADS) -> dict:
    """Train the heads on `data`, save them in `out`, and return their manifest entry."""
    started = time.perf_counter()
    torch.manual_seed(config.seed)
    head = lm.model.get_output_embeddings().weight.detach()  # [vocab, hidden], frozen
    vocab_ids = draft_vocab_for(lm, data, config, log)
    head_rows = head[vocab_ids].contiguous()  # [V, hidden]
    to_reduced = reduced_index(vocab_ids, lm.vocab_size)
    hidden, tokens, ahead = offsets(data.train, heads)
    held_hidden, held_tokens, held_ahead = offsets(data.held, heads)
    held_rows = torch.arange(held_tokens.numel())
    size = int(lm.model.config.get_text_config().hidden_size)
    net = MedusaNet(size, heads)

    def loss_of(index: torch.Tensor) -> torch.Tensor:
        rows = ahead[index]  # [n, K]
        valid = rows >= 0
        logits = net(hidden[index]) @ head_rows.T  # [n, K, V]
        labels = torch.where(valid, to_reduced[tokens[rows.clamp(min=0)]], IGNORE)
        hard = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
        with torch.no_grad():
            teacher = (hidden[rows.clamp(min=0)] @ head_rows.T).softmax(-1)  # [n, K, V] the target's own p
        soft = -(teacher * logits.log_softmax(-1)).sum(-1)[valid].mean()
        return (1 - config.soft_weight) * hard + config.soft_weight * soft

    def evaluate() -> dict:
        return head_accuracy(net, held_rows, held_hidden, held_tokens, held_ahead, head_rows, vocab_ids)

    log(f"medusa heads: K={heads}, {hidden.shape[0]:,} training rows, {held_rows.numel():,} held-out rows, "
        f"{sum(p.numel() for p in net.parameters()):,} parameters")
    history = train_loop(net, hidden.shape[0], config, loss_of, evaluate, log)
    with torch.no_grad():
        full = head_accuracy(net, held_rows, held_hidden, held_tokens, held_ahead, head, None)
    return finish(MEDUSA, net, lm, data, config, vocab_ids, out, log, {"heads": heads}, history, full, started)


def main() -> None:
    script(__doc__.splitlines()[0], LOG, DEFAULTS, train_heads)


if __name__ == "__main__":
    main()
