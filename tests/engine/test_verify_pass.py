"""Speculative decoding's verify pass: several tokens of one sequence in one pass over the weights,
each row with the digits of the one-token decode step that would read it (logits and cache
entries, torch.equal), used only where its probe showed it."""

from __future__ import annotations

import pytest
import torch

from engine.fast import VERIFY_MAX_ROWS, verify_decision, verify_rows
from engine.forward import (
    eager_step,
    forward_all,
    forward_all_hidden,
    forward_one,
    lone_pass_decision,
    new_cache,
    verify_pass_decision,
)
from tests.engine.test_lone_pass import kernel_shaped_tiny, threads


def one_token_steps(lm, prompt: list[int], tokens: list[int]):
    """The prompt read by the eager pass, then each token by its own decode step: logits
    `[n, vocab]` and the cache."""
    cache = new_cache(lm)
    eager_step(lm, prompt, cache)
    return torch.stack([forward_one(lm, [t], cache) for t in tokens]), cache


def one_pass(lm, prompt: list[int], tokens: list[int], keep: int | None = None):
    cache = new_cache(lm)
    eager_step(lm, prompt, cache)
    return forward_all(lm, tokens, cache, keep=keep), cache


def same_cache(a, b) -> bool:
    return all(torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values)
               for x, y in zip(a.layers, b.layers, strict=True))


@pytest.mark.parametrize("count", [1, 2])
def test_the_bundled_models_verify_pass_gives_each_row_its_decode_steps_digits(lm, count) -> None:
    text = lm.tokenizer("The lighthouse keeper counted the ships that passed each night, and wrote their "
                        "names in a book that nobody read.")["input_ids"]
    with threads(count):
        decision = verify_pass_decision(lm)
        assert decision.threads == count
        if not decision.fast:
            assert not lone_pass_decision(lm).fast or "kernel" in decision.reason or "probe" in decision.reason
            pytest.skip(f"the verify pass is not proven on this machine: {decision.reason}")
        for length, n in ((1, 2), (5, 3), (17, 5), (len(text), 9), (3, VERIFY_MAX_ROWS)):
            prompt, tokens = (text * 4)[:length], (text * 4)[length:length + n]
            steps, step_cache = one_token_steps(lm, prompt, tokens)
            verified, pass_cache = one_pass(lm, prompt, tokens)
            assert torch.equal(verified, steps), (length, n)
            assert same_cache(pass_cache, step_cache), (length, n)
        kept, _ = one_pass(lm, text[:7], text[7:12], keep=2)
        assert torch.equal(kept, one_token_steps(lm, text[:7], text[7:12])[0][-2:])


def test_the_verify_pass_hands_draft_methods_the_decoders_own_last_state(lm) -> None:
    if not verify_pass_decision(lm).fast:
        pytest.skip("the verify pass is not proven on this machine")
    ids = lm.tokenizer("The capital of France is Paris, and the capital of Spain is")["input_ids"]
    prompt, tokens = ids[:6], ids[6:10]
    cache = new_cache(lm)
    eager_step(lm, prompt, cache)
    logits, hidden = forward_all_hidden(lm, tokens, cache, keep=3)
    assert torch.equal(logits, one_token_steps(lm, prompt, tokens)[0][-3:])
    states, steps = [], new_cache(lm)
    eager_step(lm, prompt, steps)
    with torch.inference_mode():  # transformers' own one-token steps, each with its last state
        for token in tokens:
            out = lm.model(input_ids=torch.tensor([[token]]), past_key_values=steps, use_cache=True,
                           output_hidden_states=True)
            states.append(out.hidden_states[-1][0, -1])
    assert torch.equal(hidden, torch.stack(states[-3:]))


def test_a_tiny_llama_gets_the_verify_pass_where_its_kernel_is_proven() -> None:
    tiny = kernel_shaped_tiny()
    decision = verify_pass_decision(tiny)
    assert decision.fast == lone_pass_decision(tiny).fast
    for prompt, tokens in (([1, 2, 3], [4, 5]), ([9], [8, 7, 6, 5, 4, 3, 2, 1, 0, 11])):
        steps, step_cache = one_token_steps(tiny, prompt, tokens)
        verified, pass_cache = one_pass(tiny, prompt, tokens)
        if decision.fast:
            assert torch.equal(verified, steps) and same_cache(pass_cache, step_cache)
        else:  # transformers' multi-token pass: the same to float rounding
            torch.testing.assert_close(verified, steps, rtol=0, atol=1e-4)


def test_when_the_probe_differs_transformers_multi_token_pass_reads_them() -> None:
    tiny = kernel_shaped_tiny()

    def off_by_a_bit(lm, token_ids, cache):
        return eager_step(lm, token_ids, cache) + 1e-6

    decision = verify_decision(tiny, off_by_a_bit)
    assert not decision.fast and ("probe" in decision.reason or "lone pass" in decision.reason)
    cache = new_cache(tiny)
    eager_step(tiny, [1, 2, 3], cache)
    assert verify_rows(tiny, [4, 5], cache, off_by_a_bit) is None  # the caller runs transformers' pass
    assert cache.get_seq_length() == 3


def test_one_token_too_many_tokens_or_an_empty_cache_are_not_verify_passes() -> None:
    tiny = kernel_shaped_tiny()
    cache = new_cache(tiny)
    eager_step(tiny, [1, 2, 3], cache)
    assert verify_rows(tiny, [4], cache, eager_step) is None  # a decode step
    assert verify_rows(tiny, list(range(VERIFY_MAX_ROWS + 1)), cache, eager_step) is None
    assert verify_rows(tiny, [4, 5], new_cache(tiny), eager_step) is None  # a prompt
    assert verify_rows(tiny, [4, 5], None, eager_step) is None
    assert cache.get_seq_length() == 3


def test_a_failed_verify_pass_leaves_the_cache_as_it_was() -> None:
    tiny = kernel_shaped_tiny()
    if not verify_pass_decision(tiny).fast:
        pytest.skip("the verify pass is not proven on this machine")
    cache = new_cache(tiny)
    eager_step(tiny, [1, 2, 3], cache)
    keys = [layer.keys.clone() for layer in cache.layers]
    with pytest.raises(IndexError):
        forward_all(tiny, [4, 10_000], cache)  # past the vocabulary
    assert cache.get_seq_length() == 3 and all(torch.equal(a, b.keys) for a, b in zip(keys, cache.layers, strict=True))
