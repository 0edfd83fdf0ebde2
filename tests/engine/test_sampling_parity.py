"""Each sampler stage, and the whole chain, against transformers' own LogitsProcessors."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from engine import Generation, SamplerSettings
from engine.sampling import (
    keep_min_p,
    keep_top_k,
    keep_top_p,
    penalize_repetition,
    pick_by_cdf,
    pick_like_multinomial,
    run_chain,
    scale_temperature,
)

VOCAB = 1000


def random_logits(seed: int, vocab: int = VOCAB, scale: float = 4.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(vocab, generator=generator) * scale


def tied_logits() -> torch.Tensor:
    """Many exact ties, including at the k-th place and around the top-p boundary."""
    base = torch.tensor([5.0, 5.0, 3.0, 3.0, 3.0, 1.0, 1.0, 0.0, -1.0, -1.0])
    return base.repeat(20)  # [200]


def reference(processor, logits: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
    ids = (context if context is not None else torch.zeros(1, dtype=torch.long)).unsqueeze(0)
    return processor(ids, logits.unsqueeze(0).clone())[0]


def assert_same_logits(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs)), "different tokens filtered"
    finite = torch.isfinite(theirs)
    assert torch.equal(ours[finite], theirs[finite]), "kept logits differ"


LOGIT_CASES = [random_logits(0), random_logits(1, scale=0.5), random_logits(2, scale=12.0), tied_logits()]


@pytest.mark.parametrize("logits", LOGIT_CASES)
@pytest.mark.parametrize("penalty", [0.7, 1.3, 2.0])
def test_repetition_penalty_equals_transformers(logits: torch.Tensor, penalty: float) -> None:
    context = torch.tensor([0, 3, 3, 7, 11, 42, 7, 5])
    ours = penalize_repetition(logits, context, penalty)
    assert_same_logits(ours, reference(RepetitionPenaltyLogitsProcessor(penalty), logits, context))


@pytest.mark.parametrize("logits", LOGIT_CASES)
@pytest.mark.parametrize("temperature", [0.1, 0.7, 1.5, 3.0])
def test_temperature_equals_transformers(logits: torch.Tensor, temperature: float) -> None:
    assert_same_logits(scale_temperature(logits, temperature),
                       reference(TemperatureLogitsWarper(temperature), logits))


@pytest.mark.parametrize("logits", LOGIT_CASES)
@pytest.mark.parametrize(("top_k", "min_keep"), [(1, 1), (2, 1), (5, 1), (40, 1), (1, 3), (10_000, 1)])
def test_top_k_equals_transformers_ties_kept(logits: torch.Tensor, top_k: int, min_keep: int) -> None:
    ours = keep_top_k(logits, top_k, min_keep)
    assert_same_logits(ours, reference(TopKLogitsWarper(top_k, min_tokens_to_keep=min_keep), logits))


def test_top_k_keeps_every_token_tied_with_the_kth() -> None:
    kept = torch.isfinite(keep_top_k(tied_logits(), 1))
    assert int(kept.sum()) == 40  # 1 asked, all forty 5.0s kept


@pytest.mark.parametrize("logits", LOGIT_CASES)
@pytest.mark.parametrize(("top_p", "min_keep"), [(0.0, 1), (0.1, 1), (0.5, 1), (0.9, 1), (0.95, 5), (0.999, 1)])
def test_top_p_equals_transformers(logits: torch.Tensor, top_p: float, min_keep: int) -> None:
    ours = keep_top_p(logits, top_p, min_keep)
    assert_same_logits(ours, reference(TopPLogitsWarper(top_p, min_tokens_to_keep=min_keep), logits))


def test_top_p_keeps_the_token_that_crosses_p() -> None:
    logits = torch.tensor([0.5, 0.3, 0.2]).log()
    kept = torch.isfinite(keep_top_p(logits, 0.6))
    assert kept.tolist() == [True, True, False]  # 0.5 < 0.6, so 0.3 (crossing) stays


@pytest.mark.parametrize("logits", LOGIT_CASES)
@pytest.mark.parametrize(("min_p", "min_keep"), [(0.01, 1), (0.1, 1), (0.5, 1), (1.0, 1), (0.9, 4)])
def test_min_p_equals_transformers(logits: torch.Tensor, min_p: float, min_keep: int) -> None:
    ours = keep_min_p(logits, min_p, min_keep)
    assert_same_logits(ours, reference(MinPLogitsWarper(min_p, min_tokens_to_keep=min_keep), logits))


def test_stages_never_change_their_input() -> None:
    logits = random_logits(3)
    before = logits.clone()
    penalize_repetition(logits, torch.tensor([1, 2]), 1.5)
    scale_temperature(logits, 0.5)
    keep_top_k(logits, 5)
    keep_top_p(logits, 0.5)
    keep_min_p(logits, 0.2)
    assert torch.equal(logits, before)


SETTINGS_CASES = [
    SamplerSettings(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05, repetition_penalty=1.3),
    SamplerSettings(temperature=1.3, top_k=0, top_p=0.8),
    SamplerSettings(temperature=0.5, min_p=0.2),
    SamplerSettings(temperature=1.0, top_k=7, repetition_penalty=0.8),
    SamplerSettings(temperature=2.0, top_p=0.3, min_p=0.1),
]


def transformers_chain(model, settings: SamplerSettings) -> LogitsProcessorList:
    """The processors `generate()` itself builds for these settings, in its own order."""
    config = GenerationConfig(do_sample=True, temperature=settings.temperature, top_k=settings.top_k,
                              top_p=settings.top_p, min_p=settings.min_p or None,
                              repetition_penalty=settings.repetition_penalty)
    processors = model._get_logits_processor(generation_config=config, input_ids_seq_length=1,
                                             encoder_input_ids=None, prefix_allowed_tokens_fn=None,
                                             logits_processor=LogitsProcessorList(), device="cpu")
    return processors


@pytest.mark.parametrize("settings", SETTINGS_CASES)
def test_whole_chain_equals_generate_processors_on_real_logits(lm, settings: SamplerSettings) -> None:
    generation = Generation(lm, "Once upon a time, the little robot", sampler=SamplerSettings(temperature=0))
    for _ in range(3):
        generation.step()
    logits = generation.raw_logits()
    context = torch.tensor(generation.prompt_ids + generation.generated_ids[:-1])
    ours = run_chain(logits, context, settings)
    theirs = transformers_chain(lm.model, settings)(context.unsqueeze(0), logits.unsqueeze(0).clone())[0]
    assert_same_logits(ours.final_logits, theirs)
    assert torch.equal(ours.final_probs, theirs.softmax(dim=-1))


def test_chain_records_removed_mass_and_kept_counts(lm) -> None:
    generation = Generation(lm, "The capital of France is", sampler=SamplerSettings(temperature=0))
    generation.step()
    logits = generation.raw_logits()
    settings = SamplerSettings(temperature=1.0, top_k=10, top_p=0.5)
    chain = run_chain(logits, torch.tensor(generation.prompt_ids), settings)
    top_k_stage, top_p_stage = chain.stages[2], chain.stages[3]
    probs = logits.softmax(-1)
    outside_top10 = torch.ones_like(probs, dtype=torch.bool)
    outside_top10[torch.topk(probs, 10).indices] = False
    assert top_k_stage.kept == 10
    assert top_k_stage.removed == lm.vocab_size - 10
    assert top_k_stage.removed_mass == pytest.approx(float(probs.double()[outside_top10].sum()), abs=1e-9)
    assert top_p_stage.kept == 1  # ' Paris' alone holds 0.77 > 0.5
    assert chain.final_probs[7042] == 1.0


def test_greedy_applies_repetition_penalty_then_argmax() -> None:
    logits = torch.tensor([3.0, 2.9, -1.0])
    chain = run_chain(logits, torch.tensor([0]), SamplerSettings(temperature=0, repetition_penalty=1.2))
    assert chain.final_probs.tolist() == [0.0, 1.0, 0.0]  # 3.0 / 1.2 = 2.5 < 2.9
    assert [s.active for s in chain.stages] == [True, False, False, False, False]


@pytest.mark.parametrize("chain_name", ["vllm", "llama.cpp"])
def test_other_chain_orders_apply_the_same_stages_in_their_order(chain_name: str) -> None:
    logits = random_logits(4)
    settings = SamplerSettings(temperature=0.6, top_k=30, top_p=0.8, min_p=0.05, chain=chain_name)
    current = logits
    for stage in (["temperature", "min_p", "top_k", "top_p"] if chain_name == "vllm"
                  else ["top_k", "top_p", "min_p", "temperature"]):
        current = {"temperature": lambda x: scale_temperature(x, 0.6), "top_k": lambda x: keep_top_k(x, 30),
                   "top_p": lambda x: keep_top_p(x, 0.8), "min_p": lambda x: keep_min_p(x, 0.05)}[stage](current)
    ours = run_chain(logits, torch.tensor([0]), settings)
    assert_same_logits(ours.final_logits, current)
    assert [s.name for s in ours.stages][1:] == (["temperature", "min_p", "top_k", "top_p"] if chain_name == "vllm"
                                                  else ["top_k", "top_p", "min_p", "temperature"])


@dataclass(frozen=True)
class FullSort:
    """Inverse CDF the slow, obvious way: every token sorted (ties by id) and accumulated, once
    per distribution; `pick(u)` searches it."""

    order: list[int]  # token ids, most probable first
    cdf: torch.Tensor  # [vocab] float64, in `order`
    kept: int  # tokens with a probability above 0

    @classmethod
    def of(cls, probs: torch.Tensor) -> FullSort:
        order = sorted(range(probs.numel()), key=lambda i: (-float(probs[i]), i))
        cdf = probs[order].double().cumsum(0) / probs.double().sum()
        return cls(order, cdf, int((probs > 0).sum()))

    def pick(self, u: float) -> tuple[int, float, float]:
        """The token whose band holds `u`, and that band (low, high)."""
        rank0 = min(int((self.cdf <= u).sum()), self.kept - 1)
        return self.order[rank0], float(self.cdf[rank0 - 1]) if rank0 else 0.0, float(self.cdf[rank0])


@pytest.mark.parametrize("probs", [
    random_logits(5, vocab=3000).softmax(-1),
    (random_logits(6, vocab=3000) * 0.05).softmax(-1),  # nearly flat: u often lands far down
    torch.zeros(3000).softmax(-1),  # all tied
    keep_top_p(tied_logits(), 0.7).softmax(-1),  # ties and zeros
])
def test_inverse_cdf_pick_equals_a_full_sort_of_the_vocabulary(probs: torch.Tensor) -> None:
    generator = torch.Generator().manual_seed(0)
    full_sort = FullSort.of(probs)
    for u in [*torch.rand(300, generator=generator, dtype=torch.float64).tolist(), 0.0, 0.5, 1 - 1e-12]:
        token, draw = pick_by_cdf(probs, u)
        expected, low, high = full_sort.pick(u)
        assert token == expected
        assert (draw.cdf_low, draw.cdf_high) == pytest.approx((low, high), abs=1e-12)


def test_multinomial_band_is_the_picks_band_in_cdf_order() -> None:
    probs = random_logits(7, vocab=2000).softmax(-1)
    generator = torch.Generator().manual_seed(3)
    full_sort = FullSort.of(probs)
    for _ in range(20):
        token, draw = pick_like_multinomial(probs, generator)
        expected, low, high = full_sort.pick((draw.cdf_low + draw.cdf_high) / 2)
        assert (draw.cdf_low, draw.cdf_high) == pytest.approx((low, high), abs=1e-12)
        assert expected == token
