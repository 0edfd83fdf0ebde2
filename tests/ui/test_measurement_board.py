"""The KV page's measurements are taken once per server, one at a time, and say when."""

from __future__ import annotations

import threading
import time

import pytest

from ui.controllers.kv_speed import cached_trend
from ui.server.measurement_board import REFRESH_AFTER_S, MeasurementBoard


def test_thirty_visitors_asking_at_once_share_one_measurement() -> None:
    board, calls, start = MeasurementBoard(), [], threading.Barrier(30)

    def measure() -> str:
        calls.append(1)
        time.sleep(0.05)
        return "figures"

    results = []

    def visitor() -> None:
        start.wait()
        results.append(board.get(("model", "cpu", "quick", "cache"), measure))

    threads = [threading.Thread(target=visitor) for _ in range(30)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert len(results) == 30 and all(r is results[0] for r in results) and results[0].value == "figures"


def test_one_measurement_runs_at_a_time_and_the_others_queue() -> None:
    board, running, most = MeasurementBoard(), [0], [0]
    lock = threading.Lock()

    def measure() -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1
        return 1

    threads = [threading.Thread(target=board.get, args=(("m", what), measure)) for what in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most[0] == 1 and all(board.kept(("m", what)) is not None for what in range(8))


def test_a_result_says_when_it_was_taken_and_how_busy_the_server_was() -> None:
    served = iter([100, 142])
    board = MeasurementBoard(clock=lambda: 1_000.0)
    result = board.get("k", lambda: 7, served=lambda: next(served))
    assert (result.value, result.taken_at, result.other_tokens) == (7, 1_000.0, 42) and result.seconds >= 0


def test_measure_again_re_measures_once_and_not_results_just_taken() -> None:
    now = [0.0]
    board, calls = MeasurementBoard(clock=lambda: now[0]), []
    board.get(("bundled", "cpu", "a"), lambda: calls.append(1) or len(calls))
    board.get(("other", "cpu", "a"), lambda: 0)
    assert board.refresh(lambda key: key[0] == "bundled") == 0  # just taken: thirty clicks change nothing
    now[0] = REFRESH_AFTER_S
    assert board.refresh(lambda key: key[0] == "bundled") == 1
    assert board.refresh(lambda key: key[0] == "bundled") == 0
    assert board.get(("bundled", "cpu", "a"), lambda: calls.append(1) or len(calls)).value == 2
    assert board.kept(("other", "cpu", "a")) is not None  # another model's results stay


def test_the_board_keeps_only_its_latest_results() -> None:
    board = MeasurementBoard(max_kept=3)
    for key in range(5):
        board.get(key, lambda key=key: key * 10)
    assert [board.kept(key) is not None for key in range(5)] == [False, False, True, True, True]
    assert board.get(0, lambda: 99).value == 99  # dropped: measured again when asked


def test_a_failed_measurement_is_not_kept_and_frees_the_queue() -> None:
    board = MeasurementBoard()

    def broken() -> int:
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError):
        board.get("k", broken)
    assert board.kept("k") is None and not board.busy
    assert board.get("k", lambda: 3).value == 3


@pytest.mark.parametrize(("first", "last", "words"), [
    (40.0, 60.0, "grew from 40.0 to 60.0 ms"),
    (53.6, 52.0, "stayed at about 54 ms"),
    (53.6, 42.4, "measured 53.6 ms, then 42.4 ms"),
])
def test_the_cached_steps_sentence_never_contradicts_its_numbers(first, last, words) -> None:
    said = cached_trend(first, last)
    assert words in said and ("went from" not in said)
