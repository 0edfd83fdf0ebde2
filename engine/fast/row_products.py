"""Rows through a weight, each group of rows its own matrix product, all in one batched call.

The exact packed passes' fallback where the exact rows kernel is not used: a lone visitor's
pass multiplies one row at a time, and a batched call of 1-row products gives each row those
digits (checked per shape before use: engine/serving/packed_twin.py `batched_rows_agree`).

No `from __future__ import annotations` here: TorchScript compiles these functions for the
scripted passes (engine/fast/scripted_llama.py) and reads their annotations as written.
"""

import torch
from torch import Tensor


def group_products(x: Tensor, weight: Tensor, group: int) -> Tensor:
    """`[rows, in] -> [rows, out]` (rows a multiple of `group`), each `group` rows their own
    product, all in one batched call: the weight broadcast, never copied."""
    groups = x.reshape(-1, group, x.shape[1])
    return torch.bmm(groups, weight.t().expand(groups.shape[0], -1, -1)).reshape(-1, weight.shape[0])


def one_row_products(x: Tensor, weight: Tensor) -> Tensor:
    """`[rows, in] -> [rows, out]`, each row its own 1-row product, all in one batched call."""
    return group_products(x, weight, 1)
