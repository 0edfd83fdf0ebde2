"""Termination: EOS (and ignoring it), stop sequences across and inside tokens, max tokens,
the context window; each on the real model, plus the pure matching rules."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine import Generation, PromptError, SamplerSettings, StopSettings
from engine.stopping import first_match, partial_match_length, returned_text, stop_sequence_states

GREEDY = SamplerSettings(temperature=0)
PARIS = "The capital of France is"  # greedy: " Paris" "." "\n" "\n" "The" " answer" " is" ":" ...


def run_paris(lm, *stops: str, max_new_tokens: int = 12) -> Generation:
    generation = Generation(lm, PARIS, sampler=GREEDY,
                            stop=StopSettings(max_new_tokens=max_new_tokens, stop_sequences=stops))
    list(generation.run())
    return generation


def test_stop_sequence_split_across_three_tokens_fires_and_is_cut(lm) -> None:
    generation = run_paris(lm, "s.\n")
    assert generation.finish_reason == "stop_sequence"
    assert [s.token.text for s in generation.steps] == [" Paris", ".", "\n"]
    assert generation.text == " Pari"
    assert generation.steps[-1].termination.finish_reason == "stop_sequence"


def test_stop_sequence_inside_one_token_fires_on_that_token(lm) -> None:
    generation = run_paris(lm, "ari")
    assert len(generation.steps) == 1 and generation.finish_reason == "stop_sequence"
    assert generation.text == " P"


def test_partial_stop_match_is_reported_before_it_completes(lm) -> None:
    generation = Generation(lm, PARIS, sampler=GREEDY, stop=StopSettings(stop_sequences=("s.\n", "xyz")))
    first = generation.step()
    states = {s.sequence: s for s in first.termination.stops}
    assert states["s.\n"].partial == 1 and not states["s.\n"].matched
    assert states["xyz"].partial == 0
    second = generation.step()
    assert {s.sequence: s.partial for s in second.termination.stops}["s.\n"] == 2


def test_earliest_stop_match_wins_whatever_the_list_order(lm) -> None:
    generation = run_paris(lm, "answer", ".\n")
    assert generation.text == " Paris"


def test_max_tokens_fires_at_the_cap(lm) -> None:
    generation = run_paris(lm, max_new_tokens=4)
    assert generation.finish_reason == "max_tokens" and len(generation.steps) == 4
    assert generation.steps[-1].termination.new_tokens == 4


def test_chat_answer_ends_with_the_models_end_token(lm) -> None:
    generation = Generation(lm, "What is the capital of France?", chat=True, sampler=GREEDY,
                            stop=StopSettings(max_new_tokens=60))
    list(generation.run())
    last = generation.steps[-1]
    assert generation.finish_reason == "eos"
    assert last.token.text == "<|im_end|>" and last.token.special
    assert last.termination.eos_picked and last.termination.eos_prob > 0.5
    assert "<|im_end|>" not in generation.text and "Paris" in generation.text


def test_ignore_eos_generates_past_the_end_token(lm) -> None:
    generation = Generation(lm, "What is the capital of France?", chat=True, sampler=GREEDY,
                            stop=StopSettings(max_new_tokens=40, ignore_eos=True))
    list(generation.run())
    assert generation.finish_reason == "max_tokens" and len(generation.steps) == 40
    eos_steps = [s.index for s in generation.steps if s.token_id in lm.eos_ids]
    assert eos_steps and eos_steps[0] < 40
    assert generation.steps[eos_steps[0] - 1].termination.finish_reason is None


def test_context_window_fires_when_the_context_is_full(lm) -> None:
    small = replace(lm, context_window=8)  # the real model, told its window is 8 tokens
    generation = Generation(small, PARIS, sampler=GREEDY, stop=StopSettings(max_new_tokens=50))
    list(generation.run())
    assert generation.finish_reason == "context_window"
    assert len(generation.context_ids) == 8
    assert generation.steps[-1].termination.context_tokens == 8


def test_prompt_longer_than_the_window_is_rejected_with_sizes(lm) -> None:
    with pytest.raises(PromptError, match=r"prompt is 5 tokens but at most 4 are allowed here \(the context window "
                                          r"is 5 tokens"):
        Generation(replace(lm, context_window=5), PARIS)


def test_empty_prompt_is_rejected(lm) -> None:
    with pytest.raises(PromptError, match="empty"):
        Generation(lm, "   ")


def test_partial_match_length_is_the_longest_proper_prefix_at_the_end() -> None:
    assert partial_match_length("hello wor", "world") == 3
    assert partial_match_length("hello", "world") == 0
    assert partial_match_length("abab", "abc") == 2
    assert partial_match_length("xx", "x") == 0  # a whole match is not partial


def test_returned_text_ends_just_before_the_first_match() -> None:
    states = stop_sequence_states("one. two\n three", ("\n", "two"))
    assert first_match(states).sequence == "two"
    assert returned_text("one. two\n three", states) == "one. "


def test_a_character_whose_bytes_are_still_coming_is_held_back_from_matching() -> None:
    held = stop_sequence_states("ab\ufffd", ("\ufffd", "b\ufffd", "bc"))
    assert [(s.matched, s.partial) for s in held] == [(False, 0), (False, 1), (False, 1)]
    assert stop_sequence_states("a\ufffdb", ("\ufffd",))[0].position == 1  # completed by what followed


def test_a_stop_sequence_never_fires_inside_a_character_split_over_two_tokens(lm) -> None:
    """SmolLM2 writes each of these katakana in two byte-level tokens; the first decodes as U+FFFD.
    transformers' stop strings, matched on the tokens' bytes, never see it either."""
    import torch

    prompt = "日本の首都は東京です。🍣🎉 Ünïcödé café — naïve façade: "  # greedy: "パ" "ッ" "ケ" ..., two tokens each
    generation = Generation(lm, prompt, sampler=GREEDY, stop=StopSettings(max_new_tokens=4,
                                                                          stop_sequences=("\ufffd", "ケ")))
    list(generation.run())
    assert generation.finish_reason == "max_tokens" and generation.text == "パッ"
    ids = torch.tensor([generation.prompt_ids])
    theirs = lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=4,
                               stop_strings=["\ufffd", "ケ"], tokenizer=lm.tokenizer, pad_token_id=lm.eos_ids[0])
    assert theirs[0, ids.shape[1]:].tolist() == [s.token.token_id for s in generation.steps]
    assert run_paris(lm, "\ufffd").finish_reason == "max_tokens"


def test_termination_is_rechecked_when_stop_settings_change(lm) -> None:
    generation = Generation(lm, PARIS, sampler=GREEDY, stop=StopSettings(max_new_tokens=10))
    generation.step()
    generation.step()
    assert generation.termination == generation.steps[-1].termination
    generation.stop = StopSettings(max_new_tokens=10, stop_sequences=("s.\n",))
    rechecked = generation.termination
    assert rechecked.stops[0].partial == 2 and rechecked.finish_reason is None
    assert rechecked.eos_prob == generation.steps[-1].termination.eos_prob
    generation.stop = StopSettings(max_new_tokens=2)
    assert generation.termination.finish_reason == "max_tokens" == generation.finish_reason
