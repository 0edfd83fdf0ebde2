"""Which matrix product gives each row of a prompt its lone pass's digits.

A prompt read alone goes through each linear layer as ONE n-row matrix product. This CPU's
matrix kernels do not sum every row of such a product alike. Measured with MKL on SmolLM2's five
weight shapes at two threads (docs/fast-paths.md), there are three kinds of row:
  - big: every row of a product of 12 rows or more, and below 12 rows every row in a whole
    group of four, has the digits that row gets in any large product;
  - small: below 12 rows, the last one to three rows go through another kernel, whose digits
    a 3-row product gives;
  - single: a 1-row product (a one-token prompt) has digits of its own.

So several prompts need not be read one product each, most of them a few-row product (slow:
it reads each weight from the cache for every few rows). Stacked end to end, all their big rows
go through ONE product, their small rows three to a product in one batched call, each single
row alone, and every row keeps the digits of its own prompt's lone pass. A class's short prompts
are read several times faster than one product each (`python -m bench.sched_bench`; figures in
docs/benchmarks.md).

Which row is which kind is not assumed: `measure_row_kinds` measures it on this machine's
kernels for the model's weight shapes and the thread count, and where any row fits none of the
three kinds, or the shapes disagree, it answers None and prompts are read one pass each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.fast import PromptRows, Verdict, group_products, proven, refused, settle

BIG, SMALL, SINGLE = "big", "small", "single"
SMALL_GROUP = 3  # small rows go three to a product
MEASURED_LENGTHS = range(1, 17)  # prompt lengths whose rows are sorted by kind, one by one
LONG_LENGTHS = (17, 31, 64, 100, 257, 600)  # longer prompts: every row must be big
OFFSET = 5  # the probe's rows start here, so no row sits at the same place in the reference product


@dataclass(frozen=True)
class RowKinds:
    """The kind of each row of a lone prompt's product, for prompts of up to
    max(MEASURED_LENGTHS) tokens; every row of a longer prompt is big."""

    by_length: dict[int, tuple[str, ...]]

    def of(self, length: int) -> tuple[str, ...]:
        return self.by_length.get(length, (BIG,) * length)

    def big_product_rows(self, rows: int) -> int:
        """How many rows a product must have so that `rows` rows all come out big: `rows`
        itself where that is so, else the next size that is (padded with repeats)."""
        return next((n for n in range(rows, max(self.by_length) + 1) if set(self.of(n)) == {BIG}),
                    max(rows, max(self.by_length) + 1))


KINDS_PATH = "prompt row kinds"  # the path's name in engine/fast/proofs.py's registry


def measure_row_kinds(weights: Sequence[torch.Tensor]) -> RowKinds | None:
    """The row kinds for the linear layers' `weights` on this machine and thread count, or None
    where a row fits no kind or two weight shapes disagree. Measured once per set of shapes."""
    shapes = sorted({(tuple(w.shape), w.dtype, w.device) for w in weights if w.dim() == 2}, key=str)

    def probe() -> Verdict:
        tables = [_kinds_for_shape(*shape) for shape in shapes]
        if not tables or any(table is None for table in tables):
            return refused("some row's digits fit no kind (big, small, single)")
        if any(table != tables[0] for table in tables):
            return refused("the weight shapes sort their rows differently")
        return proven("every row of prompts of 1 to 16 tokens equal to its kind's product, longer ones to a large "
                      "product's, torch.equal", RowKinds(tables[0]))

    name = "weights " + ", ".join("x".join(map(str, shape[0])) for shape in shapes)
    return settle(KINDS_PATH, probe, name=name, key=tuple(shapes)).value


@torch.inference_mode()
def _kinds_for_shape(shape: tuple[int, int], dtype: torch.dtype, device: torch.device
                     ) -> dict[int, tuple[str, ...]] | None:
    """Each measured length's row kinds for a weight of this shape, or None. Kernels choose their
    summation order by shape and thread count, not by value: random numbers answer for the shape."""
    generator = torch.Generator().manual_seed(sum(shape))
    weight = torch.randn(shape, generator=generator).to(device=device, dtype=dtype)
    rows = OFFSET + max(LONG_LENGTHS)
    x = torch.randn((rows, shape[1]), generator=generator).to(device=device, dtype=dtype)
    big = F.linear(x[:rows], weight)  # a large product: its rows are what big means
    small = _small_products(x, weight, OFFSET + max(MEASURED_LENGTHS) + SMALL_GROUP)
    if small is None:
        return None
    table: dict[int, tuple[str, ...]] = {}
    for length in MEASURED_LENGTHS:
        lone = F.linear(x[OFFSET:OFFSET + length], weight)
        kinds = []
        for r in range(length):
            row = OFFSET + r
            kind = (BIG if torch.equal(lone[r], big[row]) else SMALL if torch.equal(lone[r], small[row])
                    else SINGLE if torch.equal(lone[r], F.linear(x[row:row + 1], weight)[0]) else None)
            if kind is None:
                return None
            kinds.append(kind)
        table[length] = tuple(kinds)
    for length in LONG_LENGTHS:
        if not torch.equal(F.linear(x[OFFSET:OFFSET + length], weight), big[OFFSET:OFFSET + length]):
            return None
    return table


def _small_products(x: torch.Tensor, weight: torch.Tensor, rows: int) -> torch.Tensor | None:
    """Rows 3 to `rows - 3` of `x` through 3-row products in one batched call, as
    `prompts_linear` multiplies small rows (at their own index; the first three are NaN); None
    unless a row's digits are the same whichever place of its group it has."""
    placings = []
    for shift in range(SMALL_GROUP):  # a row first, second and third in its group
        products = group_products(x[shift:shift + rows - rows % SMALL_GROUP], weight, SMALL_GROUP)
        placings.append(products[SMALL_GROUP - shift:rows - SMALL_GROUP - shift])  # rows 3 to rows - 3 of x
    if not all(torch.equal(placings[0], other) for other in placings[1:]):
        return None
    return torch.cat([x.new_full((SMALL_GROUP, weight.shape[0]), float("nan")), placings[0]])


def prompt_rows(kinds: RowKinds, lengths: Sequence[int], device: torch.device | None = None) -> PromptRows:
    """Which product each row of prompts of `lengths` tokens, stacked end to end, goes through
    (row indices on `device`). A prompt alone goes through one product of all its rows: its
    lone pass's product (two products would read every weight twice)."""
    if len(lengths) == 1:
        return PromptRows(_indices(list(range(lengths[0])), device), _indices([], device), 0, _indices([], device))
    sorted_rows: dict[str, list[int]] = {BIG: [], SMALL: [], SINGLE: []}
    start = 0
    for length in lengths:
        for r, kind in enumerate(kinds.of(length)):
            sorted_rows[kind].append(start + r)
        start += length
    big, small = sorted_rows[BIG], sorted_rows[SMALL]
    if big:  # repeats of a big row are big too, and copied back to the same place
        big += big[:1] * (kinds.big_product_rows(len(big)) - len(big))
    small_count = len(small)
    if small:
        small += small[:1] * (-small_count % SMALL_GROUP)
    return PromptRows(_indices(big, device), _indices(small, device), small_count,
                      _indices(sorted_rows[SINGLE], device))


def _indices(rows: list[int], device: torch.device | None) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long, device=device)
