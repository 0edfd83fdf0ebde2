"""Which matrix product gives each row of a prompt its lone digits (engine/serving/prompt_rows.py)."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

import engine.serving.prompt_rows as prompt_rows_module
from engine.fast import prompts_linear
from engine.forward import forward_one, new_cache
from engine.serving.packed import forward_prefills, scripted_prefill
from engine.serving.prompt_rows import BIG, SINGLE, SMALL, RowKinds, measure_row_kinds, prompt_rows
from tests.engine.test_scheduler import tiny_llama

SHAPES = [(64, 64), (128, 64), (64, 128), (576, 576), (1536, 576), (576, 1536)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_stacked_prompts_multiplied_by_kind_give_each_row_its_lone_products_digits(shape) -> None:
    """The property the prompts' pass rests on, checked on this machine's kernels for random
    prompt lengths: every row of the stacked product equals its own prompt's lone product."""
    weight = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    kinds = measure_row_kinds([weight])
    if kinds is None:  # then the pass is not used for this shape: prompts are read one pass each
        pytest.skip(f"this CPU's products give some prompt rows of a {shape} weight digits no stacked product has")
    pick = random.Random(sum(shape))
    for _ in range(6):
        lengths = [pick.choice([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 17, 40]) for _ in range(pick.randint(1, 9))]
        x = torch.randn((sum(lengths), shape[1]))
        stacked = prompts_linear(x, weight, prompt_rows(kinds, lengths))
        start = 0
        for n in lengths:
            assert torch.equal(stacked[start:start + n], F.linear(x[start:start + n], weight)), lengths
            start += n


def test_rows_are_sorted_by_kind_and_padded_to_products_that_keep_their_digits() -> None:
    table = {n: (SINGLE,) if n == 1 else (BIG,) * (n // 4 * 4) + (SMALL,) * (n % 4) if n < 12 else (BIG,) * n
             for n in range(1, 17)}
    table[8] = (BIG,) * 4 + (SMALL,) * 4  # say 8 rows were not all big: a product of 8 big rows is padded
    rows = prompt_rows(RowKinds(table), [6, 1, 2, 2])
    assert rows.big.tolist() == [0, 1, 2, 3]  # a 4-row product is all big
    assert rows.single.tolist() == [6]
    assert rows.small_count == 6 and rows.small.tolist() == [4, 5, 7, 8, 9, 10]  # three to a product
    padded = prompt_rows(RowKinds(table), [4, 4, 1, 2])  # 8 big rows: padded to 12 with repeats of the first
    assert padded.big.tolist() == [0, 1, 2, 3, 4, 5, 6, 7] + [0] * 4
    assert padded.small.tolist() == [9, 10, 9] and padded.small_count == 2
    long = prompt_rows(RowKinds(table), [20, 2])  # past the measured lengths every row is big
    assert long.big.tolist() == list(range(20)) and long.small_count == 2
    alone = prompt_rows(RowKinds(table), [6])  # a prompt alone: one product of its rows, its lone pass's
    assert alone.big.tolist() == list(range(6)) and alone.small_count == 0 and alone.single.numel() == 0


def test_where_a_row_fits_no_kind_prompts_are_read_one_pass_each_with_lone_numbers(monkeypatch,
                                                                                   forget_proofs) -> None:
    monkeypatch.setattr(prompt_rows_module, "_kinds_for_shape", lambda *shape: None)
    forget_proofs(prompt_rows_module.KINDS_PATH)
    fresh = tiny_llama()
    assert scripted_prefill(fresh) is None
    prompts = [[4, 5, 6, 7, 8], [9]]
    caches = [new_cache(fresh) for _ in prompts]
    logits = forward_prefills(fresh, prompts, caches)
    for ids, got in zip(prompts, logits, strict=True):
        assert torch.equal(got, forward_one(fresh, ids, new_cache(fresh)))


def test_weight_shapes_that_disagree_on_row_kinds_give_no_kinds(monkeypatch, forget_proofs) -> None:
    tables = iter([{1: (SINGLE,)}, {1: (BIG,)}])
    monkeypatch.setattr(prompt_rows_module, "_kinds_for_shape", lambda *shape: next(tables))
    forget_proofs(prompt_rows_module.KINDS_PATH)
    assert measure_row_kinds([torch.zeros(3, 4), torch.zeros(5, 4)]) is None
