"""The accept / reject rule on frozen logits (no model): the emitted token is distributed as
the target's final distribution p, whatever the draft, and rules that are subtly wrong fail
the same statistical bound. Also the rule's parts one by one."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from engine.sampling import ChainOutput, run_chain
from engine.settings import SamplerSettings
from engine.speculative.drafting import Draft
from engine.speculative.rule import (
    Check,
    Verdict,
    expected_tokens_per_round,
    judge,
    residual_distribution,
)

ROUNDS = 20_000
VOCAB = 6
SAMPLED = SamplerSettings(temperature=0.8)
FILTERED = SamplerSettings(temperature=1.2, top_k=4, top_p=0.95)  # p has zeros: the chain shapes p and q alike
P_LOGITS = torch.tensor([[2.0, 1.2, 0.3, 0.0, -0.5, -1.0],  # position 0
                         [0.1, 0.4, 1.9, -0.3, 0.8, 0.0],  # position 1 (after a first guess)
                         [-1.0, 0.0, 0.5, 1.5, 0.2, 0.9]])  # the bonus position
Q_CLOSE = torch.tensor([0.35, 0.30, 0.15, 0.10, 0.06, 0.04])  # a decent draft
Q_UNIFORM = torch.full((VOCAB,), 1 / VOCAB)  # a deliberately bad draft


def chains(settings: SamplerSettings) -> tuple[ChainOutput, ...]:
    """The target's chain at each position; the context is empty so no penalty interferes."""
    return tuple(run_chain(row, torch.tensor([], dtype=torch.long), settings) for row in P_LOGITS)


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's test of `counts` against `probs` (cells with probability 0 must be empty)."""
    support = probs > 0
    assert counts[~support].sum() == 0, "a token with p = 0 was emitted"
    expected = probs[support].double() * counts.sum()
    statistic = float(((counts[support].double() - expected) ** 2 / expected).sum())
    dof = int(support.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))


def total_variation(counts: torch.Tensor, probs: torch.Tensor) -> float:
    return 0.5 * float((counts.double() / counts.sum() - probs.double()).abs().sum())


def tv_bound(rounds: int) -> float:
    """About four standard errors of the empirical distribution's total variation on 6 cells."""
    return 4 * math.sqrt(VOCAB / rounds) / 2


Rule = Callable[[tuple[ChainOutput, ...], Draft, SamplerSettings, torch.Generator], Verdict]


def first_tokens(rule: Rule, settings: SamplerSettings, q: torch.Tensor | None, guesses: int, *,
                 fixed_guess: int = 0, rounds: int = ROUNDS, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `rounds` rounds; count the first emitted token, and the second one on rounds whose
    first guess survived. A draft with q draws its guesses from q; without q the guess is the
    fixed token (prompt lookup's deterministic guess)."""
    frozen = chains(settings)
    generator = torch.Generator().manual_seed(seed)
    first, second = torch.zeros(VOCAB, dtype=torch.long), torch.zeros(VOCAB, dtype=torch.long)
    for _ in range(rounds):
        if q is None:
            draft = Draft((fixed_guess,) * guesses, None)
        else:
            ids = torch.multinomial(q, guesses, replacement=True, generator=generator)
            draft = Draft(tuple(ids.tolist()), q.expand(guesses, VOCAB))
        emitted = rule(frozen, draft, settings, generator).emitted
        first[emitted[0]] += 1
        if len(emitted) > 1:
            second[emitted[1]] += 1
    return first, second


def accept_always(frozen, draft, settings, generator) -> Verdict:
    """A deliberately wrong rule: every guess is kept (the output then follows the draft),
    then the bonus is drawn from the last position."""
    checks = tuple(Check(i, t, 0.0, draft.q_of(i), True, t, None, 1.0) for i, t in enumerate(draft.token_ids))
    bonus = int(torch.multinomial(frozen[len(checks)].final_probs, 1, generator=generator))
    return Verdict(checks, len(checks), bonus, None, 0.0, None, frozen)


def residual_from_p(frozen, draft, settings, generator) -> Verdict:
    """A deliberately wrong rule: on a rejection, draw from p itself instead of max(0, p - q)
    (the mass already given to accepted guesses is then given twice)."""
    verdict = judge(frozen, draft, settings, generator)
    if not verdict.rejected:
        return verdict
    token = int(torch.multinomial(frozen[verdict.accepted].final_probs, 1, generator=generator))
    return Verdict(verdict.checks, verdict.accepted, token, None, 0.0, None, verdict.chains)


@pytest.mark.parametrize(("settings", "q", "name"), [
    (SAMPLED, Q_CLOSE, "a decent draft model"),
    (SAMPLED, Q_UNIFORM, "a uniform draft (deliberately bad)"),
    (SAMPLED, None, "a deterministic guess (prompt lookup)"),
    (FILTERED, Q_CLOSE, "a draft whose tokens top-k / top-p may remove"),
])
def test_the_emitted_token_follows_the_targets_final_distribution(settings, q, name) -> None:
    first, second = first_tokens(judge, settings, q, guesses=2)
    p0, p1 = chains(settings)[0].final_probs, chains(settings)[1].final_probs
    assert total_variation(first, p0) < tv_bound(ROUNDS), name
    assert chi_square_p_value(first, p0) > 1e-3, name
    # the second token, on rounds whose first guess survived, follows position 1's p
    assert second.sum() > 1000
    assert total_variation(second, p1) < tv_bound(int(second.sum())), name
    assert chi_square_p_value(second, p1) > 1e-3, name


def test_with_every_guess_kept_the_bonus_follows_the_last_distribution() -> None:
    # q = p at both guessed positions: every guess is kept, so the third token is the bonus
    frozen = chains(SAMPLED)
    p = [c.final_probs for c in frozen]
    generator = torch.Generator().manual_seed(1)
    counts = torch.zeros(VOCAB, dtype=torch.long)
    for _ in range(ROUNDS):
        ids = tuple(int(torch.multinomial(row, 1, generator=generator)) for row in p[:2])
        verdict = judge(frozen, Draft(ids, torch.stack(p[:2])), SAMPLED, generator)
        assert verdict.accepted == 2 and not verdict.rejected
        counts[verdict.emitted[2]] += 1
    assert total_variation(counts, p[2]) < tv_bound(ROUNDS)
    assert chi_square_p_value(counts, p[2]) > 1e-3


@pytest.mark.parametrize(("rule", "q"), [(accept_always, Q_CLOSE), (accept_always, None),
                                         (residual_from_p, Q_CLOSE), (residual_from_p, Q_UNIFORM)])
def test_a_deliberately_wrong_rule_fails_the_same_bound(rule, q) -> None:
    first, _ = first_tokens(rule, SAMPLED, q, guesses=2)
    p0 = chains(SAMPLED)[0].final_probs
    assert total_variation(first, p0) > tv_bound(ROUNDS)
    assert chi_square_p_value(first, p0) < 1e-3


def test_greedy_keeps_guesses_equal_to_the_argmax_and_replaces_the_first_that_is_not() -> None:
    greedy = SamplerSettings(temperature=0)
    frozen = chains(greedy)  # argmax: 0, then 2, then 3
    verdict = judge(frozen, Draft((0, 4), None), greedy, torch.Generator())
    assert [c.accepted for c in verdict.checks] == [True, False]
    assert verdict.emitted == (0, 2) and verdict.rejected
    assert verdict.checks[1].target_argmax == 2 and verdict.checks[1].u is None
    all_kept = judge(frozen, Draft((0, 2), None), greedy, torch.Generator())
    assert all_kept.emitted == (0, 2, 3) and not all_kept.rejected  # the bonus is position 2's argmax


def test_a_deterministic_guess_is_kept_with_probability_p_and_its_residual_excludes_it() -> None:
    p = chains(SAMPLED)[0].final_probs
    residual, mass = residual_distribution(p, Draft((1,), None).q_row(0, VOCAB))
    assert residual[1] == 0
    assert mass == pytest.approx(1 - float(p[1]), abs=1e-6)
    expected = p.clone()
    expected[1] = 0
    assert torch.allclose(residual, expected / expected.sum(), atol=1e-6)
    generator, frozen = torch.Generator().manual_seed(5), chains(SAMPLED)
    kept = sum(judge(frozen, Draft((1,), None), SAMPLED, generator).accepted for _ in range(ROUNDS))
    assert kept / ROUNDS == pytest.approx(float(p[1]), abs=4 * math.sqrt(float(p[1]) * (1 - float(p[1])) / ROUNDS))


def test_each_check_records_u_against_min_one_p_over_q() -> None:
    generator = torch.Generator().manual_seed(2)
    verdict = judge(chains(SAMPLED), Draft((3, 0), Q_CLOSE.expand(2, VOCAB)), SAMPLED, generator)
    p = chains(SAMPLED)[0].final_probs
    first = verdict.checks[0]
    assert first.p == pytest.approx(float(p[3])) and first.q == pytest.approx(float(Q_CLOSE[3]))
    assert first.accept_prob == pytest.approx(min(1.0, float(p[3] / Q_CLOSE[3])))
    assert first.accepted == (first.u < first.accept_prob)


def test_residual_of_identical_distributions_falls_back_to_p() -> None:
    p = chains(SAMPLED)[0].final_probs
    residual, mass = residual_distribution(p, p)
    assert mass == 0 and torch.equal(residual, p)


@pytest.mark.parametrize(("alpha", "k", "expected"), [(0.0, 4, 1.0), (1.0, 4, 5.0), (0.5, 2, 1.75)])
def test_expected_tokens_per_round_is_the_geometric_sum(alpha, k, expected) -> None:
    assert expected_tokens_per_round(alpha, k) == pytest.approx(expected)


@pytest.mark.parametrize("q", [None, "one-hot", "spread"])
def test_greedys_residual_is_what_the_general_rule_computes(q) -> None:
    greedy = SamplerSettings(temperature=0)
    frozen = chains(greedy)  # argmax at position 0: token 0
    rows = {None: None, "one-hot": torch.eye(VOCAB)[[4]], "spread": Q_CLOSE.roll(1).unsqueeze(0)}[q]
    draft = Draft((4,), rows)
    verdict = judge(frozen, draft, greedy, torch.Generator())
    residual, mass = residual_distribution(frozen[0].final_probs, draft.q_row(0, VOCAB))
    assert verdict.rejected and verdict.token_id == 0
    assert torch.equal(verdict.residual, residual) and verdict.residual_mass == mass
