"""The server's C allocator, set once per process (glibc's malloc; elsewhere nothing is done).

A class lesson's server grew by far more than the lesson's own data (docs/class.md, "A
lesson-long soak"): glibc serves every block below its mmap threshold from its heap, and that
threshold follows the largest block freed so far, up to 32 MB, which the model's loading
reaches at once. From then on a room's large short-lived blocks (the trace saved at each Step,
megabytes long late in a lesson; a decode cache moved to a bigger block) came from the heap,
each a little larger than the last, and the heap kept the holes they left. Blocks of a
megabyte and more are mapped on their own and given back when freed; a high trim threshold
keeps the heap's top from being handed back and taken again on every step, which is what made
a lower fixed threshold cost decode steps before (bench.room_memory and the step timings in
docs/benchmarks.md).
"""

from __future__ import annotations

import ctypes
import os
import platform

MMAP_THRESHOLD = 1 << 20  # bytes: blocks this large are mapped on their own
TRIM_THRESHOLD = 64 << 20  # bytes of free heap top kept rather than handed back
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
ENV_SET = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")  # glibc's own: an explicit setting wins


def settle_allocator() -> bool:
    """Fix glibc's thresholds as above; returns whether they were set (False: not glibc, or the
    environment already sets them)."""
    if platform.libc_ver()[0] != "glibc" or any(name in os.environ for name in ENV_SET):
        return False
    mallopt = ctypes.CDLL(None).mallopt
    return bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
