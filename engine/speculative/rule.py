"""The accept / reject rule of speculative decoding, on frozen logits: no model, no cache.

p is the target's final distribution at a verified position (after its sampler chain), q the
draft's (a one-hot for a deterministic guess). Greedy keeps a guess when it is the target's
argmax; sampling keeps it when u < min(1, p(x) / q(x)), and the first rejected position draws
from the residual max(0, p - q), renormalised. engine/speculative/generation.py runs a round
around it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.errors import SettingsError
from engine.sampling import ChainOutput, Draw, draw_uniform, pick_by_cdf, run_chain, top_token
from engine.settings import SamplerSettings, is_whole
from engine.speculative.drafting import Draft

K_MIN, K_MAX = 1, 8


def check_k(k: object) -> int:
    """The number of tokens drafted per round, validated."""
    if not is_whole(k) or not K_MIN <= k <= K_MAX:
        raise SettingsError("k", k, f"a whole number from {K_MIN} to {K_MAX} (tokens drafted per round)")
    return k


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """Tokens a round adds when each guess survives with probability alpha, independently:
    1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)."""
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


@dataclass(frozen=True)
class Check:
    """One drafted token checked against the target."""

    index: int  # 0-based among the round's drafted tokens
    token_id: int
    p: float  # the target's final probability of the drafted token here
    q: float  # the draft's probability of it (1 for a deterministic guess)
    accepted: bool
    target_argmax: int  # the target's most probable token here (what greedy keeps)
    u: float | None  # sampling: the uniform drawn; None for greedy
    accept_prob: float  # greedy: 1 or 0; sampling: min(1, p / q)


@dataclass(frozen=True)
class Verdict:
    """What the rule decided for one round, before any stop condition is applied."""

    checks: tuple[Check, ...]  # up to and including the first rejection
    accepted: int  # drafted tokens kept
    token_id: int  # the target's own token: the residual draw on a rejection, else the bonus
    residual: torch.Tensor | None  # [vocab] on a rejection: max(0, p - q) renormalised
    residual_mass: float  # the sum of max(0, p - q) before renormalising
    draw: Draw | None  # the residual's or the bonus's draw; None for greedy
    chains: tuple[ChainOutput, ...]  # the target's chain output at each of the k + 1 positions

    @property
    def rejected(self) -> bool:
        return self.accepted < len(self.checks)

    @property
    def emitted(self) -> tuple[int, ...]:
        return (*(c.token_id for c in self.checks[:self.accepted]), self.token_id)


def target_chains(logits: torch.Tensor, context_ids: Sequence[int], drafted: Sequence[int],
                  sampler: SamplerSettings) -> tuple[ChainOutput, ...]:
    """The sampler chain at each verified position: row i of `logits` `[n + 1, vocab]` follows
    the context plus the first i drafted tokens, and its repetition penalty sees exactly those."""
    context = list(context_ids)
    return tuple(run_chain(logits[i], torch.tensor(context + list(drafted[:i])), sampler)
                 for i in range(logits.shape[0]))


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, float]:
    """max(0, p - q) renormalised, and its mass before renormalising. When p and q agree
    everywhere (mass 0, only reachable by float rounding) the target's p itself is returned."""
    residual = (p.double() - q.double()).clamp(min=0)  # [vocab]
    mass = float(residual.sum())
    if mass <= 0:
        return p.clone(), 0.0
    return (residual / mass).to(p.dtype), mass


def judge(chains: Sequence[ChainOutput], draft: Draft, sampler: SamplerSettings,
          generator: torch.Generator) -> Verdict:
    """Check the drafted tokens left to right against the target's final distributions
    `chains` (one per drafted token, plus one), then draw the target's own token.

    Greedy: a guess survives when it equals the target's argmax; the first that does not is
    replaced by the argmax; with none rejected the last distribution's argmax is the bonus.
    Sampling: a guess x survives when u < min(1, p(x) / q(x)); the first rejected position
    draws from max(0, p - q) renormalised; with none rejected the bonus is drawn from the last
    p. Every random number comes from `generator`, in that order.
    """
    checks: list[Check] = []
    for index, token in enumerate(draft.token_ids):
        p = chains[index].final_probs  # [vocab]
        p_token, q_token, argmax = float(p[token]), draft.q_of(index), _top(chains[index])
        if sampler.greedy:
            u, accept_prob = None, 1.0 if token == argmax else 0.0
            accepted = token == argmax
        else:
            u, accept_prob = draw_uniform(generator), min(1.0, p_token / q_token)
            accepted = u < accept_prob
        checks.append(Check(index, token, p_token, q_token, accepted, argmax, u, accept_prob))
        if not accepted:
            return _rejected(chains, draft, checks, sampler, generator)
    last = chains[len(draft.token_ids)]
    if sampler.greedy:
        return Verdict(tuple(checks), len(checks), _top(last), None, 0.0, None, tuple(chains))
    token, draw = pick_by_cdf(last.final_probs, draw_uniform(generator))
    return Verdict(tuple(checks), len(checks), token, None, 0.0, draw, tuple(chains))


def _rejected(chains: Sequence[ChainOutput], draft: Draft, checks: list[Check], sampler: SamplerSettings,
              generator: torch.Generator) -> Verdict:
    index = len(checks) - 1
    chain = chains[index]
    if chain.greedy_token is not None:
        residual, mass = _greedy_residual(chain, draft, index)
        return Verdict(tuple(checks), index, chain.greedy_token, residual, mass, None, tuple(chains))
    residual, mass = residual_distribution(chain.final_probs, draft.q_row(index, chain.final_probs.numel()))
    if sampler.greedy:
        return Verdict(tuple(checks), index, top_token(residual), residual, mass, None, tuple(chains))
    token, draw = pick_by_cdf(residual, draw_uniform(generator))
    return Verdict(tuple(checks), index, token, residual, mass, draw, tuple(chains))


def _top(chain: ChainOutput) -> int:
    """The most probable token of a chain's final distribution."""
    return chain.greedy_token if chain.greedy_token is not None else top_token(chain.final_probs)


def _greedy_residual(chain: ChainOutput, draft: Draft, index: int) -> tuple[torch.Tensor, float]:
    """`residual_distribution` where p is greedy's one-hot on a token t other than the guess, with
    no pass over the vocabulary: max(0, p - q) is 1 - q(t) at t and 0 elsewhere, so renormalised it
    is p again (x / x is exactly 1), and its mass is 1 - q(t) (1 for a deterministic guess: q(t) = 0)."""
    t = chain.greedy_token
    q_t = 0.0 if draft.q is None else float(draft.q[index, t].double())
    mass = 1.0 - q_t
    return chain.final_probs.clone(), (mass if mass > 0 else 0.0)
