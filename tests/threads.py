"""Running a block at a given torch thread count."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def threads(count: int) -> Iterator[None]:
    """torch at `count` threads inside the block, the count before it restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
