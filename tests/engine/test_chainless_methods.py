"""Lookahead decoding and early-exit self-speculation (engine/speculative/lookahead.py and
early_exit.py): greedy output equal to plain decoding and to generate() on the real model,
sampled output distributed as plain decoding's (exactly computed, on a tiny model), and the
parts each method is built from."""

from __future__ import annotations

import json

import pytest
import torch

from engine import SamplerSettings, StopSettings
from engine.forward import forward_all, forward_all_hidden, forward_one, new_cache
from engine.inside import final_norm
from engine.sampling import run_chain
from engine.speculative import (
    EarlyExit,
    Lookahead,
    RoundOutcome,
    SpeculativeGeneration,
    best_exit,
    draft_for,
    layer_agreement,
    replay_speculative,
    speculative_to_trace,
)
from engine.speculative.early_exit import truncated
from tests.engine.test_speculative import CASE_IDS, CASES, plain_ids, reference, speculative
from tests.engine.test_speculative_rule import chi_square_p_value, total_variation

REPETITIVE = "Repeat after me five times: the cat sat on the mat. the cat sat on the mat."


@pytest.mark.parametrize(("prompt", "chat", "penalty", "stops"), CASES, ids=CASE_IDS)
def test_greedy_lookahead_equals_plain_decoding_and_generate(lm, prompt, chat, penalty, stops) -> None:
    generation = speculative(lm, prompt, chat, penalty, stops, Lookahead(lm.eos_ids), k=4)
    plain = plain_ids(lm, prompt, chat, penalty, stops)
    assert generation.generated_ids == plain == reference(lm, generation.prompt_ids, penalty, stops)
    assert generation.finished and generation.forward_passes <= len(plain)


@pytest.mark.parametrize(("prompt", "chat", "penalty", "stops"), [CASES[0], CASES[3]], ids=[CASE_IDS[0], CASE_IDS[3]])
def test_greedy_early_exit_equals_plain_decoding_and_generate(lm, prompt, chat, penalty, stops) -> None:
    generation = speculative(lm, prompt, chat, penalty, stops, EarlyExit(lm, 20), k=2)
    plain = plain_ids(lm, prompt, chat, penalty, stops)
    assert generation.generated_ids == plain == reference(lm, generation.prompt_ids, penalty, stops)


def test_lookahead_finds_what_the_model_repeats_and_says_where_each_guess_came_from(lm) -> None:
    draft = Lookahead(lm.eos_ids)
    generation = SpeculativeGeneration(lm, REPETITIVE, draft=draft, k=4, sampler=SamplerSettings(temperature=0),
                                       stop=StopSettings(max_new_tokens=24))
    sources = []
    for record in generation.run():
        if record.drafted:  # the guess the round checked is the one the method said it made
            sources.append(draft.last_guess.source)
            assert draft.last_guess.tokens == tuple(piece.token_id for piece in record.drafted)
    assert len(generation.generated_ids) / generation.forward_passes > 3  # what was written pays on a repeat
    assert set(sources) == {"text"} and draft.pool_size > 0


def test_after_a_rejection_the_jacobi_window_is_the_passes_own_later_predictions() -> None:
    draft = Lookahead(ngram=3)
    logits = torch.full((4, 10), -5.0)
    for row, token in enumerate((1, 7, 8, 9)):  # the pass's argmax at each verified position
        logits[row, token] = 5.0
    context = (4, 5, 1, 7)  # the round guessed 1, 2, 3 after (4, 5): kept 1, replaced 2 by 7
    draft.observe(RoundOutcome(context, torch.zeros(4, 2), logits, (1, 2, 3), accepted=1, emitted=2))
    guess = draft.get_candidates(context, 4, SamplerSettings(temperature=0), torch.Generator())
    # the window is the pass's predictions past the replaced guess; its run is in the pool too
    assert draft.last_guess.window == (8, 9) and guess.token_ids == (8, 9) and guess.q is None
    assert draft.pool_for(7) == ((8, 9),)
    draft.update((4, 5, 1, 6))  # a context the window was not made for (a rewind): the window goes
    assert draft.get_candidates((4, 5, 1, 6), 4, SamplerSettings(temperature=0), torch.Generator()).token_ids != (8, 9)


def test_the_pool_stays_bounded_and_keeps_the_latest_ngrams() -> None:
    draft = Lookahead(ngram=2)
    for start in range(0, 20000, 3):
        draft.get_candidates(tuple(range(start, start + 3)), 2, SamplerSettings(temperature=0), torch.Generator())
    assert len(draft._pool) <= 4096 and all(len(grams) <= 4 for grams in draft._pool.values())


def test_an_early_exit_draft_is_the_logit_lens_at_its_layer(lm) -> None:
    """The cut model's logits are the whole model's state after that layer through the final
    norm and head: the same tensors, so the same numbers to float rounding."""
    short = truncated(lm, 12)
    ids = lm.tokenizer("The three primary colours of light are")["input_ids"]
    with torch.inference_mode():
        states = lm.model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
        lens = lm.model.get_output_embeddings()(final_norm(lm.model)(states[12][:, -1:]))[0, 0]
    torch.testing.assert_close(forward_one(short, ids, new_cache(short)), lens, rtol=0, atol=1e-4)
    assert len(new_cache(short).layers) in (0, 12) and short.geometry.layers == 12
    assert {p.data_ptr() for p in short.model.parameters()} <= {p.data_ptr() for p in lm.model.parameters()}
    with pytest.raises(Exception, match="from 1 to 29"):
        EarlyExit(lm, 30)
    with pytest.raises(Exception, match="from 1 to 29"):
        truncated(lm, 12.0)  # not taken for the kept cut at 12
    # one cut per model and layer count, shared by every visitor's draft: a fresh one would prove
    # its fast pass afresh on each visitor's first round
    assert truncated(lm, 12).model is short.model and EarlyExit(lm, 12).lm.model is short.model
    assert truncated(lm, 11).model is not short.model


def test_the_exit_layer_is_chosen_from_the_agreement_and_the_bytes_a_draft_reads() -> None:
    agreement = [0.0] * 10 + [1.0]
    agreement[8] = 0.9  # a late layer that nearly always agrees
    choice = best_exit(agreement, layer_bytes=1000, head_bytes=100, layers=10)
    assert choice.layer == 8 and choice.draft_cost == pytest.approx((800 + 100) / 1100)
    assert choice.expected_speedup == pytest.approx((1 - 0.9 ** (choice.k + 1)) / 0.1 / (choice.k * choice.draft_cost
                                                                                        + 1))
    poor = best_exit([0.1] * 10 + [1.0], layer_bytes=1000, head_bytes=100, layers=10)
    assert poor.expected_speedup < 1  # says plainly that it does not pay


def test_the_lens_agreement_of_the_last_layer_is_one_and_of_the_first_is_low(lm) -> None:
    ids = lm.tokenizer("Write a short story about a robot who learns to paint. Once upon a time")["input_ids"]
    agreement = layer_agreement(lm, [(ids, 0)])
    assert len(agreement) == lm.geometry.layers + 1 and agreement[-1] == 1.0 and agreement[1] < 0.5


def test_forward_all_hidden_gives_forward_alls_logits_and_the_decoders_last_state(lm) -> None:
    ids = lm.tokenizer("The capital of France is")["input_ids"]
    for keep in (1, 3):
        logits, hidden = forward_all_hidden(lm, ids, new_cache(lm), keep)
        assert torch.equal(logits, forward_all(lm, ids, new_cache(lm), keep=keep))
        with torch.inference_mode():
            last = lm.model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0, -keep:]
        assert torch.equal(hidden, last)


def exact_two_tokens(lm, prompt_ids: list[int], sampler: SamplerSettings) -> dict[tuple[int, int], float]:
    """Plain sampling's exact probability of each first two tokens (the chain's final p)."""
    first = run_chain(forward_one(lm, prompt_ids, None), torch.tensor(prompt_ids), sampler).final_probs
    exact = {}
    for a in torch.nonzero(first).flatten().tolist():
        context = [*prompt_ids, a]
        second = run_chain(forward_one(lm, context, None), torch.tensor(context), sampler).final_probs
        for b in torch.nonzero(second).flatten().tolist():
            exact[(a, b)] = float(first[a] * second[b])
    return exact


@pytest.mark.parametrize("method", ["lookahead", "early-exit-1"])
def test_sampled_output_is_distributed_as_plain_sampling(tiny_lm, method) -> None:
    sampler = SamplerSettings(temperature=1.0, top_k=3)
    prompt = "abcab"
    exact = exact_two_tokens(tiny_lm, tiny_lm.tokenizer(prompt)["input_ids"], sampler)
    cells = sorted(exact)
    counts = torch.zeros(len(cells), dtype=torch.long)
    runs = 1500
    draft = draft_for(tiny_lm, method)
    for seed in range(runs):
        generation = SpeculativeGeneration(tiny_lm, prompt, draft=draft, k=3, sampler=sampler, seed=seed,
                                           stop=StopSettings(max_new_tokens=2))
        list(generation.run())
        counts[cells.index(tuple(generation.generated_ids[:2]))] += 1
    probs = torch.tensor([exact[c] for c in cells])
    assert chi_square_p_value(counts, probs) > 1e-3, method
    assert total_variation(counts, probs) < 0.06, method


@pytest.mark.parametrize("method", ["lookahead", "early-exit-1"])
def test_a_trace_of_each_method_loads_back_round_for_round(tiny_lm, method) -> None:
    generation = SpeculativeGeneration(tiny_lm, "abcabc", draft=draft_for(tiny_lm, method), k=3,
                                       sampler=SamplerSettings(temperature=0.7), seed=3,
                                       stop=StopSettings(max_new_tokens=12))
    list(generation.run())
    trace = speculative_to_trace(generation)
    again = replay_speculative(tiny_lm, trace, lambda name: draft_for(tiny_lm, name)).generation
    assert again.generated_ids == generation.generated_ids
    assert [r.method for r in again.rounds] == [method] * len(generation.rounds)


@pytest.mark.parametrize("method", ["lookahead", "early-exit"])
def test_the_cli_runs_each_method_and_its_trace_names_it(lm, cli_on_lm, tmp_path, capsys, method) -> None:
    from engine.cli import main

    path = tmp_path / "trace.json"
    code = main(["--prompt", "The capital of France is", "--temperature", "0", "--max-new-tokens", "6",
                 "--speculative", method, "--draft-k", "2", "--json", str(path)])
    assert code == 0, capsys.readouterr().err
    trace = json.loads(path.read_text())
    assert trace["speculative"]["method"].startswith(method)  # early-exit records its layer: early-exit-<n>
    again = replay_speculative(lm, trace, lambda name: draft_for(lm, name)).generation
    assert again.text == trace["text"] and len(again.generated_ids) == 6
