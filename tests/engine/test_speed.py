"""engine.speed measures the real model: these tests prove that what it times is the same
computation generation does, and that its byte counts come from the real tensors.
No timing thresholds here (speed goals live in bench/)."""

from __future__ import annotations

import pytest
import torch

from engine import Generation, SamplerSettings, SettingsError
from engine.forward import lone_pass_decision
from engine.speed import (
    KNOWN_CONFIGS,
    MORE,
    QUICK,
    batch_step_logits,
    decode_flops,
    fit_prefill_cost,
    loaded_kv_config,
    measure_batching,
    measure_cache_vs_recompute,
    measure_decode_intensity,
    measure_decode_reads,
    measure_device,
    measure_kv,
    measure_prefill_cost,
    measure_prefill_decode,
    next_logits_cached,
    next_logits_recomputed,
    sample_context,
    weight_bytes,
)


def test_recomputing_without_the_cache_gives_the_cached_steps_logits(lm):
    context = sample_context(lm, 40)
    cached, recomputed = next_logits_cached(lm, context), next_logits_recomputed(lm, context)
    assert cached.shape == (lm.vocab_size,)
    assert torch.allclose(cached, recomputed, atol=1e-3, rtol=0)
    assert int(cached.argmax()) == int(recomputed.argmax())


def test_cached_step_gives_the_same_logits_as_the_generation_loop(lm):
    generation = Generation(lm, "The capital of France is", sampler=SamplerSettings(temperature=0))
    generation.step()
    generation.step()  # this step's logits come from one cached decode step
    context = generation.prompt_ids + generation.generated_ids[:1]
    # one forward pass serves both (engine/forward.py): the same digits, not merely close ones
    assert torch.equal(next_logits_cached(lm, context), generation.raw_logits(2))


def test_a_batched_decode_step_gives_each_sequence_its_own_logits(lm):
    sequences = [sample_context(lm, 12, offset=7 * row) for row in range(4)]
    assert len({tuple(s) for s in sequences}) == 4  # really different sequences
    batched = batch_step_logits(lm, sequences)
    for row, sequence in enumerate(sequences):
        alone = batch_step_logits(lm, [sequence])[0]
        assert torch.allclose(batched[row], alone, atol=1e-3, rtol=0)
        assert int(batched[row].argmax()) == int(alone.argmax())


def test_kv_bytes_per_position_equal_the_real_cache_tensors(lm):
    snapshot = measure_kv(lm, 9)
    tensor_bytes = snapshot.bytes  # summed over every layer's K and V tensors by read_kv
    assert snapshot.positions == 9
    assert tensor_bytes == 9 * loaded_kv_config(lm).bytes_per_position
    # SmolLM2-135M in float32: K and V x 30 layers x 3 KV heads x 64 x 4 bytes
    assert loaded_kv_config(lm).bytes_per_position == 2 * 30 * 3 * 64 * 4 == 46_080
    generation = Generation(lm, "The capital of France is")
    step = generation.step()
    assert step.kv.bytes == step.kv.positions * loaded_kv_config(lm).bytes_per_position


@pytest.mark.parametrize(("name", "per_position"), [
    ("GPT-2 small", 2 * 12 * 12 * 64 * 4),  # 72 KiB
    ("Llama-2-7B", 2 * 32 * 32 * 128 * 2),  # 512 KiB
    ("Llama-3-8B", 2 * 32 * 8 * 128 * 2),  # 128 KiB
    ("Mistral-7B", 2 * 32 * 8 * 128 * 2),
    ("Qwen2.5-7B", 2 * 28 * 4 * 128 * 2),  # 56 KiB
])
def test_published_configs_give_the_known_kv_bytes_per_token(name, per_position):
    config = next(c for c in KNOWN_CONFIGS if c.name == name)
    assert config.bytes_per_position == per_position
    assert config.bytes_for(4096) == 4096 * per_position


def test_cache_vs_recompute_measures_every_requested_context_length(lm):
    points = measure_cache_vs_recompute(lm, (4, 12), repeats=1)
    assert [p.context_tokens for p in points] == [4, 12]
    assert all(p.cached_ms > 0 and p.recompute_ms > 0 for p in points)


def test_prefill_decode_reports_per_token_cost_of_both(lm):
    result = measure_prefill_decode(lm, prompt_tokens=8, decode_steps=2, repeats=1)
    assert (result.prompt_tokens, result.decode_steps) == (8, 2)
    assert result.prefill_ms > 0 and result.decode_ms > 0


def test_decode_intensity_counts_every_weight_and_the_cache_read(lm):
    result = measure_decode_intensity(lm, context_tokens=6, repeats=1)
    assert result.weight_bytes == weight_bytes(lm) == lm.parameters * 4  # float32 weights
    assert result.kv_bytes == 6 * loaded_kv_config(lm).bytes_per_position
    # two FLOPs per weight, plus scores and weighted values: 30 layers x 9 heads x 64 dims x 6 positions
    assert result.flops == decode_flops(lm, 6) == 2 * lm.parameters + 2 * 2 * 30 * 9 * 64 * 6
    # a multiply and an add per 4-byte weight: well under one FLOP per byte at batch 1
    assert 0.4 < result.flops_per_byte < 0.6


def test_decode_reads_set_the_step_against_a_plain_read_and_its_own_products(lm):
    step = measure_decode_intensity(lm, context_tokens=8, repeats=1)
    reads = measure_decode_reads(lm, step, repeats=1, read_mib=16)
    decision = lone_pass_decision(lm)
    assert (reads.path, reads.reason) == (decision.path, decision.reason)
    # every linear layer's weight once: the tied head and embedding are one tensor
    assert reads.products_bytes == weight_bytes(lm) - sum(p.numel() * 4 for p in lm.model.parameters() if p.dim() == 1)
    assert reads.product_calls == (4 * 30 + 1 if decision.fast else 7 * 30 + 1)  # a layer's products in 4 calls, or 7
    assert reads.read_bytes == 16 * 2**20 and reads.read_ms > 0 and reads.attention_ms > 0
    assert reads.other_ms == max(0.0, step.step_ms - reads.products_ms - reads.attention_ms)
    assert reads.achieved_fraction == step.achieved_bytes_per_s / reads.read_bytes_per_s


def test_batching_measures_each_batch_size_and_divides_by_it(lm):
    points = measure_batching(lm, (1, 3), context_tokens=5, repeats=1)
    assert [p.batch for p in points] == [1, 3]
    assert all(p.context_tokens == 5 and p.step_ms > 0 for p in points)


def test_device_measurement_counts_the_bytes_read_and_written(lm):
    speed = measure_device(torch.device("cpu"), matmul_size=64, copy_mib=4, repeats=1)
    assert speed.copy_bytes == 2 * 4 * 2**20
    assert speed.matmul_size == 64 and speed.dtype == "float32"


@pytest.mark.parametrize(("call", "parameter"), [
    (lambda lm: measure_cache_vs_recompute(lm, (1,)), "context length"),
    (lambda lm: measure_batching(lm, (0,)), "batch size"),
    (lambda lm: measure_prefill_decode(lm, decode_steps=0), "decode_steps"),
    (lambda lm: sample_context(lm, lm.context_window), "context length"),
    (lambda lm: batch_step_logits(lm, [[1, 2], [3]]), "sequences"),
])
def test_bad_sizes_raise_a_settings_error_naming_the_parameter(lm, call, parameter):
    with pytest.raises(SettingsError) as error:
        call(lm)
    assert error.value.parameter == parameter


def test_measurement_sizes_fit_inside_a_small_context_window():
    fitted = MORE.fitted(context_window=300)
    assert fitted.cache_lengths == (16, 64, 128, 256)
    assert fitted.prompt_tokens == 256 and fitted.batch_context == 64
    tiny = QUICK.fitted(context_window=10)
    assert tiny.cache_lengths == (9,) and tiny.prompt_tokens == 9 and tiny.batch_context == 9
    assert QUICK.fitted(context_window=8192) == QUICK


def test_the_prefill_cost_goes_through_both_measured_points_and_grows_faster_than_the_length():
    cost = fit_prefill_cost((100, 400), (1_000.0, 6_000.0))  # 10 ms a token at 100, 15 at 400: the pairs cost
    assert cost.estimate_s(100) == pytest.approx(1.0) and cost.estimate_s(400) == pytest.approx(6.0)
    assert cost.per_pair_ms > 0 and cost.estimate_s(1_600) > 4 * cost.estimate_s(400)
    noisy = fit_prefill_cost((100, 400), (1_000.0, 3_600.0))  # cheaper per token at 400: noise, not attention
    assert noisy.per_pair_ms == 0 and noisy.estimate_s(800) == pytest.approx(7.2)  # the line through 400
    with pytest.raises(SettingsError, match="prefill lengths"):
        fit_prefill_cost((400, 100), (1.0, 2.0))


def test_the_prefill_cost_is_measured_on_the_model_at_the_lengths_asked(tiny_lm):
    cost = measure_prefill_cost(tiny_lm, (8, 32))
    assert cost.lengths == (8, 32) and all(ms > 0 for ms in cost.measured_ms)
    assert cost.estimate_s(32) == pytest.approx(cost.measured_ms[1] / 1e3, rel=1e-6)  # either fit meets it
