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

from engine import LoadedModel
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


def run_generate(lm: LoadedModel, prompt_ids: list[int], new_tokens: int, penalty: float = 1.0,
                 stops: tuple[str, ...] = (), **options) -> list[int]:
    """transformers' own greedy generate(): the new tokens, stopping at an end token or a stop
    string; `options` go to generate() as they are (an assistant model, prompt lookup)."""
    ids = torch.tensor([prompt_ids])
    if penalty != 1.0:
        options["repetition_penalty"] = penalty
    if stops:
        options.update(stop_strings=list(stops), tokenizer=lm.tokenizer)
    with torch.inference_mode():
        out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=new_tokens, **options)
    return out[0, len(prompt_ids):].tolist()


# (model, prompt, penalty, stop strings): (the model, the cap it ran with, the tokens it gave)
_GENERATED: dict[tuple, tuple[LoadedModel, int, list[int]]] = {}


def greedy_generate(lm: LoadedModel, prompt_ids: list[int], new_tokens: int, penalty: float = 1.0,
                    stops: tuple[str, ...] = ()) -> list[int]:
    """`run_generate` with no options, run once per session for each prompt, however many tests
    (of plain decoding and of every draft method) compare with it. Greedy decoding is
    deterministic, so a run with a larger cap begins with a smaller cap's tokens, and a run
    that ended before its cap (an end token, a stop string) is the whole answer for any cap."""
    key = (id(lm), tuple(prompt_ids), penalty, stops)
    kept = _GENERATED.get(key)
    if kept is None or not (new_tokens <= kept[1] or len(kept[2]) < kept[1]):
        kept = _GENERATED[key] = (lm, new_tokens, run_generate(lm, prompt_ids, new_tokens, penalty, stops))
    return kept[2][:new_tokens]


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
