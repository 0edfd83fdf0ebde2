"""The trained draft methods (engine/speculative/heads.py): the shipped weights load only when
their checksum matches, with a clear error otherwise; Medusa heads and the MTP module keep
speculative decoding exact (greedy: plain decoding's tokens; sampling: its distribution); each
guesses from the state the verify pass handed over, and not at all from a context it did not see."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from engine import Generation, SamplerSettings, StopSettings
from engine.errors import ModelLoadError, SettingsError
from engine.forward import forward_one
from engine.sampling import run_chain
from engine.speculative.drafting import NO_DRAFT, RoundOutcome
from engine.speculative.generation import SpeculativeGeneration
from engine.speculative.heads import GO_ON, MEDUSA, MTP, MedusaHeads, MedusaNet, MtpDraft, MtpNet, load_trained
from tests.engine.test_speculative_rule import chi_square_p_value, total_variation
from training.fit import save

GREEDY = SamplerSettings(temperature=0)
TINY_VOCAB = 96  # draft-vocabulary rows of the tiny model's 259


def _tiny_manifest(lm, folder: Path) -> Path:
    """Random (untrained) heads and MTP module for the tiny model, saved as the scripts save them."""
    config = lm.model.config
    generator = torch.Generator().manual_seed(1)
    vocab_ids = torch.randperm(lm.vocab_size, generator=generator)[:TINY_VOCAB]
    vocab_ids = torch.cat([torch.tensor(lm.eos_ids), vocab_ids[~torch.isin(vocab_ids, torch.tensor(lm.eos_ids))]])
    with torch.random.fork_rng():
        torch.manual_seed(2)
        medusa = MedusaNet(config.hidden_size, 3)
        torch.nn.init.normal_(medusa.proj.weight, std=0.5)  # zero-init would make every head the model's own
        mtp = MtpNet(config.hidden_size, config.intermediate_size, 1, config.rms_norm_eps)
    base = {"trained_for": lm.name, "config": {"hidden_size": config.hidden_size, "vocab_size": lm.vocab_size}}
    save(MEDUSA, medusa, vocab_ids[:TINY_VOCAB], folder, {**base, "config": {**base["config"], "heads": 3}})
    save(MTP, mtp, vocab_ids[:TINY_VOCAB], folder,
         {**base, "config": {**base["config"], "intermediate_size": config.intermediate_size, "blocks": 1,
                             "rms_norm_eps": config.rms_norm_eps}})
    return folder / "draft_heads.json"


@pytest.fixture(scope="module")
def tiny_manifest(tiny_lm, tmp_path_factory) -> Path:
    return _tiny_manifest(tiny_lm, tmp_path_factory.mktemp("draft_heads"))


def _draft(kind: str, lm, manifest: Path | None = None, **options):
    cls = MedusaHeads if kind == MEDUSA else MtpDraft
    return cls(lm, trained=load_trained(kind, lm, manifest) if manifest else None, **options)


# ---- the shipped files: checksum, clear errors ---------------------------------------------------


@pytest.mark.parametrize("kind", [MEDUSA, MTP])
def test_weights_whose_checksum_matches_load_in_float32(tiny_lm, tiny_manifest, kind) -> None:
    trained = load_trained(kind, tiny_lm, tiny_manifest)
    assert all(p.dtype == torch.float32 for p in trained.net.parameters())
    assert trained.vocab_ids.numel() == TINY_VOCAB


@pytest.mark.parametrize("kind", [MEDUSA, MTP])
def test_a_corrupt_weights_file_is_refused_naming_the_file_and_the_checksum(tiny_lm, tmp_path, kind) -> None:
    manifest = _tiny_manifest(tiny_lm, tmp_path)
    weights = tmp_path / json.loads(manifest.read_text())[kind]["file"]
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=f"{weights.name}.*corrupt.*SHA-256"):
        load_trained(kind, tiny_lm, manifest)


def test_a_missing_weights_file_or_manifest_is_refused_with_what_to_run(tiny_lm, tmp_path) -> None:
    manifest = _tiny_manifest(tiny_lm, tmp_path)
    (tmp_path / json.loads(manifest.read_text())[MTP]["file"]).unlink()
    with pytest.raises(ModelLoadError, match="missing"):
        load_trained(MTP, tiny_lm, manifest)
    assert load_trained(MEDUSA, tiny_lm, manifest).method == MEDUSA  # the other method still loads
    with pytest.raises(ModelLoadError, match=r"training\.heads"):
        load_trained(MEDUSA, tiny_lm, tmp_path / "nowhere.json")


def test_weights_trained_for_another_model_are_refused_naming_it(tiny_lm, tmp_path) -> None:
    manifest = _tiny_manifest(tiny_lm, tmp_path)
    data = json.loads(manifest.read_text())
    data[MEDUSA]["config"]["hidden_size"] = 576
    manifest.write_text(json.dumps(data))
    with pytest.raises(SettingsError, match="hidden size 576"):
        load_trained(MEDUSA, tiny_lm, manifest)


def test_a_draft_vocabulary_larger_than_the_trained_one_is_refused(tiny_lm, tiny_manifest) -> None:
    with pytest.raises(SettingsError, match="draft_vocab"):
        _draft(MEDUSA, tiny_lm, tiny_manifest, draft_vocab=TINY_VOCAB + 1)


# ---- drafting from the observed state ------------------------------------------------------------


def _outcome(lm, context: tuple[int, ...], rows: int = 2) -> RoundOutcome:
    hidden = torch.randn(rows, lm.model.config.hidden_size, generator=torch.Generator().manual_seed(3))
    return RoundOutcome(context, hidden, torch.zeros(rows, lm.vocab_size), (5,), 1, 2)


@pytest.mark.parametrize("kind", [MEDUSA, MTP])
def test_no_guess_before_a_round_was_observed_or_after_a_rewind(tiny_lm, tiny_manifest, kind) -> None:
    draft = _draft(kind, tiny_lm, tiny_manifest)
    generator = torch.Generator()
    assert draft.get_candidates([1, 2, 3], 3, GREEDY, generator) == NO_DRAFT
    draft.observe(_outcome(tiny_lm, (1, 2, 3)))
    draft.update([1, 2, 3])
    assert len(draft.get_candidates([1, 2, 3], 3, GREEDY, generator).token_ids) >= 1
    draft.update([1, 2])  # Back
    assert draft.get_candidates([1, 2], 3, GREEDY, generator) == NO_DRAFT


def test_medusa_guesses_at_most_one_token_per_head(tiny_lm, tiny_manifest) -> None:
    draft = _draft(MEDUSA, tiny_lm, tiny_manifest)
    draft.observe(_outcome(tiny_lm, (1, 2, 3)))
    assert len(draft.get_candidates([1, 2, 3], 8, GREEDY, torch.Generator()).token_ids) <= 3


@pytest.mark.parametrize("kind", [MEDUSA, MTP])
def test_sampled_guesses_come_with_q_zero_outside_the_draft_vocabulary(tiny_lm, tiny_manifest, kind) -> None:
    draft = _draft(kind, tiny_lm, tiny_manifest)
    draft.observe(_outcome(tiny_lm, (1, 2, 3)))
    guess = draft.get_candidates([1, 2, 3], 3, SamplerSettings(temperature=1.5), torch.Generator().manual_seed(0))
    outside = torch.ones(tiny_lm.vocab_size, dtype=torch.bool)
    outside[draft.vocab_ids] = False
    assert guess.q is not None and torch.allclose(guess.q.sum(-1), torch.ones(len(guess.token_ids)))
    assert float(guess.q[:, outside].sum()) == 0.0
    assert all(guess.q[i, t] > 0 for i, t in enumerate(guess.token_ids))


@pytest.mark.parametrize("kind", [MEDUSA, MTP])
def test_a_draft_guesses_again_only_after_a_guess_it_was_sure_enough_of(tiny_lm, tiny_manifest, kind) -> None:
    every = _draft(kind, tiny_lm, tiny_manifest, go_on=0.0)
    every.observe(_outcome(tiny_lm, (1, 2, 3)))
    every.picturing = True
    full = every.get_candidates([1, 2, 3], 3, GREEDY, torch.Generator())
    sure = [leaders[0].prob for leaders in every.last_picture.leaders]  # greedy guesses the draft's top token
    assert len(full.token_ids) == 3 and every.last_picture.stopped_unsure is None
    for cut in range(1, 3):  # a threshold just above guess `cut`'s probability and below the ones before
        if min(sure[:cut - 1], default=1.0) <= sure[cut - 1]:
            continue
        draft = _draft(kind, tiny_lm, tiny_manifest, go_on=(sure[cut - 1] + min(sure[:cut - 1], default=1.0)) / 2)
        draft.observe(_outcome(tiny_lm, (1, 2, 3)))
        draft.picturing = True
        guess = draft.get_candidates([1, 2, 3], 3, GREEDY, torch.Generator())
        assert guess.token_ids == full.token_ids[:cut]
        assert draft.last_picture.stopped_unsure == pytest.approx(sure[cut - 1])
    always_unsure = _draft(kind, tiny_lm, tiny_manifest, go_on=1.0)
    always_unsure.observe(_outcome(tiny_lm, (1, 2, 3)))
    assert always_unsure.get_candidates([1, 2, 3], 3, GREEDY, torch.Generator()).token_ids == full.token_ids[:1]


@pytest.mark.parametrize("go_on", [-0.1, 1.5, True, "half"])
def test_a_threshold_that_is_not_a_probability_is_refused(tiny_lm, tiny_manifest, go_on) -> None:
    with pytest.raises(SettingsError, match="go_on"):
        _draft(MTP, tiny_lm, tiny_manifest, go_on=go_on)


def test_a_sampled_medusa_guess_is_drawn_from_its_q(tiny_lm, tiny_manifest) -> None:
    draft = _draft(MEDUSA, tiny_lm, tiny_manifest, draft_vocab=6)
    sampler = SamplerSettings(temperature=3.0)
    draft.observe(_outcome(tiny_lm, (1, 2, 3)))
    generator = torch.Generator().manual_seed(0)
    first = [draft.get_candidates([1, 2, 3], 1, sampler, generator) for _ in range(3000)]
    q = first[0].q[0]
    counts = Counter(d.token_ids[0] for d in first)
    for token, n in counts.items():
        assert abs(n / 3000 - float(q[token])) < 0.03


# ---- exactness, on the tiny model ---------------------------------------------------------------


@pytest.mark.parametrize("kind", [MEDUSA, MTP])
@pytest.mark.parametrize("sampler", [GREEDY, SamplerSettings(temperature=0, repetition_penalty=1.4)],
                         ids=["greedy", "repetition-penalty"])
@pytest.mark.parametrize("go_on", [GO_ON, 0.0, 0.05], ids=["default", "every-guess", "often-unsure"])
def test_greedy_with_trained_drafts_equals_plain_decoding_on_the_tiny_model(tiny_lm, tiny_manifest, kind,
                                                                            sampler, go_on) -> None:
    stop = StopSettings(max_new_tokens=24)
    plain = Generation(tiny_lm, "abc abc", sampler=sampler, stop=stop)
    list(plain.run())
    spec = SpeculativeGeneration(tiny_lm, "abc abc", draft=_draft(kind, tiny_lm, tiny_manifest, go_on=go_on), k=3,
                                 sampler=sampler, stop=stop)
    list(spec.run())
    assert spec.generated_ids == plain.generated_ids
    assert spec.drafted_count > 0


def exact_tokens(lm, prompt_ids: list[int], sampler: SamplerSettings, n: int) -> dict[tuple[int, ...], float]:
    """Plain sampling's exact probability of each first `n` tokens (the chain's final p)."""
    if n == 0:
        return {(): 1.0}
    p = run_chain(forward_one(lm, prompt_ids, None), torch.tensor(prompt_ids), sampler).final_probs
    return {(a, *rest): float(p[a]) * tail
            for a in torch.nonzero(p).flatten().tolist()
            for rest, tail in exact_tokens(lm, [*prompt_ids, a], sampler, n - 1).items()}


@pytest.mark.parametrize("kind", [MEDUSA, MTP])
def test_sampling_with_a_trained_draft_gives_plain_decodings_distribution(tiny_lm, tiny_manifest, kind) -> None:
    """Tokens 2 and 3 come from a drafted round (the first round has no state yet): the first
    three tokens' frequencies over many seeds fit plain sampling's exact probabilities."""
    sampler = SamplerSettings(temperature=1.0, top_k=3)
    prompt = "abcab"
    exact = exact_tokens(tiny_lm, tiny_lm.tokenizer(prompt)["input_ids"], sampler, 3)
    cells = sorted(exact)
    counts = torch.zeros(len(cells), dtype=torch.long)
    # a draft vocabulary of the three tokens plain sampling makes most often at places 2 and 3, so
    # that guesses are accepted as well as rejected (the weights are random, not trained)
    likely = Counter()
    for cell, p in exact.items():
        likely.update({cell[1]: p, cell[2]: p})
    trained = load_trained(kind, tiny_lm, tiny_manifest)
    vocab_ids = torch.tensor([token for token, _ in likely.most_common(3)])
    cls = MedusaHeads if kind == MEDUSA else MtpDraft
    draft = cls(tiny_lm, trained=replace(trained, vocab_ids=vocab_ids), go_on=0.0)  # always two guesses
    accepted = 0
    for seed in range(1200):
        generation = SpeculativeGeneration(tiny_lm, prompt, draft=draft, k=2, sampler=sampler, seed=seed,
                                           stop=StopSettings(max_new_tokens=3))
        list(generation.run())
        counts[cells.index(tuple(generation.generated_ids))] += 1
        accepted += sum(r.accepted for r in generation.rounds)
    probs = torch.tensor([exact[c] for c in cells])
    assert accepted > 0  # the rule's accepting branch was exercised, not only its residual
    assert chi_square_p_value(counts, probs) > 1e-3
    assert total_variation(counts, probs) < 0.08


# ---- the shipped weights on the real model -------------------------------------------------------

CASES = [
    ("The history of the printing press", False, 1.0, ()),
    ("Explain why the sky is blue.", True, 1.0, ()),
    ("Once upon a time", False, 1.0, (" the",)),
    ("List the planets of the solar system:", False, 1.3, ()),
]


@pytest.fixture(scope="module")
def shipped(lm) -> dict:
    return {MEDUSA: MedusaHeads(lm), MTP: MtpDraft(lm)}


@pytest.mark.parametrize(("prompt", "chat", "penalty", "stops"), CASES,
                         ids=["plain", "chat", "stop-sequence", "repetition-penalty"])
def test_greedy_with_the_shipped_drafts_equals_plain_decoding(lm, shipped, prompt, chat, penalty, stops) -> None:
    sampler = SamplerSettings(temperature=0, repetition_penalty=penalty)
    stop = StopSettings(max_new_tokens=24, stop_sequences=stops)
    plain = Generation(lm, prompt, chat=chat, sampler=sampler, stop=stop)
    list(plain.run())
    for kind, draft in shipped.items():
        spec = SpeculativeGeneration(lm, prompt, chat=chat, draft=draft, k=3, sampler=sampler, stop=stop)
        list(spec.run())
        assert spec.generated_ids == plain.generated_ids, kind
        assert spec.text == plain.text


def test_the_shipped_mtp_stops_drafting_when_unsure_and_says_so_in_its_picture(lm) -> None:
    draft = MtpDraft(lm)
    draft.picturing = True
    generation = SpeculativeGeneration(lm, "The history of the printing press", draft=draft, k=4, sampler=GREEDY,
                                       stop=StopSettings(max_new_tokens=32))
    pictures = []
    while not generation.finished:
        record = generation.step()  # record.k: 4, or the room left before max_new_tokens
        if draft.last_picture is not None:
            pictures.append((record.k, draft.last_picture))
    lengths = {len(picture.guesses) for _, picture in pictures}
    assert 1 in lengths and max(lengths) > 1  # short rounds where unsure, longer ones where sure
    for k, picture in pictures:
        sure = [leaders[0].prob for leaders in picture.leaders]
        assert all(s >= GO_ON for s in sure[:-1])  # it went on only after sure guesses
        if len(picture.guesses) < k and picture.guesses[-1] not in lm.eos_ids:
            assert picture.stopped_unsure == pytest.approx(sure[-1]) and sure[-1] < GO_ON
        else:
            assert picture.stopped_unsure is None


def test_the_shipped_drafts_make_more_than_one_token_per_pass_on_free_form_text(lm, shipped) -> None:
    # held out, a greedy round of k = 3 adds 1.31 tokens with the heads and 1.45 with MTP (assets/draft_heads.json)
    floor = {MEDUSA: 1.15, MTP: 1.3}
    for kind, draft in shipped.items():
        spec = SpeculativeGeneration(lm, "The history of the printing press", draft=draft, k=3, sampler=GREEDY,
                                     stop=StopSettings(max_new_tokens=32))
        list(spec.run())
        assert len(spec.generated_ids) / spec.forward_passes > floor[kind], kind
