"""Run the sampler's small tensor work on a thread of its own that uses one CPU thread.

The sampler works on one vocabulary-sized vector (49,152 floats for SmolLM2). That is just
over torch's parallel grain size, so every element-wise op splits across the intra-op
threads, and each split waits for all its threads. When another process holds a core (the
browser drawing the chart, on a 2-core machine) that wait is a whole scheduler slice,
and re-sampling on two threads is many times slower in its worst case than on one (the
README's "Why the code is shaped as it is", measured by `bench.engine_bench`).

Why a thread of its own: with torch's OpenMP build, each thread keeps its own thread count,
and the last count set anywhere becomes the one threads started later begin with. Lowering
and restoring the count around each call on the caller's thread let concurrent visitors leave
each other's threads (and later ones) on one thread, and a forward pass on one thread gives
other digits than on two (its products add up in another order). Here the count is set once, on the
sampler's own worker; every other thread keeps the count it would have had.

The sampling functions themselves (engine/sampling.py) are plain: the hop happens once, where
work enters the sampler (`Generation._sample` for a step or a re-sample, and the Sampler lab's
entry points in ui/domain/sampler_lab.py), so a breakpoint in a filter is one hand-off away from its caller,
and 1,000 draws cost one hand-off, not 1,000.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

import torch

P = ParamSpec("P")
R = TypeVar("R")

_start_lock = threading.Lock()
_worker: ThreadPoolExecutor | None = None
_on_worker = threading.local()  # .active is True on the sampler's worker thread


def _become_single_threaded() -> None:
    # a thread takes the current default count the first time it asks for one or runs a
    # parallel op; have that happen now, so the count set next is not overwritten later. The op
    # is below torch's grain size, so it runs on this thread alone: one that split across two
    # would leave this thread a team of OpenMP threads of its own, and while it lives every
    # forward pass on the visitors' threads took 36 ms instead of 23 (`bench.engine_bench`, a
    # Sapphire Rapids, 3 December 2026)
    torch.get_num_threads()
    torch.ones(16).add_(1)
    torch.set_num_threads(1)
    _on_worker.active = True


def _sampler_worker() -> ThreadPoolExecutor:
    global _worker
    with _start_lock:
        if _worker is None:
            default = torch.get_num_threads()
            worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sampler",
                                        initializer=_become_single_threaded)
            worker.submit(lambda: None).result()  # its set-up has run
            # setting the worker's count also set the one new threads begin with: put it back
            torch.set_num_threads(default)
            _worker = worker
        return _worker


def on_sampler_thread(function: Callable[P, R]) -> Callable[P, R]:
    """Decorator: run `function` on the sampler's single-threaded worker and wait for it
    (directly when already there). Its exceptions reach the caller unchanged."""

    @functools.wraps(function)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        if getattr(_on_worker, "active", False):
            return function(*args, **kwargs)
        return _sampler_worker().submit(function, *args, **kwargs).result()

    return run
