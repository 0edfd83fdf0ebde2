"""The logit lens's product (engine/fast/lens_kernel.py): every row through a weight in one pass
over it, close to a float64 product on every shape it may meet, each row's statistics close to a
float64 softmax, and `F.linear` and torch wherever the kernel is not usable."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import engine.fast.lens_kernel as lens_module
from engine.fast.lens_kernel import kernel_usable, lens_linear, lens_statistics

# rows: one, a partial group of six, whole groups, whole groups and a rest; in: under one vector,
# lane tails, the bundled model's 576; out: a single row, an odd count, a block and a bit
SHAPES = [(1, 9, 1), (5, 33, 3), (6, 64, 65), (7, 100, 130), (13, 576, 129), (30, 576, 200)]


@pytest.mark.parametrize("rows,size,out", SHAPES)
def test_the_kernel_is_a_float64_product_to_float32_rounding(rows: int, size: int, out: int) -> None:
    if not kernel_usable():
        pytest.skip("the lens kernel is not built on this machine (F.linear serves: the next test)")
    generator = torch.Generator().manual_seed(rows * 1000 + size)
    x, w, bias = (torch.randn(rows, size, generator=generator), torch.randn(out, size, generator=generator),
                  torch.randn(out, generator=generator))
    ours = lens_linear(x, w, bias)
    assert ours.shape == (rows, out) and ours.dtype == torch.float32
    exact = x.double() @ w.double().T + bias.double()
    scale = x.double().abs() @ w.double().abs().T + bias.double().abs()
    assert bool(((ours.double() - exact).abs() <= 1e-5 * scale).all())
    # each row is its own: a row's outputs do not depend on the rows beside it
    assert torch.allclose(lens_linear(x[-1:], w, bias), ours[-1:], rtol=0, atol=1e-5 * float(scale.max()))


def test_where_the_kernel_is_not_usable_f_linear_serves_with_its_digits(monkeypatch) -> None:
    x, w = torch.randn(4, 24), torch.randn(10, 24)
    monkeypatch.setattr(lens_module, "kernel_usable", lambda: False)
    assert torch.equal(lens_linear(x, w), F.linear(x, w))
    monkeypatch.setattr(lens_module, "kernel_usable", lambda: True)  # float64 and a non-CPU never reach the kernel
    assert torch.equal(lens_linear(x.double(), w.double()), F.linear(x.double(), w.double()))


@pytest.mark.parametrize("wrong", ["product", "statistics"])
def test_a_kernel_that_sums_wrong_is_refused_by_its_probe(monkeypatch, wrong: str) -> None:
    if not kernel_usable():
        pytest.skip("the lens kernel is not built on this machine")
    real = torch.ops.token_by_token_lens

    class Off:  # one of the two ops a little off: 1e-3 relative in every output
        @staticmethod
        def lens_linear(x, w):
            return real.lens_linear(x, w) * (1 + 1e-3 if wrong == "product" else 1)

        @staticmethod
        def lens_statistics(rows, pick):
            table = real.lens_statistics(rows, pick)
            return table * (1 + 1e-3) if wrong == "statistics" else table

    monkeypatch.setattr(torch.ops, "token_by_token_lens", Off, raising=False)
    assert not lens_module._agreement().proven


def test_the_statistics_are_a_float64_softmax_and_entropy_of_each_row() -> None:
    if not kernel_usable():
        pytest.skip("the lens kernel is not built on this machine")
    generator = torch.Generator().manual_seed(3)
    rows = torch.randn(7, 49152, generator=generator) * torch.tensor([[0.01], [1.0], [3.0], [10.0], [30.0], [80.0],
                                                                      [1.0]])
    rows[6, 10] = rows[6, 20] = rows[6].max() + 1  # equal maxima: the first is the top, as argmax
    pick = 20
    ours = lens_statistics(rows, pick)
    probs = rows.double().softmax(dim=-1)
    for row, (top, top_p, pick_p, rank, bits) in zip(range(7), ours, strict=True):
        assert top == int(probs[row].argmax()) and rank == int((rows[row] > rows[row, pick]).sum()) + 1
        assert top_p == pytest.approx(float(probs[row].max()), rel=1e-6)
        assert pick_p == pytest.approx(float(probs[row, pick]), rel=1e-6, abs=1e-300)
        assert bits == pytest.approx(float(torch.special.entr(probs[row]).sum()) / math.log(2), abs=1e-5)
    assert ours[6][0] == 10 and ours[6][3] == 1  # the pick ties the top: none above it


def test_rows_that_are_not_finite_leave_the_statistics_to_torch() -> None:
    rows = torch.zeros(2, 64)
    rows[1, 3] = float("nan")
    assert lens_statistics(rows, 0) is None
    assert lens_statistics(rows.double(), 0) is None  # only float32 rows reach the kernel
    assert lens_statistics(torch.zeros(2, 15), 0) is None  # a vocabulary under two vectors: torch's path


WITHOUT_COMPILER = """
import torch, torch.nn.functional as F
from engine.fast.lens_kernel import kernel_usable, lens_linear, lens_statistics
from tests.engine.conftest import run_without_compiler
assert not kernel_usable()
x, w = torch.randn(3, 16), torch.randn(5, 16)
assert torch.equal(lens_linear(x, w), F.linear(x, w))
print("F.linear")
"""


def test_without_a_compiler_the_lens_uses_f_linear_and_says_so(without_compiler_run) -> None:
    done = without_compiler_run
    assert "F.linear" in done.stdout and "lens kernel could not be built" in done.stderr
