"""The training scripts on the tiny random model (tests/tiny.py): the self-distillation data
(greedy continuations and the states that predicted them), the draft vocabulary, and a
one-epoch run of each script that writes weights the engine loads back, byte for byte the same
from the same seed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.forward import forward_all_hidden, new_cache
from engine.speculative.heads import MEDUSA, MTP, load_trained
from training.distill import Recipe, Sequences, distill, draft_vocabulary, read_prompts, split_prompts
from training.fit import Log, RunConfig, offsets
from training.heads import train_heads
from training.mtp import train_mtp

RECIPE = Recipe(max_new_tokens=6, held_out_every=3, generate_batch=4, hidden_batch=3)
RUN = RunConfig(epochs=1, batch=16, draft_vocab=64, warmup_steps=1)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    path.write_text("# a comment\nabc\nhello there\nthe cat sat\nx\n\nonce upon\nwhy is it\n")
    return path


@pytest.fixture(scope="module")
def data(tiny_lm, prompts, tmp_path_factory):
    return distill(tiny_lm, RECIPE, prompts, cache=tmp_path_factory.mktemp("cache"), log=lambda _: None)


def test_prompts_skip_comments_and_every_third_is_held_out(prompts) -> None:
    lines = read_prompts(prompts)
    assert lines == ["abc", "hello there", "the cat sat", "x", "once upon", "why is it"]
    train, held = split_prompts(lines, 3)
    assert held == ["the cat sat", "why is it"] and len(train) == 4


def test_each_prompt_is_continued_greedily_as_text_and_as_chat(tiny_lm, data) -> None:
    assert len(data.train.tokens) == 8 and len(data.held.tokens) == 4  # two forms of each prompt
    assert data.train.prompts[0] == "text: abc" and data.train.prompts[1] == "chat: abc"
    with torch.inference_mode():
        ids = tiny_lm.tokenizer("abc")["input_ids"]
        expected = tiny_lm.model.generate(input_ids=torch.tensor([ids]), max_new_tokens=6, do_sample=False)
    assert data.train.tokens[0].tolist() == expected[0, len(ids):].tolist()[:len(data.train.tokens[0])]


def test_row_j_holds_the_state_that_predicted_token_j(tiny_lm, data) -> None:
    ids = tiny_lm.tokenizer("abc")["input_ids"]
    continuation = data.train.tokens[0].tolist()
    fed = ids + continuation
    logits, hidden = forward_all_hidden(tiny_lm, fed, new_cache(tiny_lm), keep=len(continuation) + 1)
    assert torch.allclose(data.train.hidden[0], hidden[:-1], atol=1e-4)
    assert logits[:-1].argmax(-1).tolist() == continuation  # greedy: each token is its state's argmax


def test_the_cache_gives_back_the_same_data(tiny_lm, prompts, data, tmp_path) -> None:
    first = distill(tiny_lm, RECIPE, prompts, cache=tmp_path, log=lambda _: None)
    lines = []
    again = distill(tiny_lm, RECIPE, prompts, cache=tmp_path, log=lines.append)
    assert "from the cache" in lines[0]
    assert all(torch.equal(a, b) for a, b in zip(first.train.hidden, again.train.hidden, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(first.train.tokens, data.train.tokens, strict=True))


def test_the_draft_vocabulary_puts_end_tokens_then_the_most_frequent_first(tiny_lm) -> None:
    seqs = Sequences([], [torch.tensor([7, 7, 7, 9, 9, 3])], ["x"])
    vocab = draft_vocabulary(tiny_lm, seqs, 6).tolist()
    assert vocab[:4] == [tiny_lm.eos_ids[0], 7, 9, 3] and vocab[4:] == [0, 1]


def test_offsets_point_each_row_at_the_rows_ahead_in_its_own_sequence() -> None:
    seqs = Sequences([torch.zeros(3, 2), torch.zeros(2, 2)], [torch.tensor([1, 2, 3]), torch.tensor([4, 5])],
                     ["a", "b"])
    _, tokens, ahead = offsets(seqs, 2)
    assert tokens.tolist() == [1, 2, 3, 4, 5]
    assert ahead.tolist() == [[1, 2], [2, -1], [-1, -1], [4, -1], [-1, -1]]


@pytest.mark.parametrize(("kind", "train"), [(MEDUSA, train_heads), (MTP, train_mtp)])
def test_one_epoch_writes_weights_the_engine_loads_and_the_same_seed_writes_the_same_bytes(
        tiny_lm, data, tmp_path, kind, train) -> None:
    entry = train(tiny_lm, data, RUN, tmp_path / "a", Log(tmp_path / "a.log"))
    trained = load_trained(kind, tiny_lm, tmp_path / "a" / "draft_heads.json")
    assert trained.vocab_ids.numel() == 64 and trained.vocab_ids[0] == tiny_lm.eos_ids[0]
    figures = entry["held_out"]
    assert figures["epoch"] == 1 and all(0 <= a <= 1 for a in figures["top1"])
    assert '"top1"' in (tmp_path / "a.log").read_text()
    again = train(tiny_lm, data, RUN, tmp_path / "b", Log(None))
    assert again["sha256"] == entry["sha256"]
