"""The sampler runs on its own one-CPU-thread worker: the same digits however it is called,
and no caller's thread count (nor the count later threads begin with) is ever changed."""

from __future__ import annotations

import threading

import pytest
import torch

from engine import Generation, LoadedModel, SamplerSettings, SettingsError
from engine.cpu_threads import on_sampler_thread
from tests.threads import threads


@on_sampler_thread
def _threads_here() -> int:
    return torch.get_num_threads()


@on_sampler_thread
def _fail() -> None:
    raise SettingsError("top_p", 2.0, "a number from 0 to 1")


def _in_a_new_thread(work) -> object:
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(work()))
    thread.start()
    thread.join(30)
    return result[0]


def test_sampler_work_runs_on_one_thread_and_the_callers_count_stays() -> None:
    before = torch.get_num_threads()
    assert _threads_here() == 1
    assert torch.get_num_threads() == before
    assert _in_a_new_thread(torch.get_num_threads) == before  # what threads started later begin with


def test_an_error_on_the_sampler_thread_reaches_the_caller_unchanged() -> None:
    with pytest.raises(SettingsError, match="top_p"):
        _fail()


def test_two_visitors_sampling_at_once_leave_every_thread_as_it_was(lm: LoadedModel) -> None:
    """Two threads (two visitors' script runs) step and re-sample concurrently; afterwards
    each still has its own count, and a thread started later begins with the default."""
    default = torch.get_num_threads()
    seen: dict[str, int] = {}
    barrier = threading.Barrier(2)

    def visitor(name: str, seed: int) -> None:
        gen = Generation(lm, "Once upon a time", sampler=SamplerSettings(temperature=0.9, top_p=0.9), seed=seed)
        barrier.wait(10)
        for _ in range(3):
            gen.step()
            gen.resample(SamplerSettings(temperature=1.4, top_k=20))
        seen[name] = torch.get_num_threads()

    visitors = [threading.Thread(target=visitor, args=(name, seed)) for name, seed in (("a", 1), ("b", 2))]
    for thread in visitors:
        thread.start()
    for thread in visitors:
        thread.join(120)
    assert seen == {"a": default, "b": default}
    assert torch.get_num_threads() == default
    assert _in_a_new_thread(torch.get_num_threads) == default


def test_a_decision_has_the_same_last_digits_whatever_the_callers_thread_count(lm: LoadedModel) -> None:
    """A sum over the vocabulary splits by thread count; on two threads the draw's CDF band
    here came out one bit off the one-thread value the step itself records."""
    gen = Generation(lm, "Once upon a time", seed=11)
    gen.step()
    gen.step()
    decisions = []
    for count in (2, 1):
        with threads(count):
            decisions.append(gen.resample(SamplerSettings(temperature=1.0)).decision)
    assert decisions[0] == decisions[1] == gen.steps[-1].decision


def test_the_sampler_worker_starts_no_threads_of_its_own_beside_itself() -> None:
    """An OpenMP team of the worker's own (left by a first op split across two threads) made every
    forward pass on the visitors' threads half as slow again while it lived; the worker is one
    thread, and its ops never start others. A fresh interpreter: this one's worker exists already."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "import os, torch\n"
        "torch.ones(2 ** 16).add_(1)\n"  # the main thread's own team, before counting
        "before = len(os.listdir('/proc/self/task'))\n"
        "from engine.cpu_threads import on_sampler_thread\n"
        "on_sampler_thread(lambda: torch.ones(2 ** 16).softmax(-1))()\n"
        "print(len(os.listdir('/proc/self/task')) - before)\n")
    if not Path("/proc/self/task").is_dir():
        pytest.skip("no /proc to count threads in")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip()) == 1
