"""Speculative decoding on the real bundled model: greedy output identical to plain decoding,
to generate() and to transformers' own assisted generation; every stage of a round (draft,
one verify pass, accept / reject, stop, KV crop); bad input refused with the generation kept."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace

import pytest
import torch

from engine import Generation, GenerationFinished, SamplerSettings, SettingsError, StopSettings
from engine.errors import ModelLoadError
from engine.forward import forward_all, forward_one, new_cache, plain_head, verify_pass_decision
from engine.speculative.drafting import NO_DRAFT, Draft, DraftModel, PromptLookup, latest_match, self_draft
from engine.speculative.generation import SpeculativeGeneration
from tests.engine.conftest import greedy_generate, run_generate

GREEDY = SamplerSettings(temperature=0)
COPY_PROMPT = ("Fix the spelling in this sentence and write it out again: The wether in Lndon was cold and rainy, "
               "so we stayed insid and read books all afternon.")
NEW_TOKENS = 32
# (prompt, chat, repetition penalty, stop sequences)
CASES = [
    ("The capital of France is", False, 1.0, ()),
    (COPY_PROMPT, True, 1.0, ()),
    ("Once upon a time", False, 1.0, (" the",)),
    ("List the planets of the solar system:", False, 1.3, ()),
]
CASE_IDS = ["plain", "chat-copy", "stop-sequence", "repetition-penalty"]


def greedy(penalty: float) -> SamplerSettings:
    return SamplerSettings(temperature=0, repetition_penalty=penalty)


# Greedy decoding is deterministic: each case's plain run (and generate(): tests/engine/conftest.py)
# runs once per session, however many draft methods (here and in test_chainless_methods.py) are
# compared with it.
_PLAIN: dict[tuple, list[int]] = {}


def plain_ids(lm, prompt: str, chat: bool, penalty: float, stops: tuple[str, ...]) -> list[int]:
    key = (id(lm), prompt, chat, penalty, stops)
    if key not in _PLAIN:
        generation = Generation(lm, prompt, chat=chat, sampler=greedy(penalty),
                                stop=StopSettings(max_new_tokens=NEW_TOKENS, stop_sequences=stops))
        list(generation.run())
        _PLAIN[key] = generation.generated_ids
    return list(_PLAIN[key])


def speculative(lm, prompt: str, chat: bool, penalty: float, stops: tuple[str, ...], draft, k: int = 4,
                **options) -> SpeculativeGeneration:
    generation = SpeculativeGeneration(lm, prompt, chat=chat, draft=draft, k=k, sampler=greedy(penalty),
                                       stop=StopSettings(max_new_tokens=NEW_TOKENS, stop_sequences=stops), **options)
    list(generation.run())
    return generation


def reference(lm, prompt_ids: list[int], penalty: float, stops: tuple[str, ...], **options) -> list[int]:
    """transformers' own greedy generate(), optionally assisted (prompt lookup or a draft model)."""
    if options:
        return run_generate(lm, prompt_ids, NEW_TOKENS, penalty, stops, **options)
    return greedy_generate(lm, prompt_ids, NEW_TOKENS, penalty, stops)


@pytest.fixture(scope="module")
def bf16_draft(lm):
    return self_draft(lm, "bfloat16")


@pytest.mark.parametrize(("prompt", "chat", "penalty", "stops"), CASES, ids=CASE_IDS)
def test_greedy_prompt_lookup_equals_plain_decoding_generate_and_assisted_generate(lm, prompt, chat, penalty,
                                                                                   stops) -> None:
    generation = speculative(lm, prompt, chat, penalty, stops, PromptLookup(lm.eos_ids), k=4)
    plain = plain_ids(lm, prompt, chat, penalty, stops)
    assert generation.generated_ids == plain
    assert generation.finished
    expected = reference(lm, generation.prompt_ids, penalty, stops)
    assisted = reference(lm, generation.prompt_ids, penalty, stops, prompt_lookup_num_tokens=4)
    assert plain == expected == assisted
    assert generation.forward_passes <= len(plain)  # never more passes than tokens


@pytest.mark.parametrize(("prompt", "chat", "penalty", "stops"), [CASES[1], CASES[3]], ids=[CASE_IDS[1], CASE_IDS[3]])
def test_greedy_with_a_bfloat16_self_draft_equals_plain_decoding_and_assistant_model_generate(
        lm, bf16_draft, prompt, chat, penalty, stops) -> None:
    generation = speculative(lm, prompt, chat, penalty, stops, DraftModel(bf16_draft, lm), k=3)
    plain = plain_ids(lm, prompt, chat, penalty, stops)
    assert generation.generated_ids == plain
    assisted = reference(lm, generation.prompt_ids, penalty, stops, assistant_model=bf16_draft.model)
    assert assisted == plain
    assert generation.acceptance_rate > 0.5  # the copy agrees with its original most of the time


def test_copying_prompt_makes_several_tokens_per_forward_pass(lm) -> None:
    generation = speculative(lm, COPY_PROMPT, True, 1.0, (), PromptLookup(lm.eos_ids), k=8)
    tokens = len(generation.generated_ids)
    assert tokens / generation.forward_passes > 2
    assert generation.acceptance_rate > 0.8
    assert sum(len(r.emitted) for r in generation.rounds) == tokens


def test_the_verify_pass_gives_plain_decodings_logits(lm) -> None:
    """Where the verify pass is proven here, each of its k + 1 rows has its decode step's digits
    (tests/engine/test_verify_pass.py); elsewhere transformers' multi-token pass uses other matrix
    shapes than k + 1 one-token passes, so the last bits differ, far below any greedy margin."""
    context = Generation(lm, COPY_PROMPT, chat=True).prompt_ids
    continuation = plain_ids(lm, COPY_PROMPT, True, 1.0, ())[:9]
    one_by_one, cache = [], new_cache(lm)
    forward_one(lm, context[:-1], cache)
    for token in [context[-1], *continuation[:-1]]:
        one_by_one.append(forward_one(lm, [token], cache))
    cache = new_cache(lm)
    forward_one(lm, context[:-1], cache)
    verified = forward_all(lm, [context[-1], *continuation[:-1]], cache)  # [9, vocab]
    gap = float((verified - torch.stack(one_by_one)).abs().max())
    print(f"max |logit difference| verify pass vs one-token decode: {gap:.3g}")
    assert gap == 0 if verify_pass_decision(lm).fast else 0 <= gap < 1e-3
    assert verified.argmax(-1).tolist() == continuation


class Oracle:
    """A test draft that proposes a known continuation: every guess is right."""

    name, label = "oracle", "oracle"

    def __init__(self, prompt_length: int, continuation: Sequence[int]) -> None:
        self.prompt_length, self.continuation = prompt_length, list(continuation)

    def get_candidates(self, context_ids, k, sampler, generator) -> Draft:
        done = len(context_ids) - self.prompt_length
        return Draft(tuple(self.continuation[done:done + k]), None) if k else NO_DRAFT

    def update(self, context_ids) -> None:
        pass


def test_a_round_that_crosses_a_stop_sequence_ends_where_plain_decoding_does(lm) -> None:
    stop = StopSettings(max_new_tokens=NEW_TOKENS, stop_sequences=(" the",))
    plain = Generation(lm, "Once upon a time", sampler=GREEDY, stop=stop)
    list(plain.run())
    free_run = plain_ids(lm, "Once upon a time", False, 1.0, ())
    generation = SpeculativeGeneration(lm, "Once upon a time", draft=Oracle(len(plain.prompt_ids), free_run), k=8,
                                       sampler=GREEDY, stop=stop)
    rounds = list(generation.run())
    assert generation.generated_ids == plain.generated_ids
    assert generation.text == plain.text and generation.finish_reason == "stop_sequence"
    last = rounds[-1]
    assert last.cut_by_stop > 0  # the round had decided more tokens than plain decoding would make
    assert generation.kv.positions == len(generation.context_ids) - 1


def test_each_round_writes_the_verified_positions_then_crops_the_rejected_ones(lm) -> None:
    generation = SpeculativeGeneration(lm, COPY_PROMPT, chat=True, draft=PromptLookup(lm.eos_ids), k=6,
                                       sampler=GREEDY, stop=StopSettings(max_new_tokens=NEW_TOKENS))
    for record in generation.run():
        kv = record.kv
        assert kv.written == record.fed_tokens
        assert kv.before + kv.written - kv.cropped == kv.after == generation.kv.positions
        assert kv.after == len(generation.context_ids) - 1  # the newest token is read next round
        assert kv.cropped == len(record.drafted) - record.accepted + record.cut_by_stop
        assert len(record.positions) == len(record.drafted) + 1
        assert len(record.emitted) == record.accepted + 1 - record.cut_by_stop
        assert kv.snapshot.positions == kv.after
    first = generation.rounds[0]
    assert first.kv.before == 0 and first.fed_tokens == len(generation.prompt_ids) + len(first.drafted)


def test_a_rejection_records_the_targets_argmax_and_the_next_round_reads_it(lm) -> None:
    generation = SpeculativeGeneration(lm, "Once upon a time, once upon a time, once upon a", draft=PromptLookup(),
                                       k=4, sampler=GREEDY)
    rejected = next((r for r in generation.run(max_rounds=20) if r.rejection is not None), None)
    assert rejected is not None
    check = rejected.checks[-1]
    assert not check.accepted and rejected.rejection.token.token_id == check.target_argmax
    assert rejected.emitted_kinds[-1] == "replaced"
    position = rejected.positions[rejected.rejection.index]
    assert position.top[0].token_id == check.target_argmax and position.top[0].p == 1.0  # greedy p: one-hot


def test_sampled_rounds_replay_identically_from_the_same_seed(lm) -> None:
    sampler = SamplerSettings(temperature=0.9, top_k=40, top_p=0.95, repetition_penalty=1.1)

    def run(seed: int) -> list[int]:
        generation = SpeculativeGeneration(lm, COPY_PROMPT, chat=True, draft=PromptLookup(lm.eos_ids), k=4,
                                           sampler=sampler, stop=StopSettings(max_new_tokens=20), seed=seed)
        rounds = list(generation.run())
        assert all(c.u is not None and c.accept_prob == pytest.approx(min(1.0, c.p / c.q))
                   for r in rounds for c in r.checks)
        return generation.generated_ids

    assert run(7) == run(7)


def test_a_failed_round_leaves_the_generation_as_it_was(lm, monkeypatch) -> None:
    generation = SpeculativeGeneration(lm, COPY_PROMPT, chat=True, draft=PromptLookup(lm.eos_ids), k=4,
                                       sampler=GREEDY, stop=StopSettings(max_new_tokens=12))
    generation.step()
    before = (generation.generated_ids, generation.kv.positions, len(generation.rounds))
    import engine.speculative.generation as speculative_module

    def broken(*args, **kwargs):
        raise RuntimeError("device lost")

    monkeypatch.setattr(speculative_module, "_verify", broken)
    with pytest.raises(RuntimeError):
        generation.step()
    assert (generation.generated_ids, generation.kv.positions, len(generation.rounds)) == before
    monkeypatch.undo()
    list(generation.run())
    assert generation.generated_ids == plain_ids(lm, COPY_PROMPT, True, 1.0, ())[:12]


def test_switching_method_and_k_between_rounds_keeps_the_generation_exact(lm, bf16_draft) -> None:
    generation = SpeculativeGeneration(lm, COPY_PROMPT, chat=True, draft=PromptLookup(lm.eos_ids), k=4,
                                       sampler=GREEDY, stop=StopSettings(max_new_tokens=NEW_TOKENS))
    generation.step()
    generation.draft = DraftModel(bf16_draft, lm)
    generation.set_k(2)
    generation.step()
    generation.draft = PromptLookup(lm.eos_ids)
    list(generation.run())
    assert generation.generated_ids == plain_ids(lm, COPY_PROMPT, True, 1.0, ())
    assert [r.method for r in generation.rounds[:3]] == ["prompt-lookup", "draft-model", "prompt-lookup"]


@pytest.mark.parametrize("k", [0, 9, 2.5, "4", True])
def test_k_outside_one_to_eight_is_refused_naming_the_range(lm, k) -> None:
    with pytest.raises(SettingsError, match="from 1 to 8"):
        SpeculativeGeneration(lm, "Hi", draft=PromptLookup(), k=k)
    generation = SpeculativeGeneration(lm, "Hi", draft=PromptLookup(), k=3)
    with pytest.raises(SettingsError, match="k = "):
        generation.set_k(k)
    assert generation.k == 3


def test_a_draft_model_with_another_tokenizer_is_refused(lm) -> None:
    other = copy.deepcopy(lm.tokenizer)
    other.add_tokens(["<made-up-token>"])
    with pytest.raises(SettingsError, match="tokenizer"):
        DraftModel(replace(lm, tokenizer=other, name="other"), lm)
    from transformers import LlamaConfig, LlamaForCausalLM
    small = LlamaForCausalLM(LlamaConfig(vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(SettingsError, match="1,000"):
        DraftModel(replace(lm, model=small, name="small"), lm)


def test_a_self_draft_that_cannot_be_built_names_the_problem(lm) -> None:
    with pytest.raises(SettingsError, match="bfloat16, int8"):
        self_draft(lm, "fp8")
    with pytest.raises(ModelLoadError, match="CPU only"):
        self_draft(replace(lm, device=torch.device("cuda")), "int8")


def test_stepping_a_finished_generation_is_refused(lm) -> None:
    generation = SpeculativeGeneration(lm, "Hi", draft=PromptLookup(), sampler=GREEDY,
                                       stop=StopSettings(max_new_tokens=2))
    list(generation.run())
    assert len(generation.generated_ids) == 2 and generation.finish_reason == "max_tokens"
    with pytest.raises(GenerationFinished):
        generation.step()


@pytest.mark.parametrize(("context", "n", "expected"), [
    ([1, 2, 3, 9, 1, 2, 3], 3, 0), ([1, 2, 3, 1, 2, 3, 1, 2], 2, 3), ([5, 6, 7], 2, None), ([4, 4], 1, 0)])
def test_lookup_finds_the_latest_earlier_occurrence_with_something_after_it(context, n, expected) -> None:
    assert latest_match(context, n) == expected


def test_prompt_lookup_proposes_what_followed_and_stops_after_an_end_token() -> None:
    lookup = PromptLookup(eos_ids=(0,))
    assert lookup.get_candidates([7, 8, 9, 4, 0, 5, 7, 8], 3, GREEDY, torch.Generator()).token_ids == (9, 4, 0)
    assert lookup.get_candidates([7, 8, 9, 4, 5, 6, 7, 8], 2, GREEDY, torch.Generator()).token_ids == (9, 4)
    assert lookup.get_candidates([1, 2, 3, 4], 4, GREEDY, torch.Generator()) is NO_DRAFT


def test_forward_all_gives_the_models_own_logits_at_every_kept_position(lm) -> None:
    ids = Generation(lm, COPY_PROMPT, chat=True).prompt_ids
    with torch.inference_mode():
        expected = lm.model(input_ids=torch.tensor([ids])).logits[0, -5:]  # [5, vocab]
    got = forward_all(lm, ids, new_cache(lm), keep=5)
    assert got.shape == (5, lm.vocab_size)
    assert torch.allclose(got, expected, atol=1e-4, rtol=0)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_a_head_with_soft_capping_is_not_taken_as_a_plain_linear_map(lm, monkeypatch) -> None:
    assert plain_head(lm) is lm.model.get_output_embeddings()
    monkeypatch.setattr(lm.model.config, "final_logit_softcapping", 30.0, raising=False)
    assert plain_head(lm) is None


def test_greedy_with_an_int8_self_draft_equals_plain_decoding(lm) -> None:
    draft = self_draft(lm, "int8")
    assert type(draft.model.get_output_embeddings()) is torch.nn.Linear  # only the decoder is quantised
    generation = speculative(lm, *CASES[1], DraftModel(draft, lm), k=4)
    assert generation.generated_ids == plain_ids(lm, *CASES[1])
    assert generation.acceptance_rate > 0.5
