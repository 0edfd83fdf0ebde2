"""What every page does with a tab left open and idle: touch, and rebuild what was put away.

The server's IdleReleaser (ui/server/deployment.py, engine/serving/idle.py) closes the generations of
a visitor who has not touched them for a while; their records stay. Each page's controller
calls `keep_open` on every run and before every button's action: its generations are touched
(registered the first time), and any that were put away are rebuilt exactly from their own
records first. No Streamlit here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, MutableMapping
from typing import Any, Protocol, TypeVar

from engine import (
    Generation,
    GenerationFinished,
    ModelLoadError,
    PromptError,
    SettingsError,
    TraceError,
    replay,
    to_trace,
)
from ui.server.deployment import idle_releaser, put_away, rebuild_limits
from ui.session.settings import set_message

State = MutableMapping[str, Any]
Held = TypeVar("Held")  # what a page keeps under its key: a Generation, or a pair of lanes, ...

# what a rebuild can meet: a model or a draft that no longer loads, settings this server now refuses
REBUILD_ERRORS = (TraceError, PromptError, SettingsError, ModelLoadError, GenerationFinished)


class Closable(Protocol):
    @property
    def closed(self) -> bool: ...


def touch(generations: Iterable[Closable]) -> None:
    """Note that this visitor is using `generations` now (registered for idle release the first time)."""
    for generation in generations:
        idle_releaser().touch(generation)


def exempt(generation: Closable) -> None:
    """Leave `generation` out of idle release: its owner bounds its life (a class room's)."""
    idle_releaser().exempt(generation)


def keep_open(state: State, key: str, *, generations: Callable[[Held], Iterable[Closable]],
              rebuild: Callable[[Held], Held], subject: str, rebuilt_from: Callable[[Held], str], messages: str,
              again: str = "Press Reset to start again.", clicked: bool = False) -> Held | None:
    """Note that this visitor is here and return what `state[key]` holds (its `generations`
    are touched). When any of them was put away while the visitor was idle, `rebuild` makes
    the whole again first and it is stored under `key`.

    `subject` names what was put away ("Your generation was"), `rebuilt_from` what the rebuild
    read ("its 5 steps"), `again` what to do when the rebuild fails; the notes go to the
    page's message store `messages`: "idle" (welcome back) and "buttons" (why it failed).
    `clicked`: a button's action follows, so an earlier welcome-back note goes. None when
    nothing is held, or it could not be rebuilt (the records stay on the page)."""
    if clicked:
        set_message(state, "idle", None, messages)
    held = state.get(key)
    if held is None:
        return None
    touch(generations(held))
    if not any(generation.closed for generation in generations(held)):
        return held
    try:
        rebuilt = rebuild(held)
    except REBUILD_ERRORS as exc:
        set_message(state, "buttons", f"{put_away(subject)} and could not be rebuilt ({exc}). {again}", messages)
        return None
    state[key] = rebuilt
    touch(generations(rebuilt))
    done = "has" if subject.endswith(" was") else "have"
    set_message(state, "idle", f"Welcome back. {put_away(subject)}, and {done} been rebuilt exactly from "
                               f"{rebuilt_from(rebuilt)}.", messages, level="info")
    return rebuilt


def rebuild_generation(generation: Generation, progress: Callable[[int, int], bool] | None = None) -> Generation:
    """A plain generation put away, made again exactly from its own steps, through its own
    scheduler; `progress` (done, total) is told after each step. Raises REBUILD_ERRORS."""
    return replay(generation.lm, to_trace(generation), rebuild_limits(), progress, generation.scheduler).generation


def steps_of(generation: Generation) -> str:
    """What a plain generation was rebuilt from, for the welcome-back note."""
    return f"its {len(generation.steps):,} steps"
