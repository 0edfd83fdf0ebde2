"""Idle tabs: their generations are put away after the deployment's idle time, never sooner,
and never one that a visitor touched since."""

from __future__ import annotations

import gc
import threading

import pytest

from engine import Generation, LoadedModel, StopSettings
from engine.errors import SettingsError
from engine.serving.deployment import deployment_from_env
from engine.serving.idle import IdleReleaser


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def clock() -> Clock:
    return Clock()


def generation(lm: LoadedModel, steps: int = 3) -> Generation:
    gen = Generation(lm, "Hello there", seed=1, stop=StopSettings(max_new_tokens=20, ignore_eos=True))
    for _ in range(steps):
        gen.step()
    return gen


def test_a_generation_idle_past_the_limit_is_closed_and_keeps_its_records(tiny_lm, clock) -> None:
    releaser = IdleReleaser(600, clock=clock, check_every_s=None)
    gen = generation(tiny_lm)
    records = gen.steps
    releaser.touch(gen)
    clock.now += 599
    assert releaser.sweep() == 0 and not gen.closed
    clock.now += 1
    assert releaser.sweep() == 1 and gen.closed
    assert gen.steps == records  # the page can still show them
    assert gen.kv.positions == 0  # the cache is gone
    assert releaser.sweep() == 0  # closed once


def test_a_touch_restarts_the_idle_time(tiny_lm, clock) -> None:
    releaser = IdleReleaser(60, clock=clock, check_every_s=None)
    busy, idle = generation(tiny_lm), generation(tiny_lm)
    releaser.touch(busy)
    releaser.touch(idle)
    for _ in range(5):
        clock.now += 30
        releaser.touch(busy)
        releaser.sweep()
    assert not busy.closed and idle.closed


def test_the_releaser_does_not_keep_a_dropped_generation_alive(tiny_lm, clock) -> None:
    releaser = IdleReleaser(60, clock=clock, check_every_s=None)
    gen = generation(tiny_lm, steps=1)
    releaser.touch(gen)
    assert releaser.tracked() == 1
    del gen
    gc.collect()
    assert releaser.tracked() == 0
    clock.now += 120
    assert releaser.sweep() == 0


def test_the_background_sweep_closes_idle_generations_by_itself(tiny_lm) -> None:
    releaser = IdleReleaser(0.05, check_every_s=0.02)
    try:
        gen = generation(tiny_lm, steps=1)
        releaser.touch(gen)
        closed = threading.Event()
        for _ in range(200):
            if gen.closed:
                closed.set()
                break
            threading.Event().wait(0.01)
        assert closed.is_set()
    finally:
        releaser.stop()


@pytest.mark.parametrize("idle_s", [0, -5, float("nan"), True, "600"])
def test_an_idle_time_that_is_not_a_positive_number_is_refused(idle_s) -> None:
    with pytest.raises(SettingsError, match="idle_s"):
        IdleReleaser(idle_s, check_every_s=None)


def test_the_deployment_sets_the_idle_minutes() -> None:
    assert deployment_from_env({}).idle_minutes == 30
    assert deployment_from_env({"TBT_PRESET": "public"}).idle_minutes == 10
    assert deployment_from_env({"TBT_IDLE_MINUTES": "2.5"}).idle_minutes == 2.5
    for bad in ("0", "-1", "soon", "inf"):
        with pytest.raises(SettingsError, match="TBT_IDLE_MINUTES"):
            deployment_from_env({"TBT_IDLE_MINUTES": bad})


def test_an_exempt_generation_is_never_closed_and_a_touch_does_not_register_it_again(tiny_lm, clock) -> None:
    releaser = IdleReleaser(60, clock=clock, check_every_s=None)
    room, tab = generation(tiny_lm, steps=1), generation(tiny_lm, steps=1)
    releaser.touch(room)
    releaser.touch(tab)
    releaser.exempt(room)  # its owner closes it (a class room's generation)
    releaser.touch(room)
    assert releaser.tracked() == 1
    clock.now += 3600
    assert releaser.sweep() == 1 and tab.closed and not room.closed
