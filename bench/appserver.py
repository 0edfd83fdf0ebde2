"""Serve the real app with `streamlit run` and find a headless Chromium to drive it: shared by
the UI benchmark (bench/ui_bench.py) and the browser tests (tests/browser/conftest.py).
No pytest here, so the benchmark runs without it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# as `make run` starts the server: OpenMP threads that sleep between parallel regions, two malloc heaps
SERVER_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "MALLOC_ARENA_MAX": "2"}
START_TIMEOUT_S = 120  # a first start loads the model, slower from a cold GGUF cache (docs/benchmarks.md)


def chromium_path() -> str | None:
    """A system Chromium (Debian's is /usr/bin/chromium); CHROMIUM_PATH overrides."""
    for candidate in (os.environ.get("CHROMIUM_PATH"), "chromium", "chromium-browser", "google-chrome"):
        if candidate and (found := shutil.which(candidate)):
            return found
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, process: subprocess.Popen, timeout: float = START_TIMEOUT_S) -> None:
    """Return once the server answers its health check; raise if it exits or never answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"streamlit exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"streamlit did not answer at {url} within {timeout} s")


@contextmanager
def served_app(log: Path | None = None, *flags: str) -> Iterator[str]:
    """A fresh `streamlit run app.py` on a free local port, yielding its URL; stopped on exit.
    Its output goes to `log` (or nowhere); `flags` are more `streamlit run` options."""
    with served_app_process(log, *flags) as (url, _pid):
        yield url


@contextmanager
def served_app_process(log: Path | None = None, *flags: str, env: dict[str, str] | None = None,
                       port: int | None = None) -> Iterator[tuple[str, int]]:
    """As served_app, yielding the URL and the server's process id (to read its memory).
    The server's environment is `make run`'s (SERVER_ENV) where this one does not set it;
    `env` adds to (or overrides) the environment; `port` (a restarted server's, say) instead of
    a free one."""
    port = port or free_port()
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
    output = open(log, "w") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.port", str(port),
         "--server.headless", "true", "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
         *flags],
        cwd=ROOT, stdout=output, stderr=subprocess.STDOUT,
        env=SERVER_ENV | os.environ | (env or {}))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process)
        yield url, process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)
        if log is not None:
            output.close()
