"""A lone visitor's decode step through the scripted pass and the single-row kernel: transformers'
own digits (logits and cache entries, torch.equal), used only where its probe showed it."""

from __future__ import annotations

from copy import deepcopy

import pytest
import torch
import torch.nn.functional as F

from engine import Generation, SamplerSettings
from engine.fast import LONE_PASS_ENV, kernel_agrees, lone_decision, lone_rows_linear, lone_rows_linears, lone_step
from engine.forward import cache_prefix, crop_cache, eager_step, forward_one, lone_pass_decision, new_cache
from tests.engine.test_scheduler import tiny_llama
from tests.threads import threads

# (out, in): the bundled model's, then shapes it never has (this CPU's 1-row product sums in one
# order every output count that gives each of its threads a multiple of four: 136 on two threads
# is 68 each; the probe finds the others out)
SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576), (4, 8), (12, 20), (8, 36), (100, 40),
          (136, 68), (8, 388)]


def same_numbers(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal, with NaN where the other has NaN (torch.equal calls NaN unequal to itself)."""
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))


def kernel_shaped_tiny():
    """The tiny Llama with a vocabulary of 320: each of two threads' share of the head is a whole
    number of fours, as this CPU's 1-row product blocks its outputs in every order the kernel copies."""
    return tiny_llama(vocab_size=320)


def kernel_sums_as_this_cpu(weights) -> bool:
    return all(kernel_agrees(w, one_row=True) for w in weights)


@pytest.mark.parametrize("count", [1, 2])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_one_row_gets_the_digits_of_the_one_row_product(shape, count, lone_order) -> None:
    weight = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape)))
    with threads(count):
        assert kernel_agrees(weight, one_row=True)
        for seed in range(4):
            x = torch.randn((1, shape[1]), generator=torch.Generator().manual_seed(seed)) * 10 ** (seed - 1)
            assert torch.equal(lone_rows_linear(x, weight), F.linear(x, weight)), seed


def test_several_weights_in_one_call_give_each_its_one_row_digits(lone_order) -> None:
    x = torch.randn((1, 576), generator=torch.Generator().manual_seed(3))
    weights = [torch.randn(shape, generator=torch.Generator().manual_seed(i)) for i, shape in
               enumerate([(576, 576), (192, 576), (192, 576), (1536, 576)])]
    for out, weight in zip(lone_rows_linears(x, weights), weights, strict=True):
        assert torch.equal(out, F.linear(x, weight))


def test_infinities_and_nans_come_out_where_the_one_row_product_puts_them(lone_order) -> None:
    generator = torch.Generator().manual_seed(5)
    weight = torch.randn((136, 68), generator=generator)
    weight[3, 17] = float("inf")
    weight[8, 0] = float("-inf")
    weight[20, 33] = float("nan")
    weight[40, 5] = weight[40, 6] = 3e38  # overflows to infinity part-way through the sum
    for x in (torch.randn((1, 68), generator=generator),
              torch.where(torch.arange(68) == 11, float("inf"), torch.randn((1, 68), generator=generator)),
              torch.where(torch.arange(68) == 0, float("nan"), torch.randn((1, 68), generator=generator)),
              torch.zeros((1, 68)), -torch.zeros((1, 68))):
        ours, theirs = lone_rows_linear(x, weight), F.linear(x, weight)
        assert same_numbers(ours, theirs)
        assert torch.equal(ours.signbit(), theirs.signbit()) or ours.isnan().any()


def steps_agree(lm, prompt: list[int], steps: int) -> None:
    """The prompt read by the eager pass into two caches, then `steps` greedy tokens decoded one
    at a time: the lone path (forward_one) beside transformers' own pass, every number equal."""
    ours, theirs = new_cache(lm), new_cache(lm)
    eager_step(lm, prompt, ours)
    token = int(eager_step(lm, prompt, theirs)[0].argmax())
    for step in range(steps):
        logits = forward_one(lm, [token], ours)
        assert torch.equal(logits, eager_step(lm, [token], theirs)[0]), (len(prompt), step)
        token = int(logits.argmax())
    for a, b in zip(ours.layers, theirs.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


@pytest.mark.parametrize("count", [1, 2])
def test_the_bundled_models_lone_steps_are_transformers_own_at_every_length(lm, count) -> None:
    text = lm.tokenizer("The lighthouse keeper counted the ships that passed each night, and wrote their "
                        "names in a book that nobody read.")["input_ids"]
    weights = [p for p in lm.model.parameters() if p.dim() == 2]
    with threads(count):
        decision = lone_pass_decision(lm)
        assert decision.threads == count
        assert decision.fast == kernel_sums_as_this_cpu(weights)  # fast exactly where the kernel is proven
        for length in (1, 2, 5, 17, len(text)):
            steps_agree(lm, (text * 8)[:length], 4)
        steps_agree(lm, (text * 20)[:300], 2)  # a long cache


def test_greedy_generation_gives_generates_tokens_and_logits(lm) -> None:
    prompt = "Name three colours of the rainbow."
    gen = Generation(lm, prompt, sampler=SamplerSettings(temperature=0), seed=0)
    records = [gen.step() for _ in range(12)]
    config = deepcopy(lm.model.generation_config)
    config.update(do_sample=False, max_new_tokens=12, min_new_tokens=12, output_logits=True,
                  return_dict_in_generate=True, temperature=None, top_p=None, top_k=None)
    with torch.inference_mode():
        out = lm.model.generate(torch.tensor([gen.prompt_ids]), attention_mask=torch.ones((1, len(gen.prompt_ids)),
                                dtype=torch.long), generation_config=config)
    tokens = out.sequences[0, len(gen.prompt_ids):].tolist()
    assert [r.token_id for r in records] == tokens
    for record, logits in zip(records, out.logits, strict=True):
        assert record.logit == float(logits[0, record.token_id])  # the pick's logit, to the last bit


def test_a_tiny_llama_with_shapes_the_bundled_model_lacks_gets_the_fast_pass_and_its_digits() -> None:
    tiny = tiny_llama(hidden_size=48, intermediate_size=100, num_attention_heads=4, num_key_value_heads=1)
    decision = lone_pass_decision(tiny)
    assert decision.fast == kernel_sums_as_this_cpu([p for p in tiny.model.parameters() if p.dim() == 2])
    for length in (1, 3, 40):
        steps_agree(tiny, [(5 * i + 2) % 300 for i in range(length)], 6)


@pytest.mark.parametrize("shape", [dict(hidden_size=30, intermediate_size=62, num_attention_heads=3),
                                   dict(hidden_size=40, intermediate_size=100, num_attention_heads=4)], ids=str)
def test_shapes_the_kernel_does_not_sum_as_this_cpu_keep_the_eager_pass(shape) -> None:
    """Inputs not a multiple of four (the kernel cannot take them), or a key projection of 10
    outputs (this CPU's 1-row product sums it in another order): the probe finds both out."""
    tiny = tiny_llama(num_key_value_heads=1, **shape)
    decision = lone_pass_decision(tiny)
    # another CPU may sum a 10-output product as the kernel does: the probe decides, not this test
    assert decision.fast == kernel_sums_as_this_cpu([p for p in tiny.model.parameters() if p.dim() == 2])
    assert decision.fast or "kernel" in decision.reason
    if shape["hidden_size"] % 4:
        assert not decision.fast  # the kernel takes inputs in fours only
    steps_agree(tiny, [1, 2, 3], 3)


def test_when_the_probe_differs_the_eager_pass_runs_and_the_reason_is_given() -> None:
    tiny = kernel_shaped_tiny()

    def off_by_a_bit(lm, token_ids, cache):
        return eager_step(lm, token_ids, cache) + 1e-6

    decision = lone_decision(tiny, off_by_a_bit)
    assert not decision.fast and "probe" in decision.reason
    cache = new_cache(tiny)
    eager_step(tiny, [1, 2, 3], cache)
    assert lone_step(tiny, [4], cache, off_by_a_bit) is None  # the caller runs the eager pass
    assert cache.get_seq_length() == 3


def test_the_environment_can_keep_every_lone_step_eager(monkeypatch) -> None:
    monkeypatch.setenv(LONE_PASS_ENV, "eager")
    tiny = kernel_shaped_tiny()
    decision = lone_pass_decision(tiny)
    assert not decision.fast and LONE_PASS_ENV in decision.reason
    steps_agree(tiny, [9, 8, 7], 2)


def test_a_failed_fast_pass_leaves_the_cache_as_it_was(lone_order) -> None:
    tiny = kernel_shaped_tiny()
    assert lone_pass_decision(tiny).fast
    cache = new_cache(tiny)
    eager_step(tiny, [1, 2, 3], cache)
    keys = [layer.keys.clone() for layer in cache.layers]
    with pytest.raises(IndexError):
        forward_one(tiny, [10_000], cache)  # past the vocabulary
    assert cache.get_seq_length() == 3 and all(torch.equal(a, b.keys) for a, b in zip(keys, cache.layers, strict=True))


def test_steps_write_into_the_caches_block_and_never_into_a_tensor_handed_out(lone_order) -> None:
    """The fast pass grows a cache in place, in blocks (engine/fast/scripted_llama.py KVBlock);
    keys and values a caller kept (an earlier step's, those from before a rewind, a prefix
    cache's) keep their numbers, and each step's cache is the eager pass's."""
    tiny = kernel_shaped_tiny()
    assert lone_pass_decision(tiny).fast
    cache, eager = new_cache(tiny), new_cache(tiny)
    for both in (cache, eager):
        eager_step(tiny, [1, 2, 3], both)

    def step(token: int) -> None:
        assert torch.equal(forward_one(tiny, [token], cache), eager_step(tiny, [token], eager)[0])
        for ours, theirs in zip(cache.layers, eager.layers, strict=True):
            assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)

    def kept() -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(tensor, tensor.clone()) for layer in cache.layers for tensor in (layer.keys, layer.values)]

    step(4)
    block = cache.tbt_kv_block.tensor
    early = kept()
    for token in range(5, 15):
        step(token)
    assert cache.tbt_kv_block.tensor is block  # one block, written in place
    before_rewind = kept()
    crop_cache(cache, 8)
    crop_cache(eager, 8)
    step(40)  # another token where the rewound ones were
    assert cache.tbt_kv_block.tensor is not block
    prefix = cache_prefix(cache, 5)
    before_prefix = kept()
    forward_one(tiny, [41], prefix)
    for token in range(60, 130):  # past a block's 64 positions
        step(token)
    for view, numbers in early + before_rewind + before_prefix:
        assert torch.equal(view, numbers)


def test_a_prompt_or_a_first_step_without_a_cache_takes_the_eager_pass() -> None:
    tiny = kernel_shaped_tiny()
    assert lone_step(tiny, [1, 2], new_cache(tiny), eager_step) is None  # two tokens: a prefill
    assert lone_step(tiny, [1], new_cache(tiny), eager_step) is None  # an empty cache
    assert lone_step(tiny, [1], None, eager_step) is None


def test_a_quantised_model_keeps_the_eager_pass() -> None:
    tiny = kernel_shaped_tiny()
    tiny.model.model = torch.ao.quantization.quantize_dynamic(tiny.model.model, {torch.nn.Linear}, dtype=torch.qint8)
    decision = lone_pass_decision(tiny)
    assert not decision.fast and "plain Llama" in decision.reason
    steps_agree(tiny, [4, 5, 6], 2)


@pytest.mark.parametrize("poison", [float("inf"), float("nan"), 1e30])
def test_infinities_and_nans_in_a_step_come_out_as_transformers_puts_them(poison, lone_order) -> None:
    """A token whose embedding overflows (or is infinite, or NaN): both passes carry it through
    the norms, attention and head alike, and the cache holds the same numbers."""
    tiny = kernel_shaped_tiny()
    assert lone_pass_decision(tiny).fast  # probed on ordinary numbers, before the poison
    with torch.no_grad():
        tiny.model.model.embed_tokens.weight[7, :5] = poison
    ours, theirs = new_cache(tiny), new_cache(tiny)
    eager_step(tiny, [1, 2, 3], ours)
    eager_step(tiny, [1, 2, 3], theirs)
    for token in (7, 4, 7):
        assert same_numbers(forward_one(tiny, [token], ours), eager_step(tiny, [token], theirs)[0])
    assert ours.layers[0].keys.isfinite().all() == (poison == 1e30)  # inf and NaN reached the cache
    for a, b in zip(ours.layers, theirs.layers, strict=True):
        assert same_numbers(a.keys, b.keys) and same_numbers(a.values, b.values)
