"""Counting a model's forward passes, whichever path runs them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from engine import LoadedModel
from engine.fast import LonePass


@contextmanager
def counted_passes(lm: LoadedModel) -> Iterator[list[int]]:
    """A list that gains an entry for every forward pass of `lm` while the block runs. The
    model's own forward hook fires only for transformers' eager pass; a lone decode step through
    the fast pass (engine/fast/lone.py) is counted at its call."""
    calls: list[int] = []
    hook = lm.model.register_forward_hook(lambda *_: calls.append(1))
    step = LonePass.step

    def counted(self: LonePass, *args: object):
        calls.append(1)
        return step(self, *args)

    LonePass.step = counted
    try:
        yield calls
    finally:
        hook.remove()
        LonePass.step = step
