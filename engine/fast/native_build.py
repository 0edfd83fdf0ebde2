"""A C++ op library built with this machine's compiler on first use and kept in the cache folder
(engine/loading.py's `cache_root`), for the kernels in this package.

Why one place: a build's name must change with its source, its flags, torch's version and this
CPU (built with -march=native, a build must never load on a CPU that lacks its instructions),
and a build killed part-way leaves a lock behind that every later start would wait on.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import torch

from engine.loading import cache_root

STALE_LOCK_S = 300  # a build's lock file older than this was left by a build that died


def build_library(source: Path, flags: list[str], prefix: str) -> None:
    """Compiles `source` and loads it (its ops register themselves); raises where it cannot."""
    from torch.utils import cpp_extension  # imports setuptools: only when building

    name = build_name(source, flags, prefix)
    folder = cache_root() / "kernels" / name
    folder.mkdir(parents=True, exist_ok=True)
    clear_stale_lock(folder)
    cpp_extension.load(name=name, sources=[str(source)], extra_cflags=flags, extra_ldflags=["-fopenmp"],
                       build_directory=str(folder), is_python_module=False, verbose=False)


def first_line(error: Exception) -> str:
    """An exception's first line, for a warning in the log (a compiler's output runs to pages)."""
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def clear_stale_lock(folder: Path) -> None:
    """torch waits for as long as a build's lock file exists; a build killed part-way leaves one
    behind, and every later start would wait for ever. A build takes seconds: an old lock is stale."""
    lock = folder / "lock"
    try:
        if time.time() - lock.stat().st_mtime > STALE_LOCK_S:
            lock.unlink()
    except OSError:  # no lock (the usual case), or another process removed it first
        pass


def build_name(source: Path, flags: list[str], prefix: str) -> str:
    """`prefix` and a digest of the source, the flags, torch's version and this CPU's flags."""
    key = " ".join([*flags, torch.__version__, _cpu_flags()])
    digest = hashlib.sha256(source.read_bytes() + key.encode())
    return f"{prefix}_{digest.hexdigest()[:12]}"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return os.uname().machine
