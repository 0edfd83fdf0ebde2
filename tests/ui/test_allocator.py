"""The server's C allocator (ui/server/allocator.py): a block of a couple of megabytes is mapped
on its own, and given back when freed, even after a larger block was freed (which moves glibc's
own threshold above it); and many threads share two heaps instead of one each."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import tempfile

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


# Threads that each allocate (a bytearray this large comes from malloc, not Python's own
# allocator) and are all alive when glibc lists its heaps.
HEAPS_OF_THREADS = """
import ctypes, sys, threading{imports}
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
allocated, listed = threading.Barrier(7), threading.Event()
def work():
    block = bytearray(64 << 10)
    allocated.wait()
    listed.wait()
threads = [threading.Thread(target=work) for _ in range(6)]
for thread in threads:
    thread.start()
allocated.wait()
report = libc.fopen(sys.argv[1].encode(), b"w")
libc.malloc_info(0, report)
libc.fclose(report)
listed.set()
"""


def python_with(script: str, env: dict[str, str] | None, *args: str) -> str:
    environ = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")} | (env or {})
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, check=True,
                          env=environ).stdout


def blocks_mapped(imports: str, env: dict[str, str] | None = None) -> int:
    return int(python_with(MAPPED_AFTER_A_LARGER_FREE.format(imports=imports), env))


def heaps_of_six_threads(imports: str, env: dict[str, str] | None = None) -> int:
    """How many heaps glibc lists while six threads each hold a block."""
    with tempfile.TemporaryDirectory() as folder:
        report = os.path.join(folder, "malloc_info.xml")
        python_with(HEAPS_OF_THREADS.format(imports=imports), env, report)
        with open(report) as listing:
            return len(re.findall(r'<heap nr="', listing.read()))


def test_the_app_maps_a_two_megabyte_block_after_a_larger_one_was_freed() -> None:
    assert blocks_mapped("") == 0  # glibc's own way: from the heap
    assert blocks_mapped("\nimport ui") == 1  # as app.py's process does


def test_an_explicit_setting_in_the_environment_is_left_alone() -> None:
    assert blocks_mapped("\nimport ui", {"MALLOC_MMAP_THRESHOLD_": str(8 << 20)}) == 0


def test_the_apps_threads_share_two_heaps() -> None:
    assert heaps_of_six_threads("") >= 7  # glibc's own way: a heap per thread, and the main one
    assert heaps_of_six_threads("\nimport ui") == 2
    assert heaps_of_six_threads("\nimport ui", {"MALLOC_ARENA_MAX": "4"}) == 4
