"""A student's sampler written from the definitions, in plain torch: temperature, then top-k,
top-p and min-p, then a softmax over what is left. It shares no code with the engine."""

import torch

NEG_INF = float("-inf")


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """All the mass on the most probable token (the first one on a tie)."""
    probs = torch.zeros_like(logits)
    probs[torch.argmax(logits)] = 1.0
    return probs


def scale(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return logits / temperature


def top_k_filter(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k highest scores and every score tied with the k-th."""
    kth = torch.sort(scores, descending=True).values[min(k, scores.numel()) - 1]
    return scores.masked_fill(scores < kth, NEG_INF)


def top_p_filter(scores: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the most probable tokens while the mass before each is below p (so the token that
    crosses p stays, and so does the most probable one)."""
    sorted_probs, order = torch.sort(torch.softmax(scores, dim=-1), descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=0) - sorted_probs
    keep_sorted = mass_before < p
    keep_sorted[0] = True
    keep = torch.zeros_like(keep_sorted)
    keep[order] = keep_sorted
    return scores.masked_fill(~keep, NEG_INF)


def min_p_filter(scores: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop tokens less probable than min_p times the most probable one."""
    probs = torch.softmax(scores, dim=-1)
    return scores.masked_fill(probs < min_p * probs.max(), NEG_INF)


def final_distribution(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                       min_p: float) -> torch.Tensor:
    if temperature == 0:
        return greedy(logits)
    scores = scale(logits, temperature)
    if top_k > 0:
        scores = top_k_filter(scores, top_k)
    if top_p < 1.0:
        scores = top_p_filter(scores, top_p)
    if min_p > 0:
        scores = min_p_filter(scores, min_p)
    return torch.softmax(scores, dim=-1)
