"""Samplers with one known mistake each, built from the good student's stages (the rest is right)."""

import torch

from tests.engine.students.good_sampler import NEG_INF, greedy, min_p_filter, scale, top_k_filter, top_p_filter


def _filters(scores: torch.Tensor, top_k: int, top_p: float, min_p: float, *, top_k_stage=top_k_filter,
             top_p_stage=top_p_filter, min_p_stage=min_p_filter) -> torch.Tensor:
    if top_k > 0:
        scores = top_k_stage(scores, top_k)
    if top_p < 1.0:
        scores = top_p_stage(scores, top_p)
    if min_p > 0:
        scores = min_p_stage(scores, min_p)
    return scores


def _top_p_dropping_the_crossing_token(scores: torch.Tensor, p: float) -> torch.Tensor:
    sorted_probs, order = torch.sort(torch.softmax(scores, dim=-1), descending=True)
    keep_sorted = torch.cumsum(sorted_probs, dim=0) <= p  # the token that crosses p goes too
    keep_sorted[0] = True
    keep = torch.zeros_like(keep_sorted)
    keep[order] = keep_sorted
    return scores.masked_fill(~keep, NEG_INF)


def top_p_off_by_one(logits, temperature, top_k, top_p, min_p):
    if temperature == 0:
        return greedy(logits)
    scores = _filters(scale(logits, temperature), top_k, top_p, min_p, top_p_stage=_top_p_dropping_the_crossing_token)
    return torch.softmax(scores, dim=-1)


def temperature_after_filters(logits, temperature, top_k, top_p, min_p):
    if temperature == 0:
        return greedy(logits)
    return torch.softmax(scale(_filters(logits, top_k, top_p, min_p), temperature), dim=-1)


def _top_k_exactly_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    kept = torch.topk(scores, k).indices
    return torch.full_like(scores, NEG_INF).scatter(0, kept, scores[kept])


def top_k_drops_ties(logits, temperature, top_k, top_p, min_p):
    if temperature == 0:
        return greedy(logits)
    scores = _filters(scale(logits, temperature), top_k, top_p, min_p, top_k_stage=_top_k_exactly_k)
    return torch.softmax(scores, dim=-1)


def min_p_before_temperature(logits, temperature, top_k, top_p, min_p):
    if temperature == 0:
        return greedy(logits)
    raw = logits.softmax(dim=-1)
    scores = _filters(scale(logits, temperature), top_k, top_p, 0.0)
    return torch.softmax(scores.masked_fill(raw < min_p * raw.max(), NEG_INF), dim=-1)


def temperature_zero_not_greedy(logits, temperature, top_k, top_p, min_p):
    if temperature:  # 0 is falsy: temperature 0 is treated as "no temperature"
        logits = scale(logits, temperature)
    return torch.softmax(_filters(logits, top_k, top_p, min_p), dim=-1)
