"""bench/cpu_by_process.py: the kinds of process it names, and the CPU time of a process two
levels down the command it runs, counted under that process's kind."""

from __future__ import annotations

import sys
from pathlib import Path

from bench.cpu_by_process import cpu_by_kind, kind

SPIN = "import time\nend = time.process_time() + 1.2\nwhile time.process_time() < end: pass"


def test_each_kind_of_process_is_named_from_its_command_line() -> None:
    assert kind("/x/python -m streamlit run app.py --server.port 1") == "app server"
    assert kind("/usr/lib/chromium/chromium --type=renderer --lang=en") == "chromium renderer"
    assert kind("/usr/lib/chromium/chromium --type=gpu-process") == "chromium gpu-process"
    assert kind("/usr/lib/chromium/chromium --headless --no-sandbox") == "chromium browser"
    assert kind("/x/python -m pytest tests/browser") == "pytest"
    assert kind("/usr/lib/postgresql/15/bin/postgres -D /tmp/db") == "postgresql"
    assert kind("/usr/bin/g++ -O3 kernel.cpp") == "g++"


def test_a_grandchilds_cpu_time_is_counted_under_its_kind() -> None:
    parent = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {SPIN!r}], check=True)"
    totals, wall_s, code = cpu_by_kind([sys.executable, "-c", parent])
    assert code == 0 and wall_s >= 1.2
    assert totals[Path(sys.executable).name] >= 0.6  # the grandchild, last read at most SAMPLE_S before its end
