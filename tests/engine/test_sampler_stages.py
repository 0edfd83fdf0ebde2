"""The sampler's stage table and draw strategies, on random logits (no model: fast)."""

from __future__ import annotations

import math

import pytest
import torch

from engine.sampling import (
    STAGES,
    Argmax,
    InverseCdf,
    Multinomial,
    decide,
    entropy_bits,
    leading_ids,
    ordered_sum,
    pick_by_cdf,
    pick_like_multinomial,
    run_chain,
    top_token,
)
from engine.settings import CHAINS, SamplerSettings
from tests.threads import threads

ACTIVE = SamplerSettings(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05, repetition_penalty=1.3)


@pytest.fixture()
def logits() -> torch.Tensor:
    return torch.randn(500, generator=torch.Generator().manual_seed(3)) * 3  # [vocab]


CONTEXT = torch.tensor([1, 2, 3, 400])


def test_every_chain_names_only_stages_in_the_table_and_each_stage_once() -> None:
    for name, chain in CHAINS.items():
        assert set(chain) <= set(STAGES), name
        assert sorted(chain) == sorted(STAGES), name  # every engine runs every stage, once


@pytest.mark.parametrize("stage", list(STAGES))
def test_a_stage_at_its_neutral_setting_is_recognised_as_off(stage: str) -> None:
    assert STAGES[stage].is_neutral(SamplerSettings())
    assert not STAGES[stage].is_neutral(ACTIVE)


@pytest.mark.parametrize("stage", list(STAGES))
def test_filters_only_remove_tokens_and_reshapes_never_do(stage: str, logits: torch.Tensor) -> None:
    out = STAGES[stage].apply(logits, CONTEXT, ACTIVE)
    removed = torch.isneginf(out)
    if STAGES[stage].removes_tokens:
        assert 0 < int(removed.sum()) < logits.numel()
        assert torch.equal(out[~removed], logits[~removed])  # survivors untouched
    else:
        assert not removed.any() and not torch.equal(out, logits)
    assert not torch.isneginf(logits).any()  # never in place


def test_the_chain_records_one_labelled_stage_per_table_entry_in_order(logits: torch.Tensor) -> None:
    for name, chain in CHAINS.items():
        records = run_chain(logits, CONTEXT, SamplerSettings(**{**ACTIVE.__dict__, "chain": name})).stages
        assert [r.name for r in records] == list(chain)
        assert [r.label for r in records] == [STAGES[n].label(ACTIVE) for n in chain]
        assert all(r.removed == 0 for r in records if not STAGES[r.name].removes_tokens)


def test_a_reshaping_stage_records_how_it_moved_the_distribution(logits: torch.Tensor) -> None:
    """Temperature and the repetition penalty remove nothing: their rows say what they did, the
    top token's probability and the entropy entering and leaving them, read from the tensors."""
    hot = SamplerSettings(temperature=2.0, repetition_penalty=1.3)
    records = {r.name: r for r in run_chain(logits, CONTEXT, hot).stages}
    penalty, temperature = records["repetition_penalty"], records["temperature"]
    top = int(torch.argmax(logits))
    assert penalty.top_prob_before == float(logits.softmax(-1)[top])
    penalised = STAGES["repetition_penalty"].apply(logits, CONTEXT, hot)
    assert penalty.top_prob_after == float(penalised.softmax(-1)[top])
    assert temperature.entropy_before_bits == pytest.approx(penalty.entropy_after_bits)
    assert temperature.top_prob_after < temperature.top_prob_before  # T = 2 flattens
    assert temperature.entropy_after_bits > temperature.entropy_before_bits
    assert all(r.top_prob_before is None for r in records.values() if STAGES[r.name].removes_tokens)


def test_an_unknown_chain_is_refused_before_any_stage_runs() -> None:
    with pytest.raises(ValueError, match="chain"):
        SamplerSettings(chain="min_p_first")


def test_argmax_takes_the_top_final_token_without_a_draw(logits: torch.Tensor) -> None:
    decision, chain = decide(logits, CONTEXT, ACTIVE, Argmax())
    assert decision.draw is None and decision.token_id == int(chain.final_probs.argmax())


def test_greedy_settings_take_the_argmax_whatever_strategy_is_given(logits: torch.Tensor) -> None:
    greedy = SamplerSettings(temperature=0)
    picks = {decide(logits, CONTEXT, greedy, strategy)[0] for strategy in
             (Argmax(), InverseCdf(0.999), Multinomial(torch.Generator().manual_seed(1)))}
    assert len(picks) == 1 and next(iter(picks)).draw is None


def test_inverse_cdf_and_multinomial_strategies_draw_as_their_pickers(logits: torch.Tensor) -> None:
    decision, chain = decide(logits, CONTEXT, ACTIVE, InverseCdf(0.8))
    assert (decision.token_id, decision.draw) == pick_by_cdf(chain.final_probs, 0.8)
    generator = torch.Generator().manual_seed(9)
    decision, _ = decide(logits, CONTEXT, ACTIVE, Multinomial(generator))
    expected = torch.multinomial(chain.final_probs, 1, generator=torch.Generator().manual_seed(9))
    assert decision.token_id == int(expected) and decision.draw.method == "multinomial"


def test_top_token_is_torch_argmax_on_ties_infinities_nans_and_bfloat16() -> None:
    generator = torch.Generator().manual_seed(11)
    for trial in range(600):
        size = (49_152, 8_192, 300, 17, 1)[trial % 5]
        values = torch.randint(-2, 3, (size,), generator=generator).float()  # many ties
        if trial % 3 == 0:
            values[torch.randint(0, size, (2,), generator=generator)] = float("nan")
        if trial % 4 == 0:
            values[torch.randint(0, size, (2,), generator=generator)] = float("inf")
        if trial % 7 == 0:
            values[:] = float("-inf")
        if trial % 5 == 1:
            values = values.to(torch.bfloat16)
        assert top_token(values) == int(torch.argmax(values)), trial


def test_a_greedy_chains_leaders_are_its_one_token_as_ranking_the_vocabulary_would_give(logits: torch.Tensor) -> None:
    for settings in (SamplerSettings(temperature=0), SamplerSettings(temperature=0, repetition_penalty=1.4)):
        chain = run_chain(logits, CONTEXT, settings)
        assert chain.greedy_token == int(torch.argmax(chain.final_logits))
        assert chain.leaders(8) == leading_ids(chain.final_probs, 8) == [chain.greedy_token]
    sampled = run_chain(logits, CONTEXT, ACTIVE)
    assert sampled.greedy_token is None and sampled.leaders(8) == leading_ids(sampled.final_probs, 8)


def test_an_entropy_has_the_same_digits_at_one_and_two_threads_and_is_the_sum_of_its_terms() -> None:
    """The step records its entropy on the sampler's one thread and a page recomputes it on two:
    a plain torch sum split between threads differed in the last digit for a third of these."""
    generator = torch.Generator().manual_seed(5)
    for trial in range(60):
        size = (49_152, 50_257, 151_936, 1_000, 1)[trial % 5]
        probs = (torch.randn(size, generator=generator) * (1 + trial % 7)).softmax(-1)
        with threads(2):
            two = entropy_bits(probs)
        with threads(1):
            one = entropy_bits(probs)
        assert one == two, trial
        assert one == pytest.approx(math.fsum(torch.special.entr(probs.double()).tolist()) / math.log(2), abs=1e-9)
    assert entropy_bits(torch.tensor([1.0, 0.0])) == 0.0 and entropy_bits(torch.tensor([0.5, 0.5])) == 1.0
    assert float(ordered_sum(torch.zeros(0, dtype=torch.float64))) == 0.0


def test_a_chains_records_and_draws_have_the_same_digits_at_one_and_two_threads() -> None:
    """A filter's removed mass, the inverse CDF's band and the multinomial band sum tens of
    thousands of probabilities: each the same at either thread count."""
    state = torch.Generator().manual_seed(9).get_state()
    settings = SamplerSettings(temperature=0.9, top_k=2_000)  # removes 47,152 tokens
    seen: dict[int, list] = {}
    for count in (2, 1):
        seen[count] = []
        with threads(count):
            for trial in range(40):
                logits = torch.randn(49_152, generator=torch.Generator().manual_seed(trial)) * (1 + trial % 4)
                chain = run_chain(logits, CONTEXT, settings)
                draw = torch.Generator()
                draw.set_state(state)
                seen[count].append(([stage.removed_mass for stage in chain.stages],
                                    pick_by_cdf(chain.final_probs, 0.37 + trial / 50),
                                    pick_like_multinomial(chain.final_probs, draw)))
    assert seen[1] == seen[2]
