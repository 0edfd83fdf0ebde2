"""Several rows through a linear layer in one pass over the weight, each row with the digits
of its own 1-row product (engine/fast/exact_rows_kernel.cpp).

Why: an exact packed pass gives each visitor's row its own 1-row product, because that is the
product a lone visitor's pass makes and this CPU's matrix kernels sum a row of a larger
product in another order. As batched 1-row products (`torch.bmm`) every row reads the whole
weight again, and most of a large class's pass went there. But a 1-row product's order does not
depend on the values, so it can be measured, and a kernel that sums in that order can read each
weight row once for all rows (`python -m bench.sched_bench`; figures in docs/benchmarks.md).

The summation orders this CPU's 1-row product may use, and how they were measured, are
explained once, in exact_rows_kernel.cpp's header. The kernel can sum in either; which one this
CPU's product uses is probed when it is built (`sum_order`).

A single row (a lone visitor's decode step) has its own path in the kernel: four outputs to a
vector instead of four rows, so no lane is wasted, and the CPU's threads share the weight's
rows; it reads the weights at close to memory speed where the 1-row product does not
(`python -m bench.lone_bench`; docs/benchmarks.md). In the four lanes order a few rows (a verify
pass, a small class) go row by row through the single-row path, each block of weight rows
fetched from memory once and summed against every row; so do any number where the build has no
AVX-512, for there the packed path's four-row vectors spill (`python -m bench.rows_bench`;
docs/benchmarks.md, and docs/fast-paths.md for the paths).

Nothing is assumed: the kernel is built with the machine's compiler on first use (then kept in
the cache folder, engine/loading.py's `cache_root`), and `kernel_agrees` checks it bit for bit
against the row-by-row loop for each weight shape and thread count before a pass uses it (each
decision kept in engine/fast/proofs.py's registry). Where it cannot be built (no compiler) or a
shape disagrees, the passes keep the batched 1-row products.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.fast import native_build
from engine.fast.proofs import Verdict, proven, refused, settle, shape_name
from engine.fast.row_products import one_row_products

SOURCE = Path(__file__).with_name("exact_rows_kernel.cpp")
NAMESPACE = "token_by_token"
BUILD_FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp"]  # never fuse a multiply and an add
# rows of the agreement probes, each count through the path the passes give it: up to 8 rows go
# row by row (the kernel's kRowByRowMaxRows) and more through the packed path where the build has
# it; the sixteen fused lanes order has its own code for 2, 3 and 4 rows, then groups of 1-4
PROBE_ROWS = (2, 3, 4, 6, 7, 13)
ONE_ROW_PROBES = 5  # rows of the single-row path's probe, one at a time
# the orders the kernel can sum in, by their set_sum_order codes (exact_rows_kernel.cpp's header explains them)
SUM_ORDERS = ("four lanes", "sixteen fused lanes")
ORDER_PROBE_OUTPUTS, ORDER_PROBE_INPUTS = 128, 576

KERNEL_PATH = "exact rows kernel"  # the paths' names in engine/fast/proofs.py's registry
ONE_ROW_PATH = "exact rows kernel, one row"
ROWS_PATH = "exact rows kernel, several rows"

_log = logging.getLogger(__name__)


def kernel_available() -> bool:
    """Whether the compiled kernel is registered as `torch.ops.token_by_token.lone_rows_linear`
    (built on first call, its summation order then chosen). Either way the op exists afterwards,
    so scripted passes that name it compile: without the compiled kernel it is batched 1-row
    products, and never chosen."""
    return _built_order() is not None


def sum_order() -> str:
    """The summation order the kernel copies on this machine (one of SUM_ORDERS), or "none"
    where it is not built or neither order is this CPU's 1-row product's."""
    return _built_order() or "none"


def _built_order() -> str | None:
    """The order the built kernel sums in ("none": neither), or None where it could not be built."""
    return settle(KERNEL_PATH, _build_and_choose, per_thread=False).value


def _build_and_choose() -> Verdict:
    if not _build():
        _register_fallback()
        return refused("it could not be built: the passes keep batched 1-row products")  # the build warned
    order = _choose_sum_order()
    if order == "none":
        return refused("this CPU's 1-row product sums in neither of its orders", "none")
    return proven(f"it sums in the {order} order, as this CPU's 1-row product (probe weight, one row and several)",
                  order)


def _choose_sum_order() -> str:
    """The first order whose products equal this CPU's 1-row products on a probe weight of the
    bundled model's width (one row and several): MKL picks its kernel by CPU, so the order is
    a property of the machine. `kernel_agrees` still probes every shape before a pass uses it."""
    generator = torch.Generator().manual_seed(11)
    weight = torch.randn((ORDER_PROBE_OUTPUTS, ORDER_PROBE_INPUTS), generator=generator)
    probe = torch.randn((max(PROBE_ROWS), ORDER_PROBE_INPUTS), generator=generator)
    built = torch.ops.token_by_token.lone_rows_linear  # the op itself: the kernel is not yet declared available
    for code, name in enumerate(SUM_ORDERS):
        if not torch.ops.token_by_token.set_sum_order(code):
            continue  # this build lacks it (the fused order needs AVX-512)
        if _agrees_on(probe, weight, one_row=True, multiply=built) and \
                _agrees_on(probe, weight, one_row=False, multiply=built):
            return name
    torch.ops.token_by_token.set_sum_order(0)
    return "none"


def kernel_agrees(weight: torch.Tensor, one_row: bool = False) -> bool:
    """Whether the kernel gives the row-by-row loop's digits for a weight of this shape at this
    thread count (float32 on the CPU only): for several rows at once, or, with `one_row`, for a
    single row (a lone decode step: the kernel's own single-row path). One probe on random
    numbers answers for the shape: the order a kernel sums in depends on shapes and threads, not
    on values."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
        return False
    if weight.shape[1] % 4 or weight.shape[1] < 8 or not kernel_available():
        return False

    def probe() -> Verdict:
        rows = torch.randn((max(PROBE_ROWS), weight.shape[1]), generator=torch.Generator().manual_seed(7))
        if _agrees_on(rows, weight, one_row):
            return proven("equal to 1-row products on random rows, torch.equal")
        return refused("its sums differ from 1-row products on random rows", False)

    return bool(settle(ONE_ROW_PATH if one_row else ROWS_PATH, probe, name=shape_name(weight),
                       key=(tuple(weight.shape), weight.stride())).value)


def _agrees_on(probe: torch.Tensor, weight: torch.Tensor, one_row: bool, multiply: Callable | None = None) -> bool:
    """The kernel's products of `probe`'s rows (by `multiply`, else `lone_rows_linear`) equal to
    1-row products: ONE_ROW_PROBES rows one at a time (the single-row path) with `one_row`, else
    the first PROBE_ROWS rows at a time (each of the kernel's paths)."""
    multiply = multiply or lone_rows_linear
    probe = probe[:ONE_ROW_PROBES] if one_row else probe
    loop = torch.cat([F.linear(probe[i:i + 1], weight) for i in range(probe.shape[0])])
    if one_row:
        return torch.equal(torch.cat([multiply(probe[i:i + 1], weight) for i in range(probe.shape[0])]), loop)
    return all(torch.equal(multiply(probe[:rows], weight), loop[:rows]) for rows in PROBE_ROWS)


def lone_rows_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`[rows, in] -> [rows, out]`, each row as its own 1-row product by `weight` gives it."""
    kernel_available()  # registers the op on first use
    return torch.ops.token_by_token.lone_rows_linear(x, weight)


def lone_rows_linears(x: torch.Tensor, weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """`lone_rows_linear` of `x` by each weight, in one call (the CPU's threads woken once)."""
    kernel_available()
    return torch.ops.token_by_token.lone_rows_linears(x, weights)


def sequence_rows_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`lone_rows_linear` for one sequence's rows (a verify pass, a draft's states): the same digits,
    with the kernel's own helper thread allowed where OpenMP's threads sleep."""
    kernel_available()
    return torch.ops.token_by_token.sequence_rows_linear(x, weight)


def _build() -> bool:
    try:
        native_build.build_library(SOURCE, BUILD_FLAGS, "token_by_token_lone_rows")
        return True
    except Exception as error:  # no compiler, no ninja, a failed build: the batched products serve
        _log.warning("the exact rows kernel could not be built (%s); packed passes use batched products",
                     native_build.first_line(error))
        return False


_fallback_library: torch.library.Library | None = None


def _register_fallback() -> None:
    """The ops as batched 1-row products: registered only so that scripted passes naming them compile."""
    global _fallback_library
    if _fallback_library is not None:
        return
    _fallback_library = torch.library.Library(NAMESPACE, "DEF")
    for rows in ("lone_rows", "sequence_rows"):  # the kernel's two entry points: the same products
        _fallback_library.define(f"{rows}_linear(Tensor x, Tensor weight) -> Tensor")
        _fallback_library.define(f"{rows}_linears(Tensor x, Tensor[] weights) -> Tensor[]")
        _fallback_library.impl(f"{rows}_linear", one_row_products, "CompositeExplicitAutograd")
        _fallback_library.impl(f"{rows}_linears", lambda x, weights: [one_row_products(x, w) for w in weights],
                               "CompositeExplicitAutograd")
