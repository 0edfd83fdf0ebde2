"""Train one DeepSeek-V3-style multi-token-prediction module for the bundled model by
self-distillation, as a draft that feeds its own output back.

    .venv/bin/python -m training.mtp [--epochs 8] [--max-new-tokens 320] [--seed 0] [--draft-vocab 8192] [--prompts N]

The module reads the target's state h_t (after the final norm) and the embedding of token t+1
(the model's own, frozen) and predicts the target's state at t+1; the frozen LM head on that
predicts token t+2. Drafting feeds the predicted state back with the next guess's embedding,
so training unrolls the same way (`--unroll` steps, each step's input state the previous
step's output; the tokens are the target's, as they are in every round until a guess is
rejected). The loss per step: the target's greedy token and its distribution (cross-entropy,
on the draft vocabulary) plus a smooth-L1 pull of the predicted state towards the target's.
Writes assets/mtp.safetensors, its entry in assets/draft_heads.json and training/mtp.log.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from engine.loading import LoadedModel
from engine.speculative.heads import MTP, MtpNet
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

UNROLL = 3  # training steps fed their own state (drafting feeds it k times)
EVAL_DEPTH = 5  # steps measured on held-out rows
BLOCKS = 1
STATE_WEIGHT = 1.0  # of the smooth-L1 pull towards the target's state, beside the token loss
LOG = Path(__file__).parent / "mtp.log"
# the shipped run: continuations of up to 320 tokens (66 k training tokens), 8 epochs; the first
# module had 160 tokens (38 k) and 3 epochs, and its held-out top-1 was still rising (0.25 / 0.30 / 0.32)
DEFAULTS = RunConfig(epochs=8, batch=256, lr=1e-3, weight_decay=0.01)
MAX_NEW_TOKENS = 320
EVAL_CHUNK = 1024


def mtp_accuracy(net: MtpNet, hidden: torch.Tensor, tokens: torch.Tensor, ahead: torch.Tensor,
                 embeddings: torch.Tensor, head_rows: torch.Tensor, vocab_ids: torch.Tensor | None,
                 depth: int) -> dict:
    """Step d's top-1 accuracy (its own state fed back, the target's tokens fed in) over rows
    with d tokens ahead, and the share of rows whose first d guesses are all right."""
    steps_right, steps_valid = [], []
    for start in range(0, hidden.shape[0], EVAL_CHUNK):
        index = torch.arange(start, min(start + EVAL_CHUNK, hidden.shape[0]))
        state, token = hidden[index], tokens[index]
        right, valid = [], []
        for d in range(depth):
            rows = ahead[index, d]
            ok = rows >= 0
            state = net(state, embeddings[token])
            guess = (state @ head_rows.T).argmax(-1)
            guess = guess if vocab_ids is None else vocab_ids[guess]
            target = torch.where(ok, tokens[rows.clamp(min=0)], IGNORE)
            right.append(guess == target)
            valid.append(ok)
            token = target.clamp(min=0)
        steps_right.append(torch.stack(right, 1))
        steps_valid.append(torch.stack(valid, 1))
    right, has = torch.cat(steps_right), torch.cat(steps_valid)
    per_step = [float(right[has[:, d], d].float().mean()) for d in range(depth)]
    full = has.all(dim=1)
    chain = [float(right[full, :d + 1].all(dim=1).float().mean()) for d in range(depth)]
    return {"top1": [round(a, 4) for a in per_step], "chain": [round(c, 4) for c in chain],
            "tokens_per_round_k3": round(1 + sum(chain[:3]), 3), "tokens_per_round_k5": round(1 + sum(chain), 3)}


def train_mtp(lm: LoadedModel, data: Distilled, config: RunConfig, out: Path, log: Log, blocks: int = BLOCKS,
              unroll: int = UNROLL) -> dict:
    """Train the module on `data`, save it in `out`, and return its manifest entry."""
    started = time.perf_counter()
    torch.manual_seed(config.seed)
    text = lm.model.config.get_text_config()
    head = lm.model.get_output_embeddings().weight.detach()  # [vocab, hidden], frozen
    embeddings = lm.model.get_input_embeddings().weight.detach()  # [vocab, hidden], frozen (tied)
    vocab_ids = draft_vocab_for(lm, data, config, log)
    head_rows = head[vocab_ids].contiguous()
    to_reduced = reduced_index(vocab_ids, lm.vocab_size)
    hidden, tokens, ahead = offsets(data.train, max(unroll, EVAL_DEPTH))
    held_hidden, held_tokens, held_ahead = offsets(data.held, EVAL_DEPTH)
    net = MtpNet(text.hidden_size, text.intermediate_size, blocks, text.rms_norm_eps)
    with torch.no_grad():  # start the output scale where the target's final norm puts it
        net.final_norm.weight.copy_(lm.model.get_decoder().norm.weight.float())

    def loss_of(index: torch.Tensor) -> torch.Tensor:
        state, token, total = hidden[index], tokens[index], 0.0
        for d in range(unroll):
            rows = ahead[index, d]
            valid = rows >= 0
            target_state = hidden[rows.clamp(min=0)]
            state = net(state, embeddings[token])  # [n, hidden] the guessed next state
            logits = state @ head_rows.T  # [n, V]
            labels = torch.where(valid, to_reduced[tokens[rows.clamp(min=0)]], IGNORE)
            hard = nn.functional.cross_entropy(logits, labels, ignore_index=IGNORE)
            with torch.no_grad():
                teacher = (target_state @ head_rows.T).softmax(-1)
            soft = -(teacher * logits.log_softmax(-1)).sum(-1)[valid].mean()
            pull = nn.functional.smooth_l1_loss(state[valid], target_state[valid])
            total = total + (1 - config.soft_weight) * hard + config.soft_weight * soft + STATE_WEIGHT * pull
            token = torch.where(valid, tokens[rows.clamp(min=0)], 0)
        return total / unroll

    def evaluate() -> dict:
        return mtp_accuracy(net, held_hidden, held_tokens, held_ahead, embeddings, head_rows, vocab_ids, EVAL_DEPTH)

    log(f"mtp: {blocks} block(s), unrolled {unroll} steps, {hidden.shape[0]:,} training rows, "
        f"{held_hidden.shape[0]:,} held-out rows, {sum(p.numel() for p in net.parameters()):,} parameters")
    history = train_loop(net, hidden.shape[0], config, loss_of, evaluate, log)
    with torch.no_grad():
        full = mtp_accuracy(net, held_hidden, held_tokens, held_ahead, embeddings, head, None, EVAL_DEPTH)
    net_config = {"intermediate_size": text.intermediate_size, "blocks": blocks, "rms_norm_eps": text.rms_norm_eps,
                  "unroll": unroll, "state_weight": STATE_WEIGHT}
    return finish(MTP, net, lm, data, config, vocab_ids, out, log, net_config, history, full, started)


def main() -> None:
    script(__doc__.splitlines()[0], LOG, DEFAULTS, train_mtp, MAX_NEW_TOKENS)


if __name__ == "__main__":
    main()
