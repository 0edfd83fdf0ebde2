"""Run the sampler's small tensor work on one CPU thread.

The sampler works on one vocabulary-sized vector (49,152 floats for SmolLM2). That is just
over torch's parallel grain size, so every element-wise op splits across the intra-op
threads, and each split waits for all its threads. When another process holds a core (the
browser drawing the chart, on a 2-core machine) that wait is a whole scheduler slice:
re-sampling measured 7.5 ms median and 129 ms worst with two threads against 2.7 ms and
3.0 ms with one (`python -m bench.engine_bench` machine, one busy process beside it). The
forward pass keeps every thread: its matrix products do gain from them.

The count is shared: with torch's OpenMP build, a count set on any thread holds for every
thread the program started (Streamlit runs each visitor's script on one). So concurrent callers
share it: the first to enter lowers it, the last to leave restores it, and a forward pass that
overlaps someone's sampling runs on one thread for that while (slower, never different).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_lock = threading.Lock()
_depth = 0  # how many callers are inside one_cpu_thread() right now
_restore_to = 1


@contextmanager
def one_cpu_thread() -> Iterator[None]:
    """Inside, torch's CPU ops run on one thread; the previous count comes back after."""
    global _depth, _restore_to
    with _lock:
        if _depth == 0:
            _restore_to = torch.get_num_threads()
        _depth += 1
        torch.set_num_threads(1)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                torch.set_num_threads(_restore_to)
