"""How far a packed pass (the scheduler's batched decode) moves logits from lone passes: the
measurement behind the KV cache & speed page's batching section and bench/batch_parity.py."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.errors import SettingsError
from engine.forward import cache_length, cache_prefix, forward, forward_one, new_cache
from engine.loading import LoadedModel
from engine.serving.packed import forward_packed
from engine.speed import sample_context


@dataclass(frozen=True)
class PackedDifference:
    """How far a packed pass (the scheduler's batched decode) moved logits from lone passes."""

    exact: bool  # each row its own 1-row product (RowwiseLinear) or one matrix product for all rows
    batch: int
    steps: int
    max_logit_diff: float  # largest |packed - lone| over every logit of every row and step
    max_prob_diff: float  # the same for the raw softmax probabilities
    argmax_flips: int  # rows whose most probable token differed
    rows: int


def measure_packed_difference(lm: LoadedModel, exact: bool, batch: int = 8, steps: int = 3,
                              context_tokens: int = 16) -> PackedDifference:
    """`batch` sequences of different lengths decode `steps` tokens together in packed passes
    (`exact` or fast, `forward_packed`);
    each row is compared with the lone batch-1 pass over the same cache (a prefix view, so the
    comparison leaves the cache as it was). The sequences follow the lone pass's greedy picks."""
    if not isinstance(batch, int) or batch < 2:
        raise SettingsError("batch size", batch, "a whole number >= 2")
    caches, tokens = [], []
    for row in range(batch):
        context = sample_context(lm, min(context_tokens + row, lm.context_window - steps - 1), offset=7 * row)
        caches.append(new_cache(lm))
        forward(lm, torch.tensor([context[:-1]]), caches[-1])
        tokens.append(context[-1])
    worst_logit = worst_prob = 0.0
    flips = 0
    for _ in range(steps):
        lone = torch.stack([forward_one(lm, [t], cache_prefix(c, cache_length(c)))
                            for t, c in zip(tokens, caches, strict=True)])  # [batch, vocab]
        packed = forward_packed(lm, tokens, caches, exact)  # [batch, vocab]
        worst_logit = max(worst_logit, float((packed - lone).abs().max()))
        worst_prob = max(worst_prob, float((packed.softmax(-1) - lone.softmax(-1)).abs().max()))
        flips += int((packed.argmax(-1) != lone.argmax(-1)).sum())
        tokens = lone.argmax(-1).tolist()
    return PackedDifference(exact, batch, steps, worst_logit, worst_prob, flips, batch * steps)

