"""The server's C allocator maps large blocks on their own (ui/server/allocator.py): a block of
a couple of megabytes is mapped, and given back when freed, even after a larger block was freed
(which moves glibc's own threshold above it)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")

MAPPED_AFTER_A_LARGER_FREE = """
import ctypes{imports}
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
large = bytearray(30 << 20)
del large  # glibc's own threshold follows it up to 30 MB
before = libc.mallinfo2().hblks
block = bytearray(2 << 20)
print(libc.mallinfo2().hblks - before)
"""


def blocks_mapped(imports: str, env: dict[str, str] | None = None) -> int:
    script = MAPPED_AFTER_A_LARGER_FREE.format(imports=imports)
    environ = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")} | (env or {})
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=environ)
    return int(done.stdout)


def test_the_app_maps_a_two_megabyte_block_after_a_larger_one_was_freed() -> None:
    assert blocks_mapped("") == 0  # glibc's own way: from the heap
    assert blocks_mapped("\nimport ui") == 1  # as app.py's process does


def test_an_explicit_setting_in_the_environment_is_left_alone() -> None:
    assert blocks_mapped("\nimport ui", {"MALLOC_MMAP_THRESHOLD_": str(8 << 20)}) == 0
