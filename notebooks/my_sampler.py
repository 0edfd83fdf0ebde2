import torch


def final_distribution(logits, temperature, top_k, top_p, min_p):
    logits = logits.double()
    if temperature == 0:
        out = torch.zeros_like(logits)
        out[logits.argmax()] = 1.0
        return out
    probs = (logits / temperature).softmax(-1)
    if top_k > 0:
        kth = probs.topk(min(top_k, probs.numel())).values[-1]
        probs = torch.where(probs >= kth, probs, 0.0)
        probs = probs / probs.sum()
    if top_p < 1.0:
        order = probs.argsort(descending=True)
        before = probs[order].cumsum(0) - probs[order]  # the mass of the tokens ahead of each
        dropped = order[before + probs[order] > top_p]  # mistake: drops the token that crosses p
        probs[dropped] = 0.0
        probs = probs / probs.sum()
    if min_p > 0:
        probs = torch.where(probs >= min_p * probs.max(), probs, 0.0)
        probs = probs / probs.sum()
    return probs
