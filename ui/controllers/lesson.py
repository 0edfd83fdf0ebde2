"""What the Lesson's controls do, as plain functions over the visitor's state.

`state` is st.session_state on the page and a dict in tests; the keys are ui/session/keys.py's LESSON.
Every function here changes the state or the visitor's two generations (the guided walk's and
the prediction exercise's) and draws nothing, so the page (pages/lesson.py) is layout only, as
the Step page's controller (ui/controllers/step_through.py) is for its page. Both generations are kept
open as every page's are (ui/session/idle_rebuild.py): touched on every run and before every action,
rebuilt exactly from their steps when the server put them away while the tab sat idle. Engine
errors never escape: they become the message shown beside the part that caused them. The
Lesson's content (presets, stages, scoring) is ui/domain/lesson.py.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from engine import Generation, GenerationFinished, InsideView, LoadedModel, PromptError, SettingsError, StepRecord
from engine.serving import ForwardScheduler
from ui.domain.lesson import GREEDY, PRESETS, STAGES, Guess, score, start
from ui.session import idle_rebuild
from ui.session.keys import LESSON
from ui.session.memo import Same, remember
from ui.session.presets import preset_named
from ui.session.settings import message, set_message

State = MutableMapping[str, Any]
Held = tuple[tuple[str, str], Generation]  # (what it was made for, the generation): LESSON.walk and .predict


# ---- both parts: a generation kept open --------------------------------------------------------


def _keep_open(state: State, key: str, messages: str, again: str, clicked: bool) -> Generation | None:
    """The generation under `key`, touched for idle release, and rebuilt exactly from its
    steps if the server put it away (ui/session/idle_rebuild.py). None when there is none, or it could
    not be rebuilt (the message "buttons" in `messages` says why)."""
    held: Held | None = idle_rebuild.keep_open(
        state, key, generations=lambda held: (held[1],),
        rebuild=lambda held: (held[0], idle_rebuild.rebuild_generation(held[1])),
        subject="Your generation was", rebuilt_from=lambda held: idle_rebuild.steps_of(held[1]),
        messages=messages, again=again, clicked=clicked)
    return None if held is None else held[1]


def _held(state: State, key: str, made_for: tuple[str, str]) -> Generation | None:
    """The generation under `key` if it was made for `made_for` (its preset or prompt, and the model)."""
    held: Held | None = state.get(key)
    return held[1] if held is not None and held[0] == made_for else None


def walk_message(state: State, control: str) -> str | None:
    """The message beside the guided walk's `control`: "start", "buttons", "idle" or "link"."""
    return message(state, control, LESSON.walk_messages)


def predict_message(state: State, control: str) -> str | None:
    """The message beside the exercise's `control`: "start", "buttons" or "idle"."""
    return message(state, control, LESSON.predict_messages)


# ---- the guided walk -------------------------------------------------------------------------


def keep_walk_open(state: State, clicked: bool = False) -> Generation | None:
    """The walk's generation, kept open (rebuilt if it was put away); None if there is none."""
    return _keep_open(state, LESSON.walk, LESSON.walk_messages, "Press Start over to begin again.", clicked)


def walk(state: State, lm: LoadedModel, name: str, scheduler: ForwardScheduler | None = None
         ) -> tuple[Generation, int] | None:
    """The visitor's walk for the preset `name` and the screen it is on, started afresh
    (screen 0, no step yet) when the preset or the model changes; its passes go through the
    server's `scheduler`. None when it cannot start (the message "start" says why)."""
    if _held(state, LESSON.walk, (name, lm.name)) is None:
        try:
            generation = start(lm, preset_named(PRESETS, name), scheduler)
        except PromptError as exc:
            set_message(state, "start", str(exc), LESSON.walk_messages)
            return None
        set_message(state, "start", None, LESSON.walk_messages)
        state[LESSON.walk] = ((name, lm.name), generation)
        state[LESSON.stage] = 0
    keep_walk_open(state)
    return state[LESSON.walk][1], stage(state)


def open_link(state: State, lm: LoadedModel, params: Mapping[str, str], scheduler: ForwardScheduler | None = None
              ) -> None:
    """A link's preset and stage, read once (`?preset=2&stage=4`: the second preset's walk at its
    fourth screen, its first token made): a course page opens the lesson where its text is. A
    value out of range is said ("link"), and the lesson opens at its start."""
    if state.get(LESSON.link_read):
        return
    state[LESSON.link_read] = True
    wanted = {key: params[key] for key in ("preset", "stage") if key in params}
    if not wanted:
        return
    choices = {"preset": len(PRESETS), "stage": len(STAGES)}
    numbers = {key: int(value) if value.isdigit() else 0 for key, value in wanted.items()}
    for key, number in numbers.items():
        if not 1 <= number <= choices[key]:
            set_message(state, "link", f"The link's {key} {wanted[key]!r} is not one of 1 to {choices[key]}: the "
                        "lesson opens at its start.", LESSON.walk_messages)
            return
    name = PRESETS[numbers.get("preset", 1) - 1].name
    state[LESSON.preset] = name
    if walk(state, lm, name, scheduler) is not None:
        while stage(state) < numbers.get("stage", 1) - 1:
            go_next(state)


def stage(state: State) -> int:
    """The walk's screen shown now (an index into STAGES)."""
    return state.get(LESSON.stage, 0)


def go_next(state: State) -> None:
    """Next screen; leaving the first screen, or the last one, runs a step of the loop."""
    generation = keep_walk_open(state, clicked=True)
    if generation is None:
        return
    shown = stage(state)
    if (shown == 0 and not generation.steps) or shown == len(STAGES) - 1:
        try:
            generation.step()
        except GenerationFinished:
            return
        state[LESSON.stage] = 1
    else:
        state[LESSON.stage] = shown + 1


def inside(state: State, generation: Generation) -> InsideView | str:
    """Inside the walk's latest step's forward pass: its pass repeated exactly on the model's
    instrumented twin the first time the stage is shown (engine/inside.py), then remembered for
    that step. The engine's message where this model cannot be looked inside."""
    step = generation.steps[-1]
    try:
        return remember(state, LESSON.memo, ("inside", Same(step)), lambda: generation.inside_view(step.index),
                        bound=4)
    except (SettingsError, GenerationFinished) as exc:
        return str(exc)


def go_previous(state: State) -> None:
    """Previous screen. From a later token's first screen, back to the token before's last one:
    its step is taken back (rewound exactly: greedy, so Next makes the same step again), so each
    screen shows the numbers of the token it names. Otherwise only the view goes back."""
    shown = stage(state)
    if shown == 1:
        generation = keep_walk_open(state, clicked=True)
        if generation is not None and len(generation.steps) > 1:
            generation.rewind(len(generation.steps) - 1)
            state[LESSON.stage] = len(STAGES) - 1
            return
    state[LESSON.stage] = max(0, shown - 1)


def run_to_end(state: State) -> None:
    """Step until a termination condition fires, then show the check screen."""
    generation = keep_walk_open(state, clicked=True)
    if generation is None:
        return
    for _ in generation.run():
        pass
    state[LESSON.stage] = len(STAGES) - 1


def start_over(state: State) -> None:
    """Forget the walk; the next run starts the chosen preset afresh."""
    state.pop(LESSON.walk, None)
    set_message(state, "buttons", None, LESSON.walk_messages)
    set_message(state, "idle", None, LESSON.walk_messages)


# ---- predict, then reveal --------------------------------------------------------------------


def keep_predict_open(state: State, clicked: bool = False) -> Generation | None:
    """The exercise's generation, kept open (rebuilt if it was put away); None if there is none."""
    return _keep_open(state, LESSON.predict, LESSON.predict_messages, "Choose another text to play again.", clicked)


def predict_generation(state: State, lm: LoadedModel, prompt: str, scheduler: ForwardScheduler | None = None
                       ) -> Generation | None:
    """The exercise's generation for `prompt`, started afresh (with a new score) when the
    prompt or the model changes; its newest step is the one being guessed. None when it cannot
    start (the message "start" says why)."""
    if _held(state, LESSON.predict, (prompt, lm.name)) is None:
        try:
            generation = Generation(lm, prompt, sampler=GREEDY, scheduler=scheduler)
        except PromptError as exc:
            set_message(state, "start", str(exc), LESSON.predict_messages)
            return None
        set_message(state, "start", None, LESSON.predict_messages)
        generation.step()
        state.update({LESSON.predict: ((prompt, lm.name), generation), LESSON.guesses: [], LESSON.revealed: False})
    keep_predict_open(state)
    return state[LESSON.predict][1]


def guess_key(step: StepRecord) -> str:
    """The key of the visitor's choice for `step` (a radio widget's)."""
    return f"{LESSON.guess_prefix}{step.index}"


def choice(state: State, step: StepRecord) -> int | None:
    """The token the visitor chose for `step`, if any."""
    return state.get(guess_key(step))


def reveal(state: State, step: StepRecord) -> None:
    """Score the visitor's choice for this step; the page then shows the distribution."""
    chosen = choice(state, step)
    if chosen is None:
        return
    state[LESSON.guesses] = [*guesses(state), score(step, chosen)]
    state[LESSON.revealed] = True


def revealed(state: State) -> bool:
    return bool(state.get(LESSON.revealed, False))


def guesses(state: State) -> list[Guess]:
    """Every round scored so far."""
    return state.get(LESSON.guesses) or []


def next_round(state: State) -> None:
    """Let the model's pick stand and hide the next step's distribution."""
    generation = keep_predict_open(state, clicked=True)
    if generation is None:
        return
    if not generation.finished:
        generation.step()
    state[LESSON.revealed] = False
