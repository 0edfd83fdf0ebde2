"""The logit lens's product: every layer's hidden state through the LM head in one pass over the
head (engine/fast/lens_kernel.cpp), for the view inside the forward pass (engine/inside.py).

Why: a few dozen rows through the bundled model's 49,152 x 576 head is a large product, and
`F.linear` makes it at a fraction of the rate of a square product on the same machine; in slices
of the head the same product was faster, so what costs is taking the whole weight at once (the
matrix library copies it into its own layout first), not the arithmetic. The kernel reads each
weight row where it lies, once for every row, and takes well under `F.linear`'s time
(`python -m bench.inside_bench`; figures in docs/benchmarks.md).

Its sums are fused multiply-adds in vector lanes: close to `F.linear` (a probe on first use
checks it against a float64 product), not its digits. That is why only the lens of the layers
below the last goes through it; the last layer's lens is the step's own logits. Where the kernel
cannot be built or the probe disagrees, `F.linear` serves, and the log says so once.

The rows' statistics (top token, probabilities, the pick's rank, entropy) are one more op of the
kernel: each row's softmax from float32 exponentials summed in double, closer to a float64
softmax than torch's float32 one (tests/engine/test_lens_kernel.py bounds both), in less time.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.fast import native_build
from engine.fast.proofs import Verdict, proven, refused, settle

SOURCE = Path(__file__).with_name("lens_kernel.cpp")
BUILD_FLAGS = ["-O3", "-march=native", "-fopenmp"]
PROBE_SHAPES = ((13, 100, 77), (6, 64, 130), (1, 9, 5))  # rows, in, out: whole tiles, a partial one, lane tails
MIN_VOCAB = 16  # the statistics read a row a vector (8 or 16 lanes) at a time: a smaller one goes to torch
PROBE_TOLERANCE = 1e-5  # relative to the sum of |products| of each output: float32 rounding, not a wrong sum

LENS_PATH = "lens kernel"  # the path's name in engine/fast/proofs.py's registry

_log = logging.getLogger(__name__)


def lens_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`[rows, in]` by `weight [out, in]` (+ bias) -> `[rows, out]`: through the kernel for float32
    on the CPU where it is usable, else `F.linear`."""
    if x.dtype == weight.dtype == torch.float32 and x.device.type == weight.device.type == "cpu" and kernel_usable():
        out = torch.ops.token_by_token_lens.lens_linear(x, weight)
        return out if bias is None else out.add_(bias)
    return F.linear(x, weight, bias)


def lens_statistics(rows: torch.Tensor, pick: int) -> list[tuple[int, float, float, int, float]] | None:
    """Per row of `rows [count, vocab]`: (top token, its p, the pick's p, the pick's rank, entropy in
    bits), each row's softmax taken in double from float32 exponentials, in one pass over the rows
    after a pass for their maxima (torch's softmax, max, comparison and log-softmax read them six
    times; `python -m bench.inside_bench` times both). None where the kernel is not usable or a
    logit is not finite: the caller's torch path then says what those give."""
    if rows.dtype != torch.float32 or rows.device.type != "cpu" or rows.shape[-1] < MIN_VOCAB or not kernel_usable():
        return None
    table = torch.ops.token_by_token_lens.lens_statistics(rows, pick)
    if not bool(table[:, 4].isfinite().all()):
        return None
    return [(int(top), top_p, pick_p, int(rank), bits) for top, top_p, pick_p, rank, bits in table.tolist()]


def kernel_usable() -> bool:
    """Whether the kernel is built, loaded and agrees with a float64 product (tried once)."""
    return settle(LENS_PATH, _probe, per_thread=False).proof.proven


def _probe() -> Verdict:
    if not _built():
        return refused("it could not be built: the logit lens uses F.linear")  # the build warned
    return _agreement()


def _agreement() -> Verdict:
    """The built kernel's statistics and products against float64 ones."""
    generator = torch.Generator().manual_seed(11)
    if not _statistics_agree(generator):
        return refused("its statistics disagree with float64 ones: the logit lens uses F.linear", warn=True)
    if not _products_agree(generator):
        return refused("its products disagree with a float64 product: the logit lens uses F.linear", warn=True)
    return proven(f"its products within {PROBE_TOLERANCE:g} of float64 ones (relative to the sum of |products|), "
                  "its statistics close to float64 ones; near F.linear's, not its digits")


def _built() -> bool:
    try:
        native_build.build_library(SOURCE, BUILD_FLAGS, "token_by_token_lens")
        return True
    except Exception as error:  # no compiler, no ninja, a failed build: F.linear serves
        _log.warning("the lens kernel could not be built (%s); the logit lens uses F.linear",
                     native_build.first_line(error))
        return False


def _products_agree(generator: torch.Generator) -> bool:
    """The kernel's products against float64 ones, on shapes with whole tiles, a partial one and
    lane tails."""
    for rows, size, out in PROBE_SHAPES:
        x, w = torch.randn(rows, size, generator=generator), torch.randn(out, size, generator=generator)
        ours = torch.ops.token_by_token_lens.lens_linear(x, w).double()
        exact = x.double() @ w.double().T
        scale = x.double().abs() @ w.double().abs().T
        if not bool(((ours - exact).abs() <= PROBE_TOLERANCE * scale).all()):
            return False
    return True


def _statistics_agree(generator: torch.Generator) -> bool:
    """The statistics against softmax and entropy in float64 on rows from flat to peaked, with a
    vocabulary that is no whole number of vectors."""
    rows = torch.randn(4, 1001, generator=generator) * torch.tensor([[0.01], [1.0], [8.0], [40.0]])
    pick = 500
    ours = torch.ops.token_by_token_lens.lens_statistics(rows, pick)
    probs = rows.double().softmax(dim=-1)
    tops = probs.argmax(dim=-1)
    ranks = (rows > rows[:, pick : pick + 1]).sum(dim=-1) + 1
    bits = torch.special.entr(probs).sum(dim=-1) / math.log(2)
    return (torch.equal(ours[:, 0].long(), tops) and torch.equal(ours[:, 3].long(), ranks)
            and torch.allclose(ours[:, 1], probs.max(dim=-1).values, rtol=1e-6, atol=0)
            and torch.allclose(ours[:, 2], probs[:, pick], rtol=1e-6, atol=1e-300)
            and torch.allclose(ours[:, 4], bits, rtol=0, atol=1e-5))
