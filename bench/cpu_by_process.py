"""Where a command's CPU time goes: its processes' CPU seconds by kind, beside its wall time.

    .venv/bin/python -m bench.cpu_by_process -- .venv/bin/python -m pytest tests/browser/test_embed.py

Runs the command and, every SAMPLE_S until it ends, reads the CPU time (user + system) of every
process descended from it from /proc; a process's last reading is its total, so one that ends
between two readings loses at most SAMPLE_S of its time. Kinds come from each process's command
line: the app's servers (`streamlit run`), Chromium's renderers, browser and GPU processes (from
its `--type=`), pytest, Playwright's driver, PostgreSQL, Jupyter kernels; anything else by its
program's name. The table goes to stdout; the command's own output passes through. Linux only.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

SAMPLE_S = 0.5
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Reading:
    parent: int
    started: int  # clock ticks after boot: with the pid, names one process even if its pid is reused
    cpu_s: float


def kind(command: str) -> str:
    """The kind of process a command line belongs to (see the module's docstring)."""
    if "streamlit" in command:
        return "app server"
    if "chrom" in command:
        found = re.search(r"--type=([a-z-]+)", command)
        return f"chromium {found.group(1) if found else 'browser'}"
    if "pytest" in command:
        return "pytest"
    if "playwright" in command:
        return "playwright driver"
    if "postgres" in command:
        return "postgresql"
    if "ipykernel" in command or "jupyter" in command:
        return "jupyter"
    return Path(command.split(" ", 1)[0]).name or "other"


def read(pid: int) -> tuple[Reading, str] | None:
    """A process's parent, start and CPU time so far, and its command line (empty once it has
    ended and waits to be reaped); None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the program's name, which may hold spaces
    return Reading(int(fields[1]), int(fields[19]), (int(fields[11]) + int(fields[12])) / TICKS), command.strip()


def descendants(root: int, readings: dict[int, Reading]) -> set[int]:
    """The processes under `root` (itself included), from their parents."""
    children: dict[int, list[int]] = {}
    for pid, reading in readings.items():
        children.setdefault(reading.parent, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def cpu_by_kind(command: list[str]) -> tuple[Counter, float, int]:
    """Run `command`; its processes' CPU seconds by kind, its wall seconds and its exit code."""
    started = time.perf_counter()
    process = subprocess.Popen(command)
    last: dict[tuple[int, int], float] = {}  # (pid, start): CPU seconds at the latest reading
    kinds: dict[tuple[int, int], str] = {}  # from the latest command line (empty once ended; a fork execs)
    while True:
        readings, commands = {}, {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (found := read(int(entry))) is not None:
                readings[int(entry)], commands[int(entry)] = found
        for pid in descendants(process.pid, readings):
            if pid in readings:
                process_id = (pid, readings[pid].started)
                last[process_id] = readings[pid].cpu_s
                if commands[pid]:
                    kinds[process_id] = kind(commands[pid])
        if process.poll() is not None:
            break
        time.sleep(SAMPLE_S)
    totals: Counter = Counter()
    for process_id, cpu_s in last.items():
        totals[kinds.get(process_id, "other")] += cpu_s
    return totals, time.perf_counter() - started, process.returncode


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[1:] if argv[:1] == ["--"] else argv
    if not command:
        print("usage: python -m bench.cpu_by_process -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    totals, wall_s, code = cpu_by_kind(command)
    print(f"\n{'process kind':<22} {'CPU s':>8}")
    for name, cpu_s in totals.most_common():
        if cpu_s >= 0.05:
            print(f"{name:<22} {cpu_s:>8.1f}")
    print(f"{'all':<22} {sum(totals.values()):>8.1f}  over {wall_s:.1f} s of wall time on {os.cpu_count()} CPUs "
          f"(exit code {code})")
    return code


if __name__ == "__main__":
    sys.exit(main())
