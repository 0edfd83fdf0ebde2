"""The registry of proofs (engine/fast/proofs.py): every fast path's probe decides once per path,
model and thread count, with one lock and one log line, and `python -m engine proofs` prints the
decisions."""

from __future__ import annotations

import gc
import logging
import threading
import time

import pytest
import torch

from engine import cli
from engine.fast import LONE_PASS_ENV, lone_decision, proof_decisions, proven, refused
from engine.fast.proofs import ProofRegistry
from engine.forward import eager_step
from tests.engine.test_scheduler import tiny_llama
from tests.threads import threads


class Model:
    """A stand-in for a model: a proof about it lives as long as it does."""


def counted(verdict, calls: list[int]):
    def probe():
        calls.append(1)
        return verdict
    return probe


def test_a_decision_is_made_once_per_path_key_model_and_thread_count() -> None:
    registry, calls, model = ProofRegistry(), [], Model()
    probe = counted(proven("compared", "pass"), calls)
    with threads(1):
        first = registry.settle("lone", probe, owner=model, name="m")
        assert registry.settle("lone", probe, owner=model, name="m") is first
        registry.settle("lone", probe, owner=model, name="m", key="other")  # another key
        registry.settle("verify", probe, owner=model, name="m")  # another path
        registry.settle("lone", probe, owner=Model(), name="m")  # another model
    with threads(2):
        registry.settle("lone", probe, owner=model, name="m")  # another thread count
        registry.settle("build", probe, per_thread=False)
    with threads(1):
        registry.settle("build", probe, per_thread=False)  # decided once for every count
    assert len(calls) == 6
    assert first.value == "pass" and first.proof.proven and first.proof.threads == 1 and first.proof.model == "m"
    assert [p.threads for p in registry.decisions() if p.path == "build"] == [None]


def test_a_proof_about_a_model_goes_with_the_model() -> None:
    registry, model = ProofRegistry(), Model()
    registry.settle("lone", lambda: refused("no kernel"), owner=model, name="m")
    registry.settle("build", lambda: proven("built"))
    assert [p.path for p in registry.decisions()] == ["lone", "build"]
    del model
    gc.collect()
    assert [p.path for p in registry.decisions()] == ["build"]


def test_threads_asking_at_once_share_one_probe() -> None:
    registry, calls, model = ProofRegistry(), [], Model()

    def slow() -> object:
        calls.append(1)
        time.sleep(0.05)
        return proven("compared", object())

    values = []
    workers = [threading.Thread(target=lambda: values.append(registry.settle("lone", slow, owner=model,
                                                                             per_thread=False).value))
               for _ in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(calls) == 1 and len(values) == 8 and all(value is values[0] for value in values)


def test_each_decision_is_logged_once_in_one_format_with_why_not(caplog) -> None:
    registry, model = ProofRegistry(), Model()
    with caplog.at_level(logging.INFO, logger="engine.fast.proofs"), threads(2):
        for _ in range(3):
            registry.settle("lone decode step", lambda: refused("the model runs on cuda"), owner=model, name="m")
        registry.settle("exact rows kernel", lambda: refused("it could not be built", warn=True), per_thread=False)
        registry.settle("lens kernel", lambda: proven("close to float64"), per_thread=False)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "fast path 'lone decode step' for m at 2 threads: not proven (the model runs on cuda)"),
        (logging.WARNING, "fast path 'exact rows kernel' for this machine at any threads: not proven "
                          "(it could not be built)"),
        (logging.INFO, "fast path 'lens kernel' for this machine at any threads: proven (close to float64)")]
    why = {p.path: (p.proven, p.why) for p in registry.decisions()}
    assert why["lone decode step"] == (False, "the model runs on cuda")


def test_a_probe_that_raises_is_not_kept_and_one_that_asks_for_itself_is_stopped() -> None:
    registry, calls = ProofRegistry(), []

    def failing() -> object:
        calls.append(1)
        raise OSError("disk")

    for _ in range(2):
        with pytest.raises(OSError):
            registry.settle("build", failing)
    assert len(calls) == 2 and registry.decisions() == []

    def circular() -> object:
        return registry.settle("loop", circular)

    with pytest.raises(RuntimeError, match="its own decision"):
        registry.settle("loop", circular)


def test_set_aside_forgets_a_path_inside_the_block_and_puts_it_back_after() -> None:
    registry, calls = ProofRegistry(), []
    before = registry.settle("kernel", counted(proven("agrees", True), calls))
    with registry.set_aside("kernel"):
        assert registry.settle("kernel", counted(refused("differs", False), calls)).value is False
    assert registry.settle("kernel", counted(refused("never asked"), calls)) is before
    assert len(calls) == 2


def test_the_lone_pass_decision_is_the_registrys_proof() -> None:
    """A migrated probe: the lone pass's decision is read from the registry, reason and all."""
    tiny = tiny_llama()
    decision = lone_decision(tiny, eager_step)
    mine = [p for p in proof_decisions() if p.path == "lone decode step" and p.model == tiny.name]
    assert mine and (mine[-1].proven, mine[-1].threads, mine[-1].why) == (decision.fast, decision.threads,
                                                                         decision.reason)


def test_the_environment_refusal_names_the_variable_in_the_registry(monkeypatch) -> None:
    monkeypatch.setenv(LONE_PASS_ENV, "eager")
    tiny = tiny_llama()
    decision = lone_decision(tiny, eager_step)
    assert not decision.fast and LONE_PASS_ENV in decision.reason


def test_the_proofs_verb_probes_the_model_and_prints_a_table(monkeypatch, capsys, tiny_lm) -> None:
    monkeypatch.setattr(cli, "load_model", lambda source=None: tiny_lm)
    with threads(torch.get_num_threads()):  # the verb sets the count: put back after
        assert cli.main(["proofs", "--threads", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    header = next(line for line in out if line.startswith("path"))
    assert header.split() == ["path", "model", "threads", "proven", "why"]
    rows = {line.split("  ")[0] for line in out[out.index(header) + 1:]}
    for path in ("lone decode step", "verify pass", "packed decode steps, exact", "packed decode steps, fast",
                 "packed prompts", "exact rows kernel"):
        assert path in rows, path
    # other tests in the process may have decided the same path at other thread counts: one line is at 1
    lone = [line for line in out if line.startswith("lone decode step") and tiny_lm.name in line]
    assert any(" 1 " in line and (" yes " in line or " no " in line) for line in lone), lone


def test_the_proofs_verb_refuses_a_thread_count_below_one(capsys) -> None:
    assert cli.main(["proofs", "--threads", "0"]) == 2
    assert "--threads" in capsys.readouterr().err
