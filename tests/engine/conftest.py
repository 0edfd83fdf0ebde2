"""Fixtures for tests whose subject depends on this machine's matrix kernels: the exact packed
passes copy the order in which this CPU's 1-row product adds up, and use a path only where a
probe shows it gives the lone digits. A test of such a path runs where the path is in use; the
test of the probe's verdict runs everywhere."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine.fast import lone_rows_linear, set_aside
from engine.serving.packed import scripted_prefill

ROOT = Path(__file__).resolve().parents[2]


def meeting_sizes(multiply, inputs: int) -> list[list[int]]:
    """For every pair of inputs i, j: how many products were summed when i's and j's met. One huge
    value at i, its negative at j, ones elsewhere: a one added before the two meet is lost in the
    huge value, one added after survives, so the sum counts the ones added after they met."""
    huge = 2.0 ** 40
    sizes = []
    for i in range(inputs):
        weight = torch.ones(inputs, inputs)
        weight[:, i] = huge
        weight[torch.arange(inputs), torch.arange(inputs)] = -huge
        weight[i, i] = huge  # row i: no pair (its own count is meaningless)
        sums = multiply(torch.ones(1, inputs), weight)[0]
        sizes.append([inputs - round(v) if j != i else 1 for j, v in enumerate(sums.tolist())])
    return sizes


@pytest.fixture()
def cli_on_lm(lm, monkeypatch) -> None:
    """`engine.cli.main` called in this process takes the session's bundled model (`lm`) for the
    bundled source instead of loading a copy of its own each call; any other source loads as
    the command line loads it. `python -m engine` itself, with its own load, is run in a fresh
    interpreter by test_cli_prints_a_step_table_and_writes_the_trace."""
    from engine import cli

    load = cli.load_model
    monkeypatch.setattr(cli, "load_model", lambda source=None, **options: lm if source is None else load(source,
                                                                                                        **options))


@pytest.fixture(scope="session")
def lone_order() -> None:
    """Skips a test where this machine's 1-row product (MKL's sgemv) adds up in another order
    than the kernel's four lanes: there the probe keeps the kernel out of every pass
    (test_the_kernel_is_used_exactly_where_it_sums_as_this_machines_one_row_product)."""
    if meeting_sizes(F.linear, 32) != meeting_sizes(lone_rows_linear, 32):
        pytest.skip("this CPU's 1-row product sums in another order than the kernel's four lanes")


@pytest.fixture(scope="session")
def stacked_prompts() -> None:
    """Skips a test where some row of a lone prompt's product has digits that no product of the
    stacked prompts' pass reproduces on this machine: there prompts are read one pass each
    (test_where_a_row_fits_no_kind_prompts_are_read_one_pass_each_with_lone_numbers)."""
    from tests.engine.test_scheduler import tiny_llama

    if scripted_prefill(tiny_llama()) is None:
        pytest.skip("this CPU's products give some prompt rows digits the stacked pass cannot reproduce")


@pytest.fixture
def forget_proofs() -> Iterator[Callable[..., None]]:
    """`forget_proofs(*paths)`: those paths' decisions forgotten in the registry of proofs until
    the test ends (their probes run again), and the ones from before put back after it."""
    with ExitStack() as stack:
        yield lambda *paths: stack.enter_context(set_aside(*paths))


def run_without_compiler(script: str, cache: Path) -> subprocess.CompletedProcess:
    """`script` in a fresh interpreter where no C++ compiler works and the kernels' cache folder is
    `cache` (empty), so every kernel's build fails as it would on a machine without one."""
    env = {**os.environ, "CXX": "/bin/false", "TOKEN_BY_TOKEN_CACHE": str(cache)}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="session")
def without_compiler_run(tmp_path_factory) -> subprocess.CompletedProcess:
    """The lens kernel's and the exact rows kernel's scripts (each test module's WITHOUT_COMPILER)
    in one interpreter without a compiler: one start of torch and transformers for both checks."""
    from tests.engine import test_exact_rows_kernel, test_lens_kernel

    script = test_lens_kernel.WITHOUT_COMPILER + test_exact_rows_kernel.WITHOUT_COMPILER
    return run_without_compiler(script, tmp_path_factory.mktemp("no_compiler"))
