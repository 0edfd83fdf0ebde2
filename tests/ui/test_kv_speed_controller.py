"""The KV cache & speed page's controller, on a plain dict: measured once per server and kept for
the visitor, Measure more and Measure again, and the tables the page lays out."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

from engine.speed import KNOWN_CONFIGS, MORE, QUICK
from ui.controllers import kv_speed as kv
from ui.server.measurement_board import MeasurementBoard
from ui.session.keys import KV
from ui.views.format import nbytes

LM = SimpleNamespace(name="tiny", device="cpu", context_window=2048)


class Clock:
    now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def take(state: dict, board: MeasurementBoard, calls: list, waits: list, what: str = "cache") -> str:
    def run() -> str:
        calls.append(what)
        return f"{what} figures"

    def waiting(text: str) -> contextlib.AbstractContextManager:
        waits.append(text)
        return contextlib.nullcontext()

    return kv.measured(state, LM, what, run, board, lambda: 0, waiting)


def test_a_measurement_is_taken_once_for_the_server_and_kept_for_the_visitor() -> None:
    board, calls, waits = MeasurementBoard(), [], []
    first, second = {}, {}
    assert take(first, board, calls, waits) == "cache figures"
    assert take(second, board, calls, waits) == "cache figures"  # another visitor: the server's result
    assert calls == ["cache"] and len(waits) == 1 and "once for everyone on this server" in waits[0]
    assert list(first[KV.taken]) == [("tiny", "cpu", "quick", "cache")]


def test_measure_more_switches_the_sizes_and_the_key() -> None:
    state: dict = {}
    assert kv.tier(state) == "quick" and kv.sizes(state, LM) == QUICK.fitted(LM.context_window)
    kv.measure_more(state)
    assert kv.tier(state) == "more" and kv.sizes(state, LM) == MORE.fitted(LM.context_window)
    board, calls, waits = MeasurementBoard(), [], []
    take(state, board, calls, waits)
    assert ("tiny", "cpu", "more", "cache") in state[KV.taken]


def test_measure_again_re_measures_old_results_and_drops_the_visitors_own() -> None:
    clock = Clock()
    board, calls, waits, state = MeasurementBoard(clock=clock), [], [], {}
    take(state, board, calls, waits)
    clock.now += 3600
    kv.measure_again(state, board, LM)
    assert KV.taken not in state and KV.results not in state
    take(state, board, calls, waits)
    assert calls == ["cache", "cache"]


def test_provenance_says_when_and_how_busy() -> None:
    assert kv.provenance({}) is None
    board = MeasurementBoard(clock=lambda: 0.0)
    quiet = board.get("a", lambda: 1)
    assert kv.provenance({"a": quiet}).startswith("Measured once for everyone on this server at 00:00 UTC")
    busy = board.get("b", lambda: 1, served=iter([0, 12]).__next__)
    assert "the server made 12 tokens for visitors" in kv.provenance({"a": quiet, "b": busy})


def test_the_kv_table_has_the_loaded_model_first_then_the_published_configs() -> None:
    rows = [kv.KVRow("here", KNOWN_CONFIGS[0], 1024), *(kv.KVRow(c.name, c, c.bytes_per_position)
                                                        for c in KNOWN_CONFIGS)]
    table = kv.kv_table(rows, 4096)
    assert list(table["model"]) == ["here", *(c.name for c in KNOWN_CONFIGS)]
    assert table["4,096 positions"][0] == nbytes(4096 * 1024) and table["per position"][0] == nbytes(1024)
    assert kv.kv_sizes(rows, 2)[0] == (f"here ({KNOWN_CONFIGS[0].dtype})", 2048)


def test_the_batch_saving_never_claims_a_saving_the_numbers_do_not_show() -> None:
    assert kv.batch_saving(20.0, 5.0) == "4.0× less"
    assert kv.batch_saving(5.0, 6.0).startswith("no saving this time")


def test_the_fast_path_table_lists_this_models_and_the_machines_decisions_with_why() -> None:
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from engine import Proof
    from engine.fast import MACHINE

    now = datetime.now(UTC)
    proofs = [Proof("lone decode step", "SmolLM2", 2, True, "logits and cache torch.equal", now),
              Proof("exact rows kernel", MACHINE, None, False, "no C++ compiler", now),
              Proof("lone decode step", "another model", 2, True, "", now)]
    table = kv.proof_table(SimpleNamespace(name="SmolLM2"), proofs)
    assert table.to_dict("records") == [
        {"fast path": "lone decode step", "for": "SmolLM2", "threads": "2", "proven": "yes",
         "why": "logits and cache torch.equal"},
        {"fast path": "exact rows kernel", "for": MACHINE, "threads": "any", "proven": "no", "why": "no C++ compiler"}]
