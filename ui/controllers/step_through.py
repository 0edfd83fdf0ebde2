"""What the Step-through page's controls do, as plain functions over the visitor's state.

`state` is st.session_state on the page and a dict in tests; the keys are ui/session/keys.py's STEP.
Every function here changes the state or the visitor's Generation and draws nothing, so the
page (pages/step_through.py) is layout only, and these are tested without Streamlit. Engine
errors never escape: they become the message shown beside the control that caused them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from engine import (
    BUNDLED,
    Decision,
    Distribution,
    Generation,
    GenerationFinished,
    InsideView,
    LoadedModel,
    PromptError,
    PromptReading,
    Resampled,
    SamplerSettings,
    SettingsError,
    StepRecord,
    TraceError,
    other_device_note,
    parse_trace,
    replay,
)
from engine.serving import ForwardScheduler
from ui.server.deployment import current_deployment
from ui.session import idle_rebuild, settings
from ui.session.keys import STEP
from ui.session.memo import Same, remember
from ui.session.presets import apply_preset, load_presets, preset_named
from ui.session.run_clock import RunClock
from ui.session.settings import set_message, step_generation
from ui.session.share import SharedState, ShareError, from_generation, from_params, replay_trace, to_params
from ui.views.chips import prompt_chips

State = MutableMapping[str, Any]

RUN = RunClock(STEP.running, STEP.run_frame_started)  # a Run: one token per rerun, each on screen for a frame
# From this many prompt tokens the first Step is announced with its estimated time and shows its
# progress (docs/teaching.md: how long a prompt's pass takes on the machines seen)
LONG_PROMPT_TOKENS = 500


# ---- the buttons -----------------------------------------------------------------------------


def _act(state: State, action: Callable[[], object]) -> None:
    """Run an engine action; an engine error becomes the message beside the buttons."""
    try:
        action()
    except (GenerationFinished, SettingsError, PromptError) as exc:
        set_message(state, "buttons", str(exc))
    else:
        set_message(state, "buttons", None)


def step(state: State) -> None:
    """Step: one token (forward pass, sample, append, check), of the prompt in the field now.

    A click's callback runs before the page script reads the widgets, and a prompt just typed
    reaches the server with the very click that takes the focus from its field: stepping the
    generation as it was would make a token of the old prompt, and the script would then start
    the new prompt's generation with none. So the generation is brought up to the widgets
    first; while the prompt cannot be read, Step does nothing and says why.

    A long prompt's first Step does not wait inside this callback (a greyed page for minutes):
    while its pass is still reading, the Step is left to the page, which shows the pass's
    progress and then steps (`awaiting_prompt`, `finish_awaited_step`)."""
    if (gen := current_for_step(state)) is None:
        return
    if is_long_prompt(gen):
        gen.read_prompt_ahead()
        if (reading := gen.prompt_reading()) is not None and not reading.done:
            state[STEP.awaiting_prompt] = True
            return
    _act(state, gen.step)


def step_now(state: State) -> None:
    """Step, waiting inside the click for a long prompt's pass: the Class presenter's Step, whose
    redrawn screen goes to the whole room (and whose page has no progress view of its own)."""
    if (gen := current_for_step(state)) is not None:
        _act(state, gen.step)


def is_long_prompt(gen: Generation) -> bool:
    """Whether the generation has yet to read a prompt long enough to warn about."""
    return not gen.steps and len(gen.prompt_ids) >= LONG_PROMPT_TOKENS


def awaiting_prompt(state: State, gen: Generation) -> PromptReading | None:
    """The pass the visitor pressed Step for while it still reads the prompt, or None (no Step
    waits, or the pass was withdrawn: Step then reads the prompt itself)."""
    return gen.prompt_reading() if state.get(STEP.awaiting_prompt) else None


def finish_awaited_step(state: State) -> None:
    """The Step the visitor pressed while the prompt was reading, now that it has been read."""
    state.pop(STEP.awaiting_prompt, None)
    step(state)


def current_for_step(state: State) -> Generation | None:
    """The visitor's generation, kept open and brought up to the setup widgets; None (and the
    reason beside the buttons) while the prompt or the stop settings cannot be used."""
    gen = keep_open(state, clicked=True)
    if gen is None:
        return None
    sync_generation(state, gen.lm, gen.scheduler)
    if problem := prompt_problem(state):
        set_message(state, "buttons", problem)
        return None
    return step_generation(state)


def prompt_problem(state: State) -> str | None:
    """Why the setup widgets cannot make a generation now (the current one stays, but nothing
    steps it: its tokens would be of another prompt), or None."""
    for control, what in (("prompt", "the prompt"), ("stop", "the stop settings")):
        if problem := settings.message(state, control):
            return f"Fix {what} above first: {problem}"
    return None


def back(state: State) -> None:
    """Back: rewind one step (the KV cache is cropped, the random generator restored)."""
    gen = keep_open(state, clicked=True)
    if gen is not None and gen.steps:
        _act(state, lambda: gen.rewind(len(gen.steps) - 1))


def reset(state: State) -> None:
    """Reset: a fresh generation with the current prompt and settings (a new prefill on Step)."""
    gen = step_generation(state)
    if gen is not None:
        _act(state, lambda: state.update({STEP.generation: new_generation(state, gen.lm, gen.scheduler)}))


def branch(state: State, token_id: int) -> None:
    """Replace the latest step's pick with another candidate."""
    gen = keep_open(state, clicked=True)
    if gen is not None and gen.steps:
        _act(state, lambda: gen.branch(token_id))


def repick(state: State) -> None:
    """Take the latest step again under the current sampler settings."""
    gen = keep_open(state, clicked=True)
    if gen is not None and gen.steps:
        _act(state, gen.repick)


def choose_preset(state: State) -> None:
    """Fill the prompt, chat, sampler and stop widgets from the preset just chosen."""
    if name := state.get(STEP.preset):
        apply_preset(state, preset_named(load_presets(), name))


# ---- an open tab left idle -------------------------------------------------------------------


def keep_open(state: State, progress: Callable[[int, int], bool] | None = None, clicked: bool = False
              ) -> Generation | None:
    """Note that this visitor is here (ui/session/idle_rebuild.py) and return their generation. One put
    away while they were idle is first rebuilt exactly from its own steps, through its
    scheduler; `progress` (done, total) is told after each step. `clicked`: a button's action
    follows, so an earlier welcome-back note goes. None when there is no generation, or it
    could not be rebuilt (the message beside the buttons says why)."""
    return idle_rebuild.keep_open(state, STEP.generation, generations=lambda gen: (gen,),
                                  rebuild=lambda gen: idle_rebuild.rebuild_generation(gen, progress),
                                  subject="Your generation was", rebuilt_from=idle_rebuild.steps_of,
                                  messages=STEP.messages, clicked=clicked)


# ---- Run: one token per rerun, paced ---------------------------------------------------------


def start_run(state: State) -> None:
    """Run: step until a stop condition fires. Like Step, it takes the prompt in the field now
    (a prompt typed and Run clicked at once) and is refused while the prompt is unusable."""
    if current_for_step(state) is not None:
        RUN.start(state)


stop_run, is_running, run_frame_wait = RUN.stop, RUN.is_running, RUN.frame_wait


def advance_run(state: State, gen: Generation, now: float) -> None:
    """One token of a Run (`now`: time.monotonic()), ui/session/run_clock.py: a Stop click is
    handled between two tokens. The Run ends when generation finishes or the step fails."""
    RUN.frame_begins(state, now)
    if not gen.finished:
        _act(state, gen.step)
    if gen.finished or settings.message(state, "buttons"):
        stop_run(state)


# ---- the generation follows the setup widgets ------------------------------------------------


def new_generation(state: Mapping[str, Any], lm: LoadedModel, scheduler: ForwardScheduler | None = None
                   ) -> Generation:
    """A generation from the widgets' current values (raises the engine's errors); its forward
    passes go through `scheduler`, the server's, shared with every visitor on `lm`."""
    setup = settings.setup_from(state, lm)
    return Generation(lm, setup.prompt, chat=setup.chat, seed=setup.seed, sampler=settings.sampler_from(state),
                      stop=settings.stop_from(state), allow_special=setup.allow_special,
                      limits=current_deployment().limits, scheduler=scheduler)


def sync_generation(state: State, lm: LoadedModel, scheduler: ForwardScheduler | None = None) -> None:
    """Start over when the prompt, chat flag, seed or model changed; pass stop settings on.
    On bad input the message is shown beside the control and the current generation stays."""
    gen = step_generation(state)
    try:
        stop = settings.stop_from(state)
    except SettingsError as exc:
        set_message(state, "stop", settings.setting_problem(exc))
        stop = None
    else:
        set_message(state, "stop", None)
    if gen is None or settings.setup_of(gen) != settings.setup_from(state, lm):
        try:
            gen = new_generation(state, lm, scheduler) if stop is not None else gen
        except (PromptError, SettingsError) as exc:
            set_message(state, "prompt", str(exc))
            return
        set_message(state, "prompt", None)
        if (old := step_generation(state)) is not None and old is not gen:
            old.stop_reading_ahead()  # one prompt read ahead per visitor, however fast the prompt changes
        state[STEP.generation] = gen
        stop_run(state)
    if gen is not None and stop is not None:
        gen.stop = stop


# ---- the sampler view: the controls re-sample the latest step --------------------------------


@dataclass(frozen=True)
class SamplerView:
    """What the sampler view shows: the latest step as the sampler controls would take it."""

    record: StepRecord | None  # the latest step; None before the first
    decision: Decision | None  # the record's, or a re-sample of it when the settings changed
    distribution: Distribution | None
    changed: bool  # the controls differ from the settings the latest step was taken under
    problem: str | None  # why the controls' values are not allowed (the generation's sampler stays)


def sampler_view(state: State, gen: Generation) -> SamplerView:
    """Give the generation the sampler the controls describe (the next Step uses it) and
    re-sample the latest step's kept logits under it: no forward pass, the same random draw."""
    try:
        gen.sampler = settings.sampler_from(state)
        problem = None
    except SettingsError as exc:
        problem = str(exc)
    record = gen.steps[-1] if gen.steps else None
    if record is None:
        return SamplerView(None, None, None, False, problem)
    changed = gen.sampler != record.decision.settings
    view = resampled(state, gen, gen.sampler) if changed else record
    return SamplerView(record, view.decision, view.distribution, changed, problem)


def resampled(state: State, gen: Generation, sampler: SamplerSettings) -> Resampled:
    """The latest step re-sampled under `sampler`, remembered for the visitor, so dragging a
    slider back over values already seen costs nothing."""
    return remember(state, STEP.memo, ("resampled", Same(gen.steps[-1]), sampler), lambda: gen.resample(sampler))


def prompt_html(state: State, gen: Generation) -> str:
    """The prompt's chips: they never change for a prompt, so they are built once."""
    return remember(state, STEP.memo, ("prompt_chips", gen.lm.source, tuple(gen.prompt_ids)),
                    lambda: prompt_chips(gen.prompt_pieces))


# ---- inside the forward pass -----------------------------------------------------------------


def look_inside(state: State, gen: Generation, open_: bool) -> InsideView | str | None:
    """While the view is open, every step's own pass is captured (on the model's instrumented
    twin, engine/inside.py) and the latest step's inside view is given, remembered per step;
    closed, nothing is captured. The engine's message where it cannot be given; None before a step."""
    gen.inside = open_
    if not open_ or not gen.steps:
        return None
    try:
        return remember(state, STEP.memo, ("inside", Same(gen.steps[-1])), gen.inside_view)
    except (SettingsError, GenerationFinished) as exc:
        return str(exc)


# ---- share links and traces ------------------------------------------------------------------


def link_to_open(state: State, params: Mapping[str, list[str]]) -> SharedState | None:
    """On a visitor's first run only, the state a share link in the address describes; None
    when there is none (or it cannot be read: the message then says why)."""
    if state.get(STEP.link_read):
        return None
    state[STEP.link_read] = True
    if "prompt" not in params:
        return None
    limit = current_deployment().limits.max_link_chars
    if (length := sum(len(k) + sum(map(len, values)) for k, values in params.items())) > limit:
        link_failed(state, f"it is {length:,} characters long; this server opens links of up to {limit:,}.")
        return None
    try:
        return from_params(params)
    except ShareError as exc:
        link_failed(state, str(exc))
        return None
    except SettingsError as exc:
        link_failed(state, settings.setting_problem(exc))
        return None


def open_link(state: State, lm: LoadedModel, shared: SharedState,
              progress: Callable[[int, int], bool] | None = None, scheduler: ForwardScheduler | None = None) -> None:
    """Replay a share link's steps on `lm` and make that the visitor's generation; `progress`
    (done, total) is told after each step (returning False cancels)."""
    try:
        result = replay(lm, replay_trace(shared), current_deployment().limits, progress, scheduler)
    except SettingsError as exc:
        link_failed(state, settings.setting_problem(exc))
        return
    except (TraceError, PromptError) as exc:
        link_failed(state, str(exc))
        return
    if problem := settings.write_generation(state, result.generation):
        link_failed(state, problem)
        return
    notes = []
    if result.mismatched_steps:
        notes.append("Steps " + ", ".join(map(str, result.mismatched_steps))
                     + " sampled differently on this machine and were forced to the linked tokens.")
    if (device := other_device_note(shared.device, lm)) is not None:
        notes.append(device.replace("It was made", "The link was made", 1))
    if notes:
        set_message(state, "link", " ".join(notes))


def link_failed(state: State, problem: str) -> None:
    set_message(state, "link", f"This link cannot be opened: {problem}")


def share_params(gen: Generation, source: str) -> dict[str, str | list[str]]:
    """The share link's parameters for `gen` on the model `source` ("bundled" is left out)."""
    return to_params(from_generation(gen, "" if source == BUNDLED else source))


def needs_publishing(address: Mapping[str, list[str]], params: Mapping[str, str | list[str]]) -> bool:
    """Whether the address bar (`address`: its parameters as the browser has them now) does not
    hold `params`. Read from the address itself, not remembered: another page leaves the
    address bare, and the visitor who comes back must find the link there again."""
    return dict(address) != {key: value if isinstance(value, list) else [value] for key, value in params.items()}


def load_trace(state: State, lm: LoadedModel, name: str, data: bytes,
               progress: Callable[[int, int], bool] | None = None, scheduler: ForwardScheduler | None = None) -> None:
    """Replay an uploaded trace into a live generation; a bad file leaves everything as is
    and says why. `progress` as in open_link."""
    limits = current_deployment().limits
    try:
        trace = parse_trace(data, limits)
        result = replay(lm, trace, limits, progress, scheduler)
    except (TraceError, PromptError) as exc:
        set_message(state, "trace_error", f"{name}: {exc}")
        return
    if problem := settings.write_generation(state, result.generation):
        set_message(state, "trace_error", f"{name}: {problem}")
        return
    set_message(state, "trace_error", None)
    note = f"Loaded {name}: {len(result.generation.steps)} steps replayed."
    if result.mismatched_steps:
        note += f" Steps {', '.join(map(str, result.mismatched_steps))} sampled differently here and were forced."
    model = trace.get("model")
    recorded = model.get("name") if isinstance(model, dict) else None
    if recorded not in (None, lm.name):
        note += f" The trace was recorded with {recorded}; it is replayed on {lm.name}."
    if (device := other_device_note(model.get("device") if isinstance(model, dict) else None, lm)) is not None:
        note += " " + device.replace("It was made", "The trace was made", 1)
    set_message(state, "trace", note)
