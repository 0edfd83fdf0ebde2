"""The forward-pass scheduler: packed passes, fairness, failures, cancellation, memory, and
concurrent generations on the real model against lone runs."""

from __future__ import annotations

import gc
import sys
import threading
import time
import weakref
from concurrent.futures import CancelledError, Future

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import engine.serving.packed as packed_module
import engine.serving.packed_twin as twin_module
import engine.serving.scheduler as scheduler_module
from engine import Generation, GenerationFinished, LoadedModel, SamplerSettings, StopSettings
from engine.errors import SettingsError
from engine.fast import (
    LONE_ROWS,
    ONE_ROW_PRODUCTS,
    ROW_LOOP,
    compiled_pass,
    compiled_prefill,
    kernel_agrees,
    llama_weights,
    proof_decisions,
)
from engine.forward import cache_length, cache_prefix, forward_one, new_cache
from engine.generation import KEEP_LOGITS
from engine.kvcache import KVGeometry
from engine.loading import ModelSource
from engine.serving.packed import forward_packed, forward_prefills, scripted_plan, scripted_prefill
from engine.serving.packed_twin import ROWWISE_CHUNK, sdpa_decode_options
from engine.serving.prompt_rows import measure_row_kinds
from engine.serving.scheduler import ForwardScheduler, batching_from_env, worth_running_now

# The bound docs/serving.md states for a "fast" packed pass on SmolLM2-135M (bench/batch_parity.py).
FAST_LOGIT_BOUND = 1e-4
SAMPLED = SamplerSettings(temperature=0.9, top_k=40, top_p=0.95)


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    return tiny_llama()


def tiny_llama(**config: object) -> LoadedModel:
    """A 2-layer Llama with random weights (hidden 64, vocab 300): fast, never shown to anyone."""
    shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=300, max_position_embeddings=512, attn_implementation="sdpa")
    config = LlamaConfig(**{**shape, **config})  # any of them overridden
    model = LlamaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
    return LoadedModel(model=model, tokenizer=None, source=ModelSource("folder", "tiny"), name="tiny Llama",
                       device=torch.device("cpu"), dtype=torch.float32, eos_ids=(), context_window=512,
                       geometry=KVGeometry.from_config(config), parameters=0, load_seconds=0.0, from_cache=False,
                       texts=None)


def filled_cache(lm: LoadedModel, length: int, offset: int = 0):
    cache = new_cache(lm)
    forward_one(lm, [(offset + 7 * i) % 300 for i in range(length)], cache)
    return cache


def lone_logits(lm: LoadedModel, token: int, cache) -> torch.Tensor:
    """The batch-1 pass over a view of `cache` (which stays as it was)."""
    return forward_one(lm, [token], cache_prefix(cache, cache_length(cache)))


class Gate:
    """Holds the scheduler's worker inside its next lone pass or prompts' pass until opened, and
    logs every pass."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.open = threading.Event()
        self.entered = threading.Event()
        self.log: list[tuple[str, int]] = []
        lone, packed, prompts = (scheduler_module.forward_one, scheduler_module.forward_packed,
                                 scheduler_module.forward_prefills)

        def gated_lone(lm, token_ids, cache):
            self.log.append(("alone", len(token_ids)))
            self.entered.set()
            self.open.wait(10)
            return lone(lm, token_ids, cache)

        def gated_prompts(lm, token_lists, caches):
            self.log.append(("prompts", tuple(len(ids) for ids in token_lists)))
            self.entered.set()
            self.open.wait(10)
            return prompts(lm, token_lists, caches)

        def logged_packed(lm, token_ids, caches, exact=True):
            self.log.append(("packed", len(token_ids)))
            return packed(lm, token_ids, caches, exact)

        monkeypatch.setattr(scheduler_module, "forward_one", gated_lone)
        monkeypatch.setattr(scheduler_module, "forward_packed", logged_packed)
        monkeypatch.setattr(scheduler_module, "forward_prefills", gated_prompts)


def submit(scheduler: ForwardScheduler, token_ids: list[int], cache, results: dict, key: object) -> threading.Thread:
    def run() -> None:
        try:
            results[key] = scheduler.forward(token_ids, cache)
        except BaseException as exc:  # the test reads what each visitor got
            results[key] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def wait_for_queue(scheduler: ForwardScheduler, count: int) -> None:
    deadline = time.monotonic() + 10
    while scheduler.stats().waiting < count:
        assert time.monotonic() < deadline, "requests never reached the queue"
        time.sleep(0.005)


# ---- the packed pass ---------------------------------------------------------------------------

@pytest.mark.parametrize("exact", [True, False])
def test_packed_pass_gives_each_cache_of_its_own_length_its_lone_logits(tiny, exact: bool) -> None:
    caches = [filled_cache(tiny, length, offset=length) for length in (3, 11, 1, 30)]
    tokens = [5, 17, 250, 42]
    expected = torch.stack([lone_logits(tiny, t, c) for t, c in zip(tokens, caches, strict=True)])
    got = forward_packed(tiny, tokens, caches, exact=exact)
    assert got.shape == (4, 300)
    if exact:
        assert torch.equal(got, expected)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert [cache_length(c) for c in caches] == [4, 12, 2, 31]
    # each row's new keys went to its own cache, at its own position
    for token, cache in zip(tokens, caches, strict=True):
        alone = cache_prefix(cache, cache_length(cache) - 1)
        forward_one(tiny, [token], alone)
        torch.testing.assert_close(cache.layers[1].keys, alone.layers[1].keys, rtol=0, atol=1e-5)


@pytest.fixture
def eager_twin(monkeypatch) -> None:
    """Packed passes on the eager twin model, as a model other than a plain Llama gets them."""
    for module in (packed_module, scheduler_module):
        monkeypatch.setattr(module, "scripted_plan", lambda lm, exact=True: None)


def test_where_the_batched_row_product_would_change_digits_the_rows_go_one_by_one(tiny, monkeypatch,
                                                                                    eager_twin, forget_proofs) -> None:
    """A machine whose batched kernel sums in another order: the probe finds it, and every
    row still gets its lone logits through the row-by-row loop."""
    real_bmm = torch.bmm
    monkeypatch.setattr(torch, "bmm", lambda a, b: real_bmm(a, b) * (1 + 1e-6))  # other last bits
    forget_proofs(twin_module.BATCHED_PATH)
    caches = [filled_cache(tiny, length, offset=length) for length in (2, 9, 5)]
    expected = torch.stack([lone_logits(tiny, t, c) for t, c in zip([4, 8, 15], caches, strict=True)])
    assert torch.equal(forward_packed(tiny, [4, 8, 15], caches), expected)
    batched = [proof for proof in proof_decisions() if proof.path == twin_module.BATCHED_PATH]
    assert batched and not any(proof.proven for proof in batched)


def test_the_scripted_pass_multiplies_row_by_row_where_the_probe_says_the_batched_product_differs(
        tiny, monkeypatch, forget_proofs) -> None:
    """Where neither the exact rows kernel nor the batched call gives a row its 1-row product's
    digits, each row gets its own call."""
    forget_proofs(*packed_module.PLAN_PATHS.values())
    monkeypatch.setattr(twin_module, "batched_rows_agree", lambda weight, rows: False)
    monkeypatch.setattr(packed_module, "kernel_agrees", lambda weight, one_row=False: False)
    caches = [filled_cache(tiny, length, offset=length) for length in (2, 9, 5)]
    expected = torch.stack([lone_logits(tiny, t, c) for t, c in zip([4, 8, 15], caches, strict=True)])
    assert torch.equal(forward_packed(tiny, [4, 8, 15], caches), expected)
    plan = scripted_plan(tiny)
    layers, head = plan.hows_for(3)
    matrices = [how for how, weight in zip(layers, plan.weights.layers, strict=True) if weight.dim() == 2]
    assert set(matrices) == set(head) == {ROW_LOOP}


@pytest.mark.parametrize("exact", [True, False])
def test_a_plain_llama_runs_the_packed_pass_as_one_scripted_call_with_the_eager_twins_digits(
        tiny, monkeypatch, exact: bool) -> None:
    """The scripted pass (one call, outside the GIL) gives the eager twin's logits and cache
    entries bit for bit, in either batching kind."""
    assert scripted_plan(tiny, exact) is not None
    lengths, tokens = (3, 11, 1, 30), [5, 17, 250, 42]
    scripted_caches = [filled_cache(tiny, n, offset=n) for n in lengths]
    scripted = forward_packed(tiny, tokens, scripted_caches, exact=exact)
    monkeypatch.setattr(packed_module, "scripted_plan", lambda lm, exact=True: None)
    twin_caches = [filled_cache(tiny, n, offset=n) for n in lengths]
    assert torch.equal(scripted, forward_packed(tiny, tokens, twin_caches, exact=exact))
    for a, b in zip(scripted_caches, twin_caches, strict=True):
        for ours, theirs in zip(a.layers, b.layers, strict=True):
            assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)


def test_a_decoder_that_is_not_a_plain_llama_keeps_the_eager_twin() -> None:
    biased = tiny_llama(attention_bias=True)
    assert scripted_plan(biased) is None
    caches = [filled_cache(biased, length, offset=length) for length in (2, 9)]
    expected = torch.stack([lone_logits(biased, t, c) for t, c in zip([4, 8], caches, strict=True)])
    assert torch.equal(forward_packed(biased, [4, 8], caches), expected)


def test_a_scripted_pass_whose_probe_differs_from_the_twin_is_never_used(monkeypatch) -> None:
    """Should TorchScript (or a newer transformers' Llama) give other digits, the first probe
    pass shows it and the eager twin serves every packed pass."""
    real = compiled_pass()

    def off_by_a_bit(*args: object) -> tuple:
        logits, keys, values = real(*args)
        return logits * (1 + 1e-6), keys, values

    monkeypatch.setattr(packed_module, "compiled_pass", lambda: off_by_a_bit)
    fresh = tiny_llama()
    assert scripted_plan(fresh) is None
    caches = [filled_cache(fresh, length, offset=length) for length in (4, 7)]
    expected = torch.stack([lone_logits(fresh, t, c) for t, c in zip([4, 8], caches, strict=True)])
    assert torch.equal(forward_packed(fresh, [4, 8], caches), expected)


def test_packed_attention_makes_the_lone_sdpa_call_directly_for_grouped_heads(tiny, lm) -> None:
    """The packed pass calls torch's sdpa as transformers' sdpa attention does for one decode
    token (the exact tests above check the digits); with no grouped heads, no gqa flag."""
    for model in (tiny, lm):
        attention = model.model.model.layers[0].self_attn
        keys = torch.zeros(1, model.model.config.num_key_value_heads, 5, attention.head_dim)
        assert attention.num_key_value_groups > 1
        assert sdpa_decode_options(sdpa_attention_forward, attention, keys, keys) == {"enable_gqa": True}
        assert sdpa_decode_options(object(), attention, keys, keys) is None  # another attention: its own call
    ungrouped = type("Attention", (), {"num_key_value_groups": 1})()
    assert sdpa_decode_options(sdpa_attention_forward, ungrouped, keys, keys) == {}


def test_packed_pass_leaves_the_shared_models_attention_alone(tiny) -> None:
    forward_packed(tiny, [1, 2], [filled_cache(tiny, 4), filled_cache(tiny, 6)])
    assert tiny.model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("scripted", [True, False], ids=["scripted", "eager twin"])
def test_a_packed_pass_that_fails_part_way_puts_every_cache_back(tiny, monkeypatch, scripted: bool) -> None:
    if not scripted:
        monkeypatch.setattr(packed_module, "scripted_plan", lambda lm, exact=True: None)
    caches = [filled_cache(tiny, 5), filled_cache(tiny, 9)]
    broken = caches[1].layers[1]
    broken.keys = broken.keys[..., :-1]  # a head_dim the second layer's update cannot join
    before = [[layer.keys.clone() for layer in c.layers] for c in caches]
    with pytest.raises(RuntimeError):
        forward_packed(tiny, [3, 4], caches)
    for cache, keys in zip(caches, before, strict=True):
        for layer, old in zip(cache.layers, keys, strict=True):
            assert torch.equal(layer.keys, old)  # the twin had written layer 0: it is undone


def lone_prefill(lm: LoadedModel, token_ids: list[int]) -> tuple[torch.Tensor, object]:
    cache = new_cache(lm)
    return forward_one(lm, token_ids, cache), cache


def test_prompts_read_together_give_each_its_lone_prefill_numbers_and_cache(tiny, stacked_prompts) -> None:
    prompts = [[5, 6, 7], [9], list(range(40, 60)), [1, 2]]
    assert scripted_prefill(tiny) is not None  # one call, outside the GIL
    caches = [new_cache(tiny) for _ in prompts]
    logits = forward_prefills(tiny, prompts, caches)
    for ids, got, cache in zip(prompts, logits, caches, strict=True):
        expected, lone_cache = lone_prefill(tiny, ids)
        assert torch.equal(got, expected) and not got.requires_grad  # no autograd graph kept
        for ours, theirs in zip(cache.layers, lone_cache.layers, strict=True):
            assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)


def test_a_scripted_prompts_pass_whose_probe_differs_from_lone_passes_is_never_used(monkeypatch) -> None:
    real = compiled_prefill()

    def off_by_a_bit(*args: object) -> tuple:
        logits, keys, values = real(*args)
        return [row * (1 + 1e-6) for row in logits], keys, values

    monkeypatch.setattr(packed_module, "compiled_prefill", lambda: off_by_a_bit)
    fresh = tiny_llama()
    assert scripted_prefill(fresh) is None
    caches = [new_cache(fresh), new_cache(fresh)]
    logits = forward_prefills(fresh, [[4, 5], [6, 7, 8]], caches)
    for ids, got in zip([[4, 5], [6, 7, 8]], logits, strict=True):
        assert torch.equal(got, lone_prefill(fresh, ids)[0])


def test_a_prompt_after_cached_positions_is_read_by_its_own_pass(tiny, monkeypatch) -> None:
    """Only empty caches are read together; a prompt that continues a cache gets the plain pass."""
    monkeypatch.setattr(packed_module, "_prefill_scripted", lambda *args: pytest.fail("read together"))
    cache = filled_cache(tiny, 4)
    expected = forward_one(tiny, [8, 9], cache_prefix(cache, 4))
    assert torch.equal(forward_prefills(tiny, [[8, 9]], [cache])[0], expected)
    assert cache_length(cache) == 6


@pytest.mark.parametrize("scripted", [True, False], ids=["scripted", "one pass each"])
def test_prompts_that_fail_part_way_leave_every_cache_as_it_was(tiny, monkeypatch, scripted: bool) -> None:
    if not scripted:
        monkeypatch.setattr(packed_module, "scripted_prefill", lambda lm: None)
    caches = [new_cache(tiny), new_cache(tiny)]
    with pytest.raises(IndexError):
        forward_prefills(tiny, [[3, 4], [6, 10_000]], caches)  # 10,000 is past the vocabulary
    assert [cache_length(c) for c in caches] == [0, 0]  # one by one, the first had been read: undone


def test_a_failing_prompt_fails_alone_and_the_others_read_together_get_their_lone_numbers(tiny,
                                                                                        monkeypatch) -> None:
    gate, scheduler, results = Gate(monkeypatch), ForwardScheduler(tiny), {}
    try:
        threads = [submit(scheduler, [1, 2], new_cache(tiny), results, "first")]
        gate.entered.wait(10)
        prompts = {"a": [3, 4, 5], "bad": [6, 10_000], "c": [7, 8]}  # 10,000 is past the vocabulary
        caches = {key: new_cache(tiny) for key in prompts}
        for n, key in enumerate(prompts):
            threads.append(submit(scheduler, prompts[key], caches[key], results, key))
            wait_for_queue(scheduler, n + 1)
        gate.open.set()
        for thread in threads:
            thread.join(10)
        assert gate.log[:2] == [("prompts", (2,)), ("prompts", (3, 2, 2))]
        assert isinstance(results["bad"], IndexError) and cache_length(caches["bad"]) == 0
        for key in ("a", "c"):
            assert torch.equal(results[key], lone_prefill(tiny, prompts[key])[0])
            assert cache_length(caches[key]) == len(prompts[key])
    finally:
        scheduler.close()


# ---- the scheduler ------------------------------------------------------------------------------

def test_decode_steps_waiting_together_run_as_one_packed_pass(tiny, monkeypatch) -> None:
    gate, scheduler, results = Gate(monkeypatch), ForwardScheduler(tiny), {}
    try:
        threads = [submit(scheduler, [1, 2, 3], new_cache(tiny), results, "prompt")]
        gate.entered.wait(10)
        caches = {i: filled_cache(tiny, 4 + i, offset=i) for i in range(3)}
        expected = {i: lone_logits(tiny, 10 + i, caches[i]) for i in caches}
        threads += [submit(scheduler, [10 + i], caches[i], results, i) for i in caches]
        wait_for_queue(scheduler, 3)
        gate.open.set()
        for thread in threads:
            thread.join(10)
        assert gate.log == [("prompts", (3,)), ("packed", 3)]
        assert scheduler.stats().recent_batches == (1, 3)
        for i in caches:
            assert torch.equal(results[i], expected[i])  # exact batching: the lone digits
    finally:
        scheduler.close()


def test_prompts_wait_for_the_decode_steps_queued_behind_them_and_share_a_token_budget(tiny, monkeypatch) -> None:
    gate, scheduler, results = Gate(monkeypatch), ForwardScheduler(tiny), {}
    try:
        threads = [submit(scheduler, [1, 2], new_cache(tiny), results, "first prompt")]
        gate.entered.wait(10)
        long = scheduler_module.PREFILL_TOKENS - 10
        arrivals = [("long prompt", list(range(long))), ("decode a", [5]), ("too many for the budget", list(range(20))),
                    ("decode b", [6]), ("short prompt", [7, 8, 9])]
        for key, ids in arrivals:
            threads.append(submit(scheduler, ids, filled_cache(tiny, 3) if len(ids) == 1 else new_cache(tiny),
                                  results, key))
            wait_for_queue(scheduler, len(threads) - 1)
        gate.open.set()
        for thread in threads:
            thread.join(10)
        # round 2: both decode steps in one pass, then prompts oldest first within the budget, in
        # one call (the 20-token one does not fit beside the long one; the 3-token one does);
        # round 3: the prompt left over
        assert gate.log == [("prompts", (2,)), ("packed", 2), ("prompts", (long, 3)), ("prompts", (20,))]
        assert all(isinstance(results[key], torch.Tensor) for key, _ in arrivals)
    finally:
        scheduler.close()


def test_unbatched_scheduler_runs_every_pass_alone_in_arrival_order(tiny, monkeypatch) -> None:
    gate, scheduler, results = Gate(monkeypatch), ForwardScheduler(tiny, batching="off"), {}
    try:
        threads = [submit(scheduler, [1, 2], new_cache(tiny), results, "first")]
        gate.entered.wait(10)
        for n, ids in enumerate(([5], [6, 7, 8, 9], [4])):
            threads.append(submit(scheduler, ids, filled_cache(tiny, 3) if len(ids) == 1 else new_cache(tiny),
                                  results, n))
            wait_for_queue(scheduler, n + 1)
        gate.open.set()
        for thread in threads:
            thread.join(10)
        assert gate.log == [("alone", 2), ("alone", 1), ("alone", 4), ("alone", 1)]
        assert scheduler.stats().batching == "off"
    finally:
        scheduler.close()


def test_a_failing_request_fails_alone_and_the_others_get_their_lone_numbers(tiny, monkeypatch) -> None:
    gate, scheduler, results = Gate(monkeypatch), ForwardScheduler(tiny), {}
    try:
        threads = [submit(scheduler, [1, 2], new_cache(tiny), results, "prompt")]
        gate.entered.wait(10)
        caches = {key: filled_cache(tiny, 6, offset=n) for n, key in enumerate(("a", "bad", "c"))}
        tokens = {"a": 11, "bad": 10_000, "c": 13}  # 10,000 is past the vocabulary
        expected = {key: lone_logits(tiny, tokens[key], caches[key]) for key in ("a", "c")}
        for n, key in enumerate(caches):
            threads.append(submit(scheduler, [tokens[key]], caches[key], results, key))
            wait_for_queue(scheduler, n + 1)
        gate.open.set()
        for thread in threads:
            thread.join(10)
        assert isinstance(results["bad"], IndexError)
        assert cache_length(caches["bad"]) == 6
        for key in ("a", "c"):
            assert torch.equal(results[key], expected[key])  # run again alone: the lone pass's digits
            assert cache_length(caches[key]) == 7
    finally:
        scheduler.close()


def test_a_cancelled_visitor_leaves_no_cache_in_the_scheduler(tiny, monkeypatch) -> None:
    gate, scheduler, results = Gate(monkeypatch), ForwardScheduler(tiny), {}
    try:
        threads = [submit(scheduler, [1, 2], new_cache(tiny), results, "prompt")]
        gate.entered.wait(10)
        cache = filled_cache(tiny, 4)
        watch = weakref.ref(cache)
        threads.append(submit(scheduler, [9], cache, results, "leaver"))
        wait_for_queue(scheduler, 1)
        assert scheduler.cancel(cache) == 1
        threads[-1].join(10)
        assert isinstance(results.pop("leaver"), CancelledError)
        del cache
        gate.open.set()
        threads[0].join(10)
        gc.collect()
        assert watch() is None
        # a request that was served is not held either
        served = filled_cache(tiny, 4)
        watch = weakref.ref(served)
        scheduler.forward([3], served)
        del served
        gc.collect()
        assert watch() is None
    finally:
        scheduler.close()


# ---- reading the prompt ahead of the first step -----------------------------------------------

AHEAD = {"sampler": SamplerSettings(temperature=0.8, top_p=0.9), "seed": 5,
         "stop": StopSettings(max_new_tokens=8, ignore_eos=True)}


def assert_same_steps(ours: Generation, theirs: Generation, steps: int) -> None:
    for _ in range(steps):
        mine, other = ours.step(), theirs.step()
        assert (mine.token_id, mine.forward_tokens, mine.kv.positions) == (other.token_id, other.forward_tokens,
                                                                           other.kv.positions)
        assert torch.equal(ours.raw_logits(mine.index), theirs.raw_logits(other.index))


def test_a_prompt_read_ahead_is_the_first_steps_own_pass_and_the_cache_stays_empty_until_then(tiny_lm) -> None:
    scheduler = ForwardScheduler(tiny_lm)
    try:
        ahead = Generation(tiny_lm, "hello there", scheduler=scheduler, **AHEAD)
        ahead.read_prompt_ahead()
        ahead.read_prompt_ahead()  # once under way, again does nothing
        assert ahead.reading_ahead
        deadline = time.monotonic() + 10
        while scheduler.stats().passes < 1:
            assert time.monotonic() < deadline, "the prompt was never read"
            time.sleep(0.005)
        assert ahead.kv.positions == 0 and not ahead.steps  # nothing a student sees has changed
        assert_same_steps(ahead, Generation(tiny_lm, "hello there", **AHEAD), 4)
        assert not ahead.reading_ahead
        assert ahead.steps[0].forward_tokens == len(ahead.prompt_ids) and ahead.steps[0].timing.forward_ms > 0
        assert scheduler.stats().passes == 4  # the prompt was read once, then one pass a step
    finally:
        scheduler.close()


def test_a_prompt_read_ahead_says_how_long_it_has_been_reading_and_when_it_is_done(tiny_lm, monkeypatch) -> None:
    scheduler = ForwardScheduler(tiny_lm)
    try:
        pending = Future()
        monkeypatch.setattr(scheduler, "submit", lambda token_ids, cache: pending)
        ahead = Generation(tiny_lm, "hello there", scheduler=scheduler, **AHEAD)
        assert ahead.prompt_reading() is None  # nothing read ahead yet
        ahead.read_prompt_ahead()
        first = ahead.prompt_reading()
        assert first is not None and not first.done and first.tokens == len(ahead.prompt_ids)
        time.sleep(0.05)
        later = ahead.prompt_reading()
        assert later.elapsed_s >= first.elapsed_s + 0.04 and not later.done
        pending.set_exception(RuntimeError("the pass failed"))
        ended = ahead.prompt_reading()
        assert ended.done
        time.sleep(0.05)
        assert ahead.prompt_reading().elapsed_s == ended.elapsed_s  # the clock stopped with the pass
        ahead.step()  # the first step reads the prompt itself, as without it
        assert ahead.prompt_reading() is None
    finally:
        scheduler.close()


def test_a_prompt_read_ahead_that_fails_is_read_again_by_the_first_step(tiny_lm, monkeypatch) -> None:
    scheduler = ForwardScheduler(tiny_lm)
    try:
        failed = Future()
        failed.set_exception(RuntimeError("the pass failed"))
        monkeypatch.setattr(scheduler, "submit", lambda token_ids, cache: failed)
        ahead = Generation(tiny_lm, "hello there", scheduler=scheduler, **AHEAD)
        ahead.read_prompt_ahead()
        assert_same_steps(ahead, Generation(tiny_lm, "hello there", **AHEAD), 2)
    finally:
        scheduler.close()


def test_a_first_step_that_fails_keeps_the_prompt_read_ahead_for_the_next_try(tiny_lm, monkeypatch) -> None:
    scheduler = ForwardScheduler(tiny_lm)
    try:
        ahead = Generation(tiny_lm, "hello there", scheduler=scheduler, **AHEAD)
        ahead.read_prompt_ahead()
        real = Generation._sample
        monkeypatch.setattr(Generation, "_sample", lambda *args, **kwargs: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            ahead.step()
        assert ahead.kv.positions == 0 and ahead.reading_ahead
        monkeypatch.setattr(Generation, "_sample", real)
        assert_same_steps(ahead, Generation(tiny_lm, "hello there", **AHEAD), 2)
        assert scheduler.stats().passes == 2  # the prompt was not read twice
    finally:
        scheduler.close()


def test_closing_a_generation_or_changing_its_prompt_withdraws_the_prompt_read_ahead(tiny_lm, monkeypatch) -> None:
    gate, scheduler, results = Gate(monkeypatch), ForwardScheduler(tiny_lm), {}
    try:
        threads = [submit(scheduler, [1, 2], new_cache(tiny_lm), results, "first")]
        gate.entered.wait(10)
        leaver = Generation(tiny_lm, "hello there", scheduler=scheduler, **AHEAD)
        leaver.read_prompt_ahead()
        wait_for_queue(scheduler, 1)
        changed = Generation(tiny_lm, "hello again", scheduler=scheduler, **AHEAD)
        changed.read_prompt_ahead()
        wait_for_queue(scheduler, 2)
        leaver.close()
        changed.stop_reading_ahead()  # the visitor changed the prompt again
        assert scheduler.stats().waiting == 0 and not leaver.reading_ahead and not changed.reading_ahead
        gate.open.set()
        threads[0].join(10)
    finally:
        scheduler.close()


def test_without_a_scheduler_the_prompt_is_read_by_the_first_step(tiny_lm) -> None:
    alone = Generation(tiny_lm, "hello there", **AHEAD)
    alone.read_prompt_ahead()
    assert not alone.reading_ahead


def test_a_closed_scheduler_refuses_passes_with_a_clear_error(tiny) -> None:
    scheduler = ForwardScheduler(tiny)
    scheduler.close()
    with pytest.raises(scheduler_module.SchedulerClosed, match="closed"):
        scheduler.forward([1], new_cache(tiny))


def test_a_pass_waits_for_more_visitors_only_while_fewer_than_half_of_those_expected_are_there() -> None:
    quick = 0.2  # seconds from a visitor's pass to its next step: a class clicking as fast as it can
    assert not worth_running_now(waiting=1, expected=10, typical_return_s=quick)  # a class coming back
    assert worth_running_now(waiting=15, expected=30, typical_return_s=quick)  # the rest still draw theirs
    assert worth_running_now(waiting=5, expected=10, typical_return_s=quick)
    assert worth_running_now(waiting=0, expected=1, typical_return_s=quick)  # a visitor alone never waits
    assert worth_running_now(waiting=1, expected=30, typical_return_s=1.1)  # a class that thinks: no one is due


def test_a_decode_step_records_how_long_its_visitor_took_to_come_back_and_a_prompt_does_not(tiny) -> None:
    scheduler = ForwardScheduler(tiny)
    try:
        cache = new_cache(tiny)
        scheduler.forward([1, 2, 3], cache)  # a prompt: the visitor's first pass
        assert list(scheduler._returns) == []
        scheduler._seen[id(cache)] = time.perf_counter() - 0.7  # as if served 0.7 s ago
        scheduler.forward([4], cache)
        assert len(scheduler._returns) == 1 and 0.7 <= scheduler._returns[0] < 60
    finally:
        scheduler.close()


def test_batching_setting_is_read_from_tbt_batching_and_checked() -> None:
    assert batching_from_env({}) == "exact"
    assert batching_from_env({"TBT_BATCHING": " Fast "}) == "fast"
    with pytest.raises(SettingsError, match=r"TBT_BATCHING = 'quick'.*exact, fast, off"):
        batching_from_env({"TBT_BATCHING": "quick"})
    with pytest.raises(SettingsError, match="batching"):
        ForwardScheduler(None, batching="sometimes")


def test_a_scheduler_of_eager_passes_shortens_the_gil_switch_interval_but_never_lengthens_it(tiny,
                                                                                             eager_twin) -> None:
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)  # Python's default
        ForwardScheduler(tiny).close()
        assert sys.getswitchinterval() == pytest.approx(scheduler_module.SWITCH_INTERVAL_S)
        sys.setswitchinterval(0.00005)  # someone chose shorter: kept
        ForwardScheduler(tiny).close()
        assert sys.getswitchinterval() == pytest.approx(0.00005)
        sys.setswitchinterval(0.005)
        ForwardScheduler(tiny, batching="off").close()  # every pass eager
        assert sys.getswitchinterval() == pytest.approx(scheduler_module.SWITCH_INTERVAL_S)
    finally:
        sys.setswitchinterval(before)


def test_a_scheduler_whose_packed_passes_are_scripted_leaves_the_switch_interval_alone(tiny) -> None:
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        ForwardScheduler(tiny).close()
        assert sys.getswitchinterval() == pytest.approx(0.005)
    finally:
        sys.setswitchinterval(before)


# ---- the real model ---------------------------------------------------------------------------------

def test_exact_packed_passes_give_lone_logits_bit_for_bit_and_fast_ones_stay_within_the_bound(lm) -> None:
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village",
               "Roses are red,", "Water boils at", "My favourite food is", "List three prime numbers:",
               "The quick brown fox"]
    caches, tokens = [], []
    for prompt in prompts:
        ids = lm.tokenizer(prompt)["input_ids"]
        caches.append(new_cache(lm))
        forward_one(lm, ids[:-1], caches[-1])
        tokens.append(ids[-1])
    for _ in range(4):
        lone = torch.stack([lone_logits(lm, t, c) for t, c in zip(tokens, caches, strict=True)])
        views = [cache_prefix(c, cache_length(c)) for c in caches]
        fast = forward_packed(lm, tokens, views, exact=False)
        assert (fast - lone).abs().max().item() < FAST_LOGIT_BOUND
        assert torch.equal(forward_packed(lm, tokens, caches), lone)
        tokens = lone.argmax(-1).tolist()


@pytest.mark.parametrize("rows", [2, 3, 4, 9, 17, 32])
def test_exact_packed_passes_of_every_size_give_each_row_its_lone_logits(lm, rows: int) -> None:
    """Each size takes its own kernels (batched 1-row products below four rows, the exact rows
    kernel from four, in passes of 16 rows), so sizes up to the scheduler's largest batch are
    checked, with caches of many lengths."""
    text = lm.tokenizer("A teacher reads the next word of a long story aloud, and the class guesses which word "
                        "comes after it, one word at a time, until the story ends.")["input_ids"]
    caches = [new_cache(lm) for _ in range(rows)]
    for i, cache in enumerate(caches):
        forward_one(lm, text[:1 + (5 * i) % (len(text) - 1)], cache)
    tokens = [text[(3 * i) % len(text)] for i in range(rows)]
    lone = torch.stack([lone_logits(lm, t, c) for t, c in zip(tokens, caches, strict=True)])
    plan = scripted_plan(lm)
    assert plan is not None  # the pass the server runs: one scripted call
    # the exact rows kernel from LONE_ROWS_FROM rows where it sums as this CPU's 1-row product does
    uses_kernel = rows >= packed_module.LONE_ROWS_FROM and kernel_agrees(plan.weights.head[:ROWWISE_CHUNK])
    kernel = LONE_ROWS if uses_kernel else ONE_ROW_PRODUCTS
    assert set(plan.hows_for(rows)[1]) == {kernel}
    assert torch.equal(forward_packed(lm, tokens, caches), lone)


def test_prompts_of_every_kind_of_length_read_together_give_each_its_lone_logits_and_cache(lm) -> None:
    """On the real model: one-token prompts, prompts of 2-11 tokens (their last rows take the
    small-product kernel), 12 and more (every row the large product's), in one call."""
    text = lm.tokenizer("A teacher reads the next word of a long story aloud, and the class guesses which word "
                        "comes after it, one word at a time, until the story ends happily.")["input_ids"]
    lengths = [1, 2, 3, 4, 5, 6, 7, 9, 11, 12, 13, 1, 6, len(text)]
    prompts = [text[i % 7:i % 7 + n] for i, n in enumerate(lengths)]
    # one scripted call where this CPU's products let stacked rows keep their digits, else one
    # pass a prompt: the numbers are the lone ones either way
    assert (scripted_prefill(lm) is None) == (measure_row_kinds(llama_weights(lm.model).layers) is None)
    caches = [new_cache(lm) for _ in prompts]
    logits = forward_prefills(lm, prompts, caches)
    for ids, got, cache in zip(prompts, logits, caches, strict=True):
        expected, lone_cache = lone_prefill(lm, ids)
        assert torch.equal(got, expected)
        for ours, theirs in zip(cache.layers, lone_cache.layers, strict=True):
            assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)


def test_a_lone_visitor_through_the_scheduler_gets_bit_identical_logits(lm) -> None:
    scheduler = ForwardScheduler(lm)
    try:
        stop = StopSettings(max_new_tokens=6, ignore_eos=True)
        alone, queued = (Generation(lm, "The capital of France is", sampler=SAMPLED, seed=4, stop=stop,
                                    scheduler=s) for s in (None, scheduler))
        list(alone.run())
        list(queued.run())
        assert queued.generated_ids == alone.generated_ids
        for index in range(1, 7):
            assert torch.equal(queued.raw_logits(index), alone.raw_logits(index))
    finally:
        scheduler.close()


def test_generations_stepping_at_once_get_the_tokens_of_lone_runs(lm) -> None:
    setups = [("The capital of France is", SamplerSettings(temperature=0), 0),
              ("Once upon a time", SAMPLED, 1), ("def fibonacci(n):", SAMPLED, 2),
              ("Write a haiku about the sea.", SAMPLED, 3), ("Roses are red,", SamplerSettings(temperature=0), 4),
              ("The best way to learn is", SAMPLED, 5)]
    stop = StopSettings(max_new_tokens=10, ignore_eos=True)

    def generation(prompt, sampler, seed, scheduler=None) -> Generation:
        return Generation(lm, prompt, sampler=sampler, seed=seed, stop=stop, scheduler=scheduler)

    expected = []
    for setup in setups:
        lone = generation(*setup)
        list(lone.run())
        expected.append(lone)
    scheduler = ForwardScheduler(lm)
    try:
        together = [generation(*setup, scheduler=scheduler) for setup in setups]
        threads = [threading.Thread(target=lambda g=g: list(g.run())) for g in together]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert [g.generated_ids for g in together] == [e.generated_ids for e in expected]
        for g, e in zip(together, expected, strict=True):
            assert all(torch.equal(g.raw_logits(i), e.raw_logits(i)) for i in range(1, 11))
        assert max(scheduler.stats().recent_batches) > 1  # they really were batched
    finally:
        scheduler.close()


# ---- memory per visitor ---------------------------------------------------------------------------

def test_old_steps_logits_are_dropped_and_computed_again_identically(lm) -> None:
    steps = KEEP_LOGITS + 4
    generation = Generation(lm, "The capital of France is", sampler=SAMPLED, seed=2,
                            stop=StopSettings(max_new_tokens=steps, ignore_eos=True))
    seen = []
    for _ in range(steps):
        generation.step()
        seen.append(generation.raw_logits())
    assert sum(kept.raw_logits is not None for kept in generation._kept) == KEEP_LOGITS
    for index in (1, 2, 3):
        assert torch.equal(generation.raw_logits(index), seen[index - 1])
    tokens = generation.generated_ids
    assert generation.resample(SAMPLED, 2).decision.token_id == tokens[1]
    generation.rewind(3)
    assert generation.repick().token_id == tokens[2]
    generation.rewind(0)
    assert generation.step().token_id == tokens[0]


def test_closing_a_generation_releases_its_cache_and_logits(lm) -> None:
    scheduler = ForwardScheduler(lm)
    try:
        generation = Generation(lm, "Hello there", seed=1, scheduler=scheduler)
        generation.step()
        generation.step()
        watch = weakref.ref(generation._cache)
        generation.close()
        gc.collect()
        assert watch() is None and generation.kv.positions == 0
        assert generation.closed and len(generation.steps) == 2
        with pytest.raises(GenerationFinished, match="closed"):
            generation.step()
    finally:
        scheduler.close()

