"""What the Sampler lab's controls do, as plain functions over the visitor's state.

`state` is st.session_state on the page and a dict in tests; the keys are ui/session/keys.py's LAB.
Every function here chooses, computes or remembers what the page shows and draws nothing, so
the page (pages/sampler_lab.py) is layout only, as the Step page's controller
(ui/controllers/step_through.py) is for its page. The numbers themselves are ui/domain/sampler_lab.py's (the engine's
sampler). The frozen step's generation is kept open as every page's are (ui/session/idle_rebuild.py):
the Step page's own, when the lab studies it, is kept open by the Step controller; a preset's
is touched on every run and frozen again if the server put it away. Engine errors never
escape: they become the message shown beside the control that caused them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, MutableMapping
from dataclasses import dataclass
from typing import Any, TypeVar

from engine import LoadedModel, PromptError, SamplerSettings, SettingsError
from engine.serving import ForwardScheduler
from ui.controllers import step_through as step_controller
from ui.domain.sampler_lab import FrozenStep, Outcome, draw_many, freeze_generation, freeze_prompt, live_generation
from ui.session import idle_rebuild
from ui.session.keys import LAB
from ui.session.memo import Same, forget, recall, remember
from ui.session.presets import LAB_PRESETS_FILE, Preset, load_presets
from ui.session.settings import message, set_message

State = MutableMapping[str, Any]
T = TypeVar("T")

PRESETS: dict[str, Preset] = {p.name: p for p in load_presets(LAB_PRESETS_FILE)}  # assets/lab_presets.json
LIVE = "Your generation on the Step-through page (its latest step)"
DRAWS = 1000


@dataclass(frozen=True)
class Column:
    """One side-by-side sampler column and its default settings."""

    name: str
    key: str  # its sliders' keys start with this
    defaults: SamplerSettings


COLUMNS = (
    Column("A", LAB.column_a, SamplerSettings(temperature=1.0)),
    Column("B", LAB.column_b, SamplerSettings(temperature=1.0, top_k=10)),
    Column("C", LAB.column_c, SamplerSettings(temperature=1.5, min_p=0.1)),
)


# ---- remembered for the visitor ----------------------------------------------------------------


def memo(state: State, key: Hashable, compute: Callable[[], T]) -> T:
    """A costly result (a frozen step, a sweep, 1,000 draws) computed once per visitor, so a
    rerun (any widget move) never recomputes it."""
    return remember(state, LAB.memo, key, compute)


def rebuildable(state: State, key: Hashable, build: Callable[[], T]) -> T:
    """A chart or chain outcome built once per visitor for the values in `key` (a chart costs a
    slider move more than reading it back), kept apart from `memo`'s results: reading off many
    values never evicts the visitor's 1,000 draws."""
    return remember(state, LAB.views, key, build)


def lab_message(state: State, control: str) -> str | None:
    """The message beside `control`: "source", a column's name, or "chain"."""
    return message(state, control, LAB.messages)


# ---- the frozen step ---------------------------------------------------------------------------


def sources(state: State, lm: LoadedModel) -> list[str]:
    """The distributions to study: the Step page's generation when it has a step on `lm`, then the presets."""
    return ([LIVE] if live_generation(state, lm) is not None else []) + list(PRESETS)


def frozen_step(state: State, lm: LoadedModel, choice: str, scheduler: ForwardScheduler | None = None
                ) -> tuple[tuple, FrozenStep] | None:
    """The frozen step `choice` names and the key its results are remembered under: the
    visitor's live generation (kept open, rebuilt if it was put away), or a preset's first
    step (one forward pass through the server's `scheduler`, the first time). None when a
    preset's prompt is refused (the message "source" says why)."""
    if choice == LIVE and live_generation(state, lm) is not None:
        if (generation := step_controller.keep_open(state)) is None:
            set_message(state, "source", message(state, "buttons"), LAB.messages)  # why it was not rebuilt
            return None
        set_message(state, "source", None, LAB.messages)
        # the logits and the draw depend only on the tokens so far (Back restores the generator)
        key = ("live", Same(generation), tuple(generation.context_ids), lm.name)
        source = f"your generation, step {len(generation.steps)}"
        return key, memo(state, key, lambda: freeze_generation(generation, source))
    key = ("preset", choice, lm.name)
    kept: FrozenStep | None = recall(state, LAB.memo, key)
    if kept is not None and kept.generation.closed:  # put away while the tab sat idle: the same step again
        forget(state, LAB.memo, key)
    try:
        preset = PRESETS[choice]
        step = memo(state, key, lambda: freeze_prompt(lm, preset.prompt, preset.chat, scheduler=scheduler))
    except PromptError as exc:
        set_message(state, "source", str(exc), LAB.messages)
        return None
    set_message(state, "source", None, LAB.messages)
    idle_rebuild.touch((step.generation,))
    return key, step


# ---- sampler settings from the sliders ---------------------------------------------------------


def _settings(state: State, control: str, make: Callable[[], SamplerSettings]) -> SamplerSettings | None:
    try:
        settings = make()
    except SettingsError as exc:
        set_message(state, control, str(exc), LAB.messages)
        return None
    set_message(state, control, None, LAB.messages)
    return settings


def column_sampler(state: State, column: Column) -> SamplerSettings | None:
    """The settings one column's sliders describe; None when they are not allowed (the
    message beside the column, under its name, says why). A slider the page did not draw (an
    embed's compact layout leaves the penalty out) keeps the column's default."""
    k, d = column.key, column.defaults
    return _settings(state, column.name, lambda: SamplerSettings(
        temperature=state.get(f"{k}_temperature", d.temperature), top_k=int(state.get(f"{k}_top_k", d.top_k)),
        top_p=state.get(f"{k}_top_p", d.top_p), min_p=state.get(f"{k}_min_p", d.min_p),
        repetition_penalty=state.get(f"{k}_penalty", d.repetition_penalty)))


def chain_sampler(state: State) -> SamplerSettings | None:
    """The settings for the chain-order comparison; None (the message "chain" says why) if not allowed."""
    return _settings(state, "chain", lambda: SamplerSettings(
        temperature=state[LAB.chain_temperature], top_k=int(state[LAB.chain_top_k]), top_p=state[LAB.chain_top_p],
        min_p=state[LAB.chain_min_p]))


# ---- 1,000 draws -------------------------------------------------------------------------------


def _draws_key(step_key: tuple, outcome: Outcome, seed: int) -> tuple:
    return (*step_key, "draws", outcome.settings, seed)


def draw(state: State, step_key: tuple, outcome: Outcome, seed: int) -> Counter[int]:
    """DRAWS picks from `outcome`'s final distribution with the engine's own draw (remembered)."""
    return memo(state, _draws_key(step_key, outcome, seed), lambda: draw_many(outcome.chain.final_probs, DRAWS, seed))


def draws(state: State, step_key: tuple, outcome: Outcome, seed: int) -> tuple[tuple, Counter[int] | None]:
    """The key of `outcome`'s draws and the draws, if they were made; draws nothing."""
    key = _draws_key(step_key, outcome, seed)
    return key, recall(state, LAB.memo, key)
