"""The server's C allocator, set once per process (glibc's malloc; elsewhere nothing is done).

A class lesson's server grew by far more than the lesson's own data (docs/class.md, "A
lesson-long soak"). Three of glibc's defaults caused it:

- Every block below the mmap threshold comes from a heap, and that threshold follows the
  largest block freed so far, up to 32 MB, which the model's loading reaches at once. From then
  on a room's large short-lived blocks (the trace saved at each Step, a decode cache moved to a
  bigger block) came from the heap, each a little larger than the last, and the heap kept the
  holes they left. Blocks of a megabyte and more are now mapped on their own and given back
  when freed.
- A low trim threshold hands the heap's top back and takes it again on every decode step,
  which cost steps when the mmap threshold alone was fixed (fixing one fixes the other at its
  default). A high one keeps the top.
- Each thread may get its own heap, up to eight per core, and Streamlit runs every rerun on a
  new thread: sixty students' reruns spread over sixteen heaps, each keeping the free top its
  busiest moment left (glibc trims a thread's heap only above the trim threshold, and
  `malloc_trim` never trims it). Two heaps share that space; the server's Python threads take
  turns on the interpreter anyway, so they seldom wait for a heap. glibc reads
  MALLOC_ARENA_MAX when the process starts, which `make run`, the Dockerfile and the benchmarks'
  servers set; the setting here holds for a process started otherwise only from the app's first
  import on, so the threads that had a heap by then keep theirs (six heaps in a class's server).

`bench.class_soak` and `bench.room_memory` measure the effect; docs/class.md has the figures.
"""

from __future__ import annotations

import ctypes
import os
import platform
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    """One of glibc's `mallopt` parameters, and the environment variable that sets it at start."""

    parameter: int  # glibc's M_* number
    value: int
    env: str  # an explicit setting in the environment wins


SETTINGS = (
    Setting(-3, 1 << 20, "MALLOC_MMAP_THRESHOLD_"),  # M_MMAP_THRESHOLD: blocks this large are mapped on their own
    Setting(-1, 64 << 20, "MALLOC_TRIM_THRESHOLD_"),  # M_TRIM_THRESHOLD: free heap top kept rather than handed back
    Setting(-8, 2, "MALLOC_ARENA_MAX"),  # M_ARENA_MAX: heaps the threads share
)


def settle_allocator() -> list[str]:
    """Set glibc's parameters as above, each unless the environment sets it; returns the
    environment names of those set (none where the C library is not glibc).

    Called once, early: glibc fixes its number of heaps when a ninth thread first needs one."""
    if platform.libc_ver()[0] != "glibc":
        return []
    mallopt = ctypes.CDLL(None).mallopt
    return [s.env for s in SETTINGS if s.env not in os.environ and mallopt(s.parameter, s.value) == 1]
