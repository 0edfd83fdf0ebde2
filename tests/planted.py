"""A tiny model with a near-tie planted in its greedy run: where fast batching flips a token
(tests/engine/test_determinism.py, and the Same prompt page's views)."""

from __future__ import annotations

import torch
from torch import nn

from engine import LoadedModel
from engine.prompt import build_prompt
from engine.serving import decode_alone
from tests.tiny import tiny_lm

PLANTED_STEP = 4  # the step whose top tokens are made a near-tie
PLANTED_PROMPT = "Hello"


def planted_near_tie(step: int = PLANTED_STEP, ties: int = 6) -> LoadedModel:
    """A tiny model (its own, the weights edited) whose greedy run of PLANTED_PROMPT has its top
    `ties` tokens within a few millionths of a logit at `step`, and its steps before unchanged.
    The head is untied from the embedding so only the logits move. Each tied token's head row is
    moved along the part of that step's hidden state that is orthogonal to the earlier steps'
    states: its logit rises to the leader's at `step` and stays as it was before."""
    lm = tiny_lm(seed=0)
    model = lm.model
    model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone())
    prompt = build_prompt(lm, PLANTED_PROMPT, chat=False).ids
    before = decode_alone(lm, prompt, step)
    with torch.no_grad():
        context = torch.tensor([prompt + list(before.token_ids)])
        states = model.model(input_ids=context).last_hidden_state[0, len(prompt) - 1:].double()  # [step + 1, hidden]
        earlier, state = states[:-1], states[-1]
        basis = torch.linalg.qr(earlier.T).Q  # [hidden, step]
        fresh = state - basis @ (basis.T @ state)  # [hidden], orthogonal to every earlier state
        head = model.lm_head.weight
        logits = head.double() @ state
        leader, *others = torch.topk(logits, ties).indices.tolist()
        for token in others:
            head[token] += ((logits[leader] - logits[token]) * fresh / (fresh @ state)).float()
    assert decode_alone(lm, prompt, step).token_ids == before.token_ids  # the steps before are untouched
    return lm
