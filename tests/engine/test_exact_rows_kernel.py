"""Several rows through a weight in one pass, each with its 1-row product's digits (the exact rows kernel)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import engine.fast.exact_rows_kernel as lone_rows_module
import engine.serving.packed as packed_module
from engine.fast import native_build, scripted_llama
from engine.fast.exact_rows_kernel import kernel_agrees, kernel_available, lone_rows_linear, lone_rows_linears
from engine.serving.packed import forward_packed, one_row_products_how, scripted_plan
from tests.engine.conftest import meeting_sizes
from tests.engine.test_scheduler import filled_cache, lone_logits, tiny_llama

ROOT = Path(__file__).resolve().parents[2]
SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (2048, 576), (64, 64), (128, 32)]  # (out, in)


def row_by_row(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.cat([F.linear(x[i:i + 1], weight) for i in range(x.shape[0])])


def test_the_kernel_is_built_on_this_machine() -> None:
    assert kernel_available()


def test_the_kernel_is_used_exactly_where_it_sums_as_this_machines_one_row_product() -> None:
    """The probe's verdict follows the measured orders, and where they differ the passes keep the
    batched 1-row products, with every row's lone logits."""
    same_order = meeting_sizes(F.linear, 32) == meeting_sizes(lone_rows_linear, 32)
    for shape in ((576, 576), (1536, 576)):
        weight = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape)))
        assert kernel_agrees(weight) == same_order
        expected = scripted_llama.LONE_ROWS if same_order else scripted_llama.ONE_ROW_PRODUCTS
        assert one_row_products_how(weight, 9) == expected
    tiny = tiny_llama()
    lengths, tokens = (2, 9, 5, 1, 30, 7), [4, 8, 15, 16, 23, 42]
    caches = [filled_cache(tiny, n, offset=n) for n in lengths]
    lone = torch.stack([lone_logits(tiny, t, c) for t, c in zip(tokens, caches, strict=True)])
    assert torch.equal(forward_packed(tiny, tokens, caches), lone)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_every_row_gets_the_digits_of_its_own_one_row_product(shape, lone_order) -> None:
    weight = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape)))
    assert kernel_agrees(weight)
    for rows in (1, 2, 3, 4, 5, 15, 16, 17, 33):
        x = torch.randn((rows, shape[1]), generator=torch.Generator().manual_seed(rows))
        assert torch.equal(lone_rows_linear(x, weight), row_by_row(x, weight)), rows


@pytest.mark.parametrize("rows", [3, 15, 40])
def test_several_weights_in_one_call_give_what_each_gives_alone(rows: int, lone_order) -> None:
    """A layer's query, key and value (or gate and up) in one call: small ones on one thread,
    large ones split between threads, each output computed whole by one thread."""
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn((rows, 576), generator=generator)
    for outputs in [(576, 192, 192), (1536, 1536), (8,)]:
        weights = [torch.randn((n, 576), generator=generator) for n in outputs]
        together = lone_rows_linears(x, weights)
        assert len(together) == len(weights)
        for weight, product in zip(weights, together, strict=True):
            assert torch.equal(product, row_by_row(x, weight))


def test_infinities_and_nans_come_out_as_the_one_row_product_gives_them(lone_order) -> None:
    weight = torch.randn((64, 576), generator=torch.Generator().manual_seed(3))
    x = torch.randn((6, 576), generator=torch.Generator().manual_seed(4))
    x[0, 1], x[1, 2] = float("inf"), float("-inf")  # in the first four products, summed apart
    x[2, 5], x[3, 0] = float("nan"), 3e38  # a lane's first product; a product that overflows
    x[4, 1], x[4, 7] = float("inf"), float("-inf")  # two lanes that meet as inf - inf
    torch.testing.assert_close(lone_rows_linear(x, weight), row_by_row(x, weight), rtol=0, atol=0, equal_nan=True)


@pytest.fixture
def order_restored():
    """Lets a test set the kernel's summation order; the order chosen for this machine comes back."""
    chosen = lone_rows_module.sum_order()
    yield
    code = lone_rows_module.SUM_ORDERS.index(chosen) if chosen in lone_rows_module.SUM_ORDERS else 0
    assert torch.ops.token_by_token.set_sum_order(code)


def test_the_kernel_sums_in_the_documented_four_lanes_order(order_restored) -> None:
    """The order itself, measured: four lanes, lane 0 starting with the first four products."""
    assert torch.ops.token_by_token.set_sum_order(0)
    ours = meeting_sizes(lone_rows_linear, 32)
    assert ours[0][:5] == [1, 2, 3, 4, 5]  # inputs 0-3 summed one by one, then input 4 in lane 0
    assert ours[0][8] == 6 and ours[5][9] == 2 and ours[6][10] == 2  # lanes take every fourth input
    assert ours[0][6] == 18 and ours[5][7] == 14 and ours[0][5] == 32  # (lane 0 + lane 2) + (lane 1 + lane 3)


def test_the_kernel_sums_in_the_documented_sixteen_fused_lanes_order(order_restored) -> None:
    """The order exact_rows_kernel.cpp's header describes, measured on a 32-input row."""
    if not torch.ops.token_by_token.set_sum_order(1):
        pytest.skip("this build has no AVX-512: the fused order is not compiled in")
    ours = meeting_sizes(lone_rows_linear, 32)
    assert ours[0][1] == 2 and ours[0][9] == 3 and ours[0][5] == 5 and ours[0][3] == 9  # lane 0 meets lanes 8, 4, 2
    assert ours[2][10] == 2 and ours[2][6] == 4 and ours[0][2] == 17  # lane 1 meets 9, then 5; then lane 0
    assert ours[0][17] == 18 and ours[0][25] == 19 and ours[21][29] == 2 and ours[0][21] == 21  # the tail's lanes
    assert ours[18][26] == 2 and ours[0][18] == 32  # the tail's odd half comes last


def test_the_order_chosen_is_the_one_row_products_where_either_is(order_restored) -> None:
    sizes = meeting_sizes(F.linear, 32)
    matching = []
    for code, name in enumerate(lone_rows_module.SUM_ORDERS):
        if torch.ops.token_by_token.set_sum_order(code) and meeting_sizes(lone_rows_linear, 32) == sizes:
            matching.append(name)
    assert lone_rows_module.sum_order() == (matching[0] if matching else "none")


def test_the_kernel_sums_in_the_order_the_one_row_product_uses(lone_order) -> None:
    assert meeting_sizes(lone_rows_linear, 32) == meeting_sizes(F.linear, 32)


def test_a_weight_where_the_kernel_would_change_digits_keeps_the_batched_products(monkeypatch, forget_proofs) -> None:
    forget_proofs(lone_rows_module.ROWS_PATH)
    real = lone_rows_module.lone_rows_linear
    monkeypatch.setattr(lone_rows_module, "lone_rows_linear", lambda x, w: real(x, w) * (1 + 1e-6))
    weight = torch.randn(576, 576)
    assert not kernel_agrees(weight)
    assert one_row_products_how(weight, 9) == scripted_llama.ONE_ROW_PRODUCTS


def test_other_dtypes_and_input_widths_are_never_given_to_the_kernel() -> None:
    assert not kernel_agrees(torch.randn(64, 64, dtype=torch.float64))
    assert not kernel_agrees(torch.randn(64, 30))  # not a whole number of lanes
    assert not kernel_agrees(torch.randn(64, 4))


def test_a_scripted_pass_takes_the_kernel_from_two_rows_with_lone_logits(forget_proofs, lone_order) -> None:
    forget_proofs(*packed_module.PLAN_PATHS.values())
    tiny = tiny_llama(vocab_size=320)  # each of two threads' share of the head a multiple of four
    plan = scripted_plan(tiny)
    for rows in (1, 2, 3, 4, 6):
        layers, head = plan.hows_for(rows)
        matrices = {how for how, weight in zip(layers, plan.weights.layers, strict=True) if weight.dim() == 2}
        if rows >= packed_module.LONE_ROWS_FROM:
            assert matrices == set(head) == {scripted_llama.LONE_ROWS}, rows
        else:  # the batched 1-row products, or one call a row where this CPU's batched call differs
            assert matrices | set(head) <= {scripted_llama.ONE_ROW_PRODUCTS, scripted_llama.ROW_LOOP}, rows
    lengths, tokens = (2, 9, 5, 1, 30, 7), [4, 8, 15, 16, 23, 42]
    caches = [filled_cache(tiny, n, offset=n) for n in lengths]
    expected = torch.stack([lone_logits(tiny, t, c) for t, c in zip(tokens, caches, strict=True)])
    assert torch.equal(forward_packed(tiny, tokens, caches), expected)


WITHOUT_COMPILER = """
import torch
from engine.serving.packed import forward_packed, scripted_plan
from engine.fast.exact_rows_kernel import kernel_available
from engine.fast import scripted_llama
from tests.engine.test_scheduler import filled_cache, lone_logits, tiny_llama
assert not kernel_available()
lm = tiny_llama()
plan = scripted_plan(lm)
assert plan is not None  # the scripted pass still compiles: it names the op, registered as a stand-in
assert scripted_llama.LONE_ROWS not in plan.hows_for(6)[0]
caches = [filled_cache(lm, n, offset=n) for n in (2, 9, 5, 1, 30, 7)]
tokens = [4, 8, 15, 16, 23, 42]
expected = torch.stack([lone_logits(lm, t, c) for t, c in zip(tokens, caches)])
assert torch.equal(forward_packed(lm, tokens, caches), expected)
print("batched products")
"""


def test_without_a_compiler_the_passes_keep_the_batched_products_and_their_digits(without_compiler_run) -> None:
    done = without_compiler_run
    assert "batched products" in done.stdout
    # said once in the server's log, not silently slower
    assert "the exact rows kernel could not be built" in done.stderr


def test_a_lock_left_by_a_build_that_died_is_cleared_and_a_fresh_one_is_kept(tmp_path) -> None:
    """torch waits for as long as a build's lock file exists: a stale one would stop the server."""
    stale, fresh = tmp_path / "stale", tmp_path / "fresh"
    for folder in (stale, fresh):
        folder.mkdir()
        (folder / "lock").touch()
    old = time.time() - native_build.STALE_LOCK_S - 60
    os.utime(stale / "lock", (old, old))
    native_build.clear_stale_lock(stale)
    native_build.clear_stale_lock(fresh)
    native_build.clear_stale_lock(tmp_path / "missing")  # no folder, no lock: nothing to do
    assert not (stale / "lock").exists() and (fresh / "lock").exists()


def test_where_openmps_threads_sleep_the_kernels_own_helper_gives_the_same_digits() -> None:
    """With OMP_WAIT_POLICY=PASSIVE a few rows at two threads are split with the kernel's own helper
    thread instead of an OpenMP region: every row still has its 1-row product's digits, however
    many calls come back to back or apart."""
    script = (
        "import time, torch, torch.nn.functional as F\n"
        "from engine.fast.exact_rows_kernel import kernel_agrees, lone_rows_linear, lone_rows_linears\n"
        "torch.set_num_threads(2)\n"
        "g = torch.Generator().manual_seed(0)\n"
        "for shape in [(576, 576), (1536, 576), (576, 1536), (49152, 576)]:\n"
        "    w = torch.randn(shape, generator=g)\n"
        "    if not kernel_agrees(w):\n"
        "        continue\n"
        "    for rows in (1, 2, 3, 4, 5, 16, 17):\n"
        "        x = torch.randn((rows, shape[1]), generator=g)\n"
        "        loop = torch.cat([F.linear(x[i:i + 1], w) for i in range(rows)])\n"
        "        assert torch.equal(lone_rows_linear(x, w), loop), (shape, rows)\n"
        "        time.sleep(0.002)  # long enough for the helper to have gone to sleep\n"
        "x = torch.randn((1, 576), generator=g)\n"
        "ws = [torch.randn((n, 576), generator=g) for n in (576, 192, 192)]\n"
        "for _ in range(200):\n"
        "    for out, w in zip(lone_rows_linears(x, ws), ws):\n"
        "        assert torch.equal(out, F.linear(x, w))\n"
        "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("ok")
