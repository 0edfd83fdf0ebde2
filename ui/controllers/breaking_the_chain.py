"""What the "Breaking the chain" page's controls do, as plain functions over the visitor's state.

The page keeps two lanes on the same prompt and sampler: a speculative generation (one
forward pass of the model per round, several tokens per round) and a plain one (one pass per
token), stepped together so they always hold the same number of tokens. `state` is
st.session_state on the page and a dict in tests; the keys are ui/session/keys.py's CHAIN. Every
function here changes the state or the lanes and draws nothing, so the page
(pages/breaking_the_chain.py) is layout only, as the Step page's controller
(ui/controllers/step_through.py) is for its page; the sampler and stop widgets are read, and the lanes
kept open, by the same functions as there (ui/session/settings.py, ui/session/idle_rebuild.py). Engine errors
never escape: they become the message shown beside the control that caused them.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, Protocol

from engine import (
    Generation,
    GenerationFinished,
    LoadedModel,
    ModelLoadError,
    PromptError,
    SettingsError,
    SpeculativeGeneration,
    StopSettings,
    TraceError,
    parse_trace,
)
from engine.speculative import (
    DraftMethod,
    Entrant,
    RaceJob,
    check_k,
    replay_speculative,
    speculative_to_trace,
    start_race,
    verify_pass_decision,
)
from engine.speed import measure_prefill_decode
from ui.domain.breaking_the_chain import (  # the page's names for the methods, the lanes and their totals
    EARLY_EXIT,
    HEADS,
    LOOKAHEAD,
    METHODS,
    MTP,
    PROMPT_LOOKUP,
    SELF_BF16,
    SELF_INT8,
    Counts,
    Lanes,
    MakeDraft,
    catch_up,
    cost_figures,
    counts,
    draft_method,
    drafts_by_name,
    method_of,
    pictured,
    with_plain_lane,
)
from ui.server.deployment import current_deployment, rebuild_limits, upload_problem
from ui.session import idle_rebuild, settings
from ui.session.keys import CHAIN, STEP
from ui.session.memo import remember
from ui.session.presets import CHAIN_PRESETS_FILE, Preset, load_presets, preset_named
from ui.session.run_clock import RunClock
from ui.session.settings import CHAIN_SETTINGS, Message, format_stop_sequences
from ui.views.breaking_the_chain import counted
from ui.views.chain_story import CostSummary, RoundStory, cost_summary, measured_words, round_story
from ui.views.chips import prompt_chips

# the page and its tests read these here
__all__ = ["EARLY_EXIT", "HEADS", "LOOKAHEAD", "METHODS", "MTP", "PROMPT_LOOKUP", "SELF_BF16", "SELF_INT8", "Counts",
           "Lanes", "MakeDraft", "catch_up", "counts", "draft_method", "method_of", "pictured"]

WIDGET_DEFAULTS: dict[str, Any] = {
    CHAIN.prompt: "", CHAIN.chat: True, CHAIN.method: PROMPT_LOOKUP, CHAIN.k: 4, CHAIN.temperature: 0.0,
    CHAIN.top_k: 0, CHAIN.top_p: 1.0, CHAIN.min_p: 0.0, CHAIN.repetition_penalty: 1.0, CHAIN.max_new_tokens: 48,
    CHAIN.stop_sequences: "", CHAIN.seed: settings.DEFAULT_SEED,
}

# The sampler and stop widgets have the Step page's ranges (ui/session/settings.py, max new tokens capped
# by the server): the one table a loaded trace is checked against.
SAME_RANGE_AS = {
    CHAIN.temperature: STEP.temperature, CHAIN.top_k: STEP.top_k, CHAIN.top_p: STEP.top_p, CHAIN.min_p: STEP.min_p,
    CHAIN.repetition_penalty: STEP.repetition_penalty, CHAIN.max_new_tokens: STEP.max_new_tokens, CHAIN.seed: STEP.seed,
}

RUN = RunClock(CHAIN.running, CHAIN.run_frame_started)  # a Run: one round per rerun, each on screen for a frame


def widget_range(key: str) -> dict[str, float]:
    """A widget's min, max and step (CHAIN keys of SAME_RANGE_AS)."""
    return settings.widget_range(SAME_RANGE_AS[key])


PRESETS = load_presets(CHAIN_PRESETS_FILE)  # assets/chain_presets.json, in the Step page's presets' format
PRESETS_BY_NAME = {p.name: p for p in PRESETS}
DEFAULT_PRESET = PRESETS[0]


def current_lanes(state: MutableMapping[str, Any]) -> Lanes | None:
    """The visitor's two lanes (None before the page first made them)."""
    return state.get(CHAIN.lanes)


def prompt_html(state: MutableMapping[str, Any], lanes: Lanes) -> str:
    """The prompt's chips: they never change for a prompt, so they are built once."""
    plain = lanes.plain
    return remember(state, CHAIN.memo, ("prompt_chips", plain.lm.source, tuple(plain.prompt_ids)),
                    lambda: prompt_chips(plain.prompt_pieces))


# ---- messages ------------------------------------------------------------------------------


def set_message(state: MutableMapping[str, Any], control: str, text: str | None, level: str = "error") -> None:
    settings.set_message(state, control, text, CHAIN.messages, level)


def message(state: MutableMapping[str, Any], control: str) -> str | None:
    return settings.message(state, control, CHAIN.messages)


def notice(state: MutableMapping[str, Any], control: str) -> Message | None:
    """The message beside a control with its level: the page shows it as the level says."""
    return settings.notice(state, control, CHAIN.messages)


# ---- settings from the widgets ---------------------------------------------------------------


def init_defaults(state: MutableMapping[str, Any]) -> None:
    """Every widget's value once (the first preset's prompt), so widgets take no `value=`."""
    if CHAIN.prompt not in state:
        write_preset(state, DEFAULT_PRESET)
    for key, value in WIDGET_DEFAULTS.items():
        state.setdefault(key, value)


def write_preset(state: MutableMapping[str, Any], preset: Preset) -> None:
    """Fill the prompt, chat, sampler and stop widgets from a preset (any filter it does not name off)."""
    sampler, stop = preset.sampler, preset.stop
    state.update({CHAIN.prompt: preset.prompt, CHAIN.chat: preset.chat, CHAIN.temperature: sampler.temperature,
                  CHAIN.top_k: sampler.top_k, CHAIN.top_p: sampler.top_p, CHAIN.min_p: sampler.min_p,
                  CHAIN.repetition_penalty: sampler.repetition_penalty, CHAIN.max_new_tokens: stop.max_new_tokens,
                  CHAIN.stop_sequences: format_stop_sequences(stop.stop_sequences)})


def lane_stop(state: MutableMapping[str, Any]) -> StopSettings:
    """The stop settings the widgets describe (ui/session/settings.py, as on the Step page), within the
    server's cap (raises SettingsError). The cap is checked here for both lanes at once: the
    speculative lane's stop is a plain attribute."""
    stop = settings.stop_from(state, CHAIN_SETTINGS)
    current_deployment().limits.check_new_tokens(stop.max_new_tokens)
    return stop


def choose_preset(state: MutableMapping[str, Any]) -> None:
    """Fill the prompt, chat, sampler and stop widgets from the preset just chosen."""
    if (name := state.get(CHAIN.preset)) in PRESETS_BY_NAME:
        write_preset(state, preset_named(PRESETS, name))


# ---- the lanes -------------------------------------------------------------------------------


def new_lanes(state: MutableMapping[str, Any], lm: LoadedModel, draft: DraftMethod) -> Lanes:
    """Both lanes from the widgets' values (raises PromptError or SettingsError)."""
    sampler, stop, k = settings.sampler_from(state, CHAIN_SETTINGS), lane_stop(state), check_k(state[CHAIN.k])
    # chat mode reads typed special-token text as plain characters (the Step page has the switch)
    options = dict(chat=bool(state[CHAIN.chat]), sampler=sampler, stop=stop, seed=int(state[CHAIN.seed]),
                   allow_special=False, limits=current_deployment().limits)
    return Lanes(SpeculativeGeneration(lm, state[CHAIN.prompt], draft=draft, k=k, **options),
                 Generation(lm, state[CHAIN.prompt], **options))


def _setup(state: MutableMapping[str, Any]) -> tuple[str, bool, int]:
    return state[CHAIN.prompt], bool(state[CHAIN.chat]), int(state[CHAIN.seed])


def _setup_of(lanes: Lanes) -> tuple[str, bool, int]:
    spec = lanes.speculative
    return spec.prompt, spec.chat, spec.seed


def sync(state: MutableMapping[str, Any], lm: LoadedModel, make_draft: MakeDraft) -> Lanes | None:
    """Start over when the prompt, chat flag, seed or model changed; otherwise pass the sampler,
    stop settings and k on to the lanes for their next round. Bad input leaves a message beside
    its control and the current lanes as they are."""
    lanes: Lanes | None = state.get(CHAIN.lanes)
    if lanes is None or lanes.speculative.lm is not lm or _setup_of(lanes) != _setup(state):
        try:
            lanes = new_lanes(state, lm, _active_draft(state, lm, make_draft))
        except (PromptError, SettingsError, ModelLoadError) as exc:
            set_message(state, "setup", str(exc))
            return lanes
        set_message(state, "setup", None)
        state[CHAIN.lanes] = lanes
        RUN.stop(state)
    _pass_settings(state, lanes)
    return lanes


def _active_draft(state: MutableMapping[str, Any], lm: LoadedModel, make_draft: MakeDraft) -> DraftMethod:
    """The draft method in force: the last one that was built without error."""
    return pictured(make_draft(lm, state.get(CHAIN.active_method, PROMPT_LOOKUP)))


def _pass_settings(state: MutableMapping[str, Any], lanes: Lanes) -> None:
    for control, apply in (("sampler", lambda: settings.sampler_from(state, CHAIN_SETTINGS)),
                           ("stop", lambda: lane_stop(state))):
        try:
            value = apply()
        except SettingsError as exc:
            set_message(state, control, str(exc))
            continue
        set_message(state, control, None)
        for lane in (lanes.speculative, lanes.plain):
            setattr(lane, control, value)
    try:
        lanes.speculative.set_k(state[CHAIN.k])
    except SettingsError as exc:
        set_message(state, "k", f"{exc} The rounds go on with k = {lanes.speculative.k}.")
    else:
        set_message(state, "k", None)


def choose_method(state: MutableMapping[str, Any], lm: LoadedModel, make_draft: MakeDraft) -> None:
    """The method widget moved: draft with it from the next round on, keeping the generation.
    A method that cannot be built leaves a message and the previous method in force."""
    wanted = state[CHAIN.method]
    try:
        draft = pictured(make_draft(lm, wanted))
    except (ModelLoadError, SettingsError) as exc:
        previous = state.get(CHAIN.active_method, PROMPT_LOOKUP)
        set_message(state, "method", f"{wanted}: {exc} The generation goes on with {previous}.")
        state[CHAIN.method] = previous
        return
    state[CHAIN.active_method] = wanted
    lanes: Lanes | None = state.get(CHAIN.lanes)
    if lanes is not None:
        rounds = len(lanes.speculative.rounds)
        lanes.speculative.draft = draft
        set_message(state, "method", f"From round {rounds + 1} on, the guesses come from {wanted}; the "
                                     f"{counted(len(lanes.speculative.generated_ids), 'token')} so far "
                                     f"{'is' if len(lanes.speculative.generated_ids) == 1 else 'are'} kept."
                    if rounds else None, level="info")


def step(state: MutableMapping[str, Any], make_draft: MakeDraft) -> None:
    """Step: one speculative round, then the plain lane catches up to as many tokens (lanes
    put away while the tab sat idle are rebuilt first). A prompt typed and not yet read comes
    with this very click (it takes the focus from the field): the lanes are brought up to the
    widgets first, so the round is the new prompt's; while the setup cannot be used, nothing
    steps and the message says why."""
    if current_for_round(state, make_draft):
        _round(state)


def current_for_round(state: MutableMapping[str, Any], make_draft: MakeDraft) -> bool:
    """Whether the visitor's lanes, kept open and brought up to the setup widgets, can take a
    round; if not, the reason is beside the buttons."""
    lanes = keep_open(state, make_draft, clicked=True)
    if lanes is None:  # (the message says why)
        return False
    sync(state, lanes.speculative.lm, make_draft)
    if problem := message(state, "setup"):
        set_message(state, "buttons", f"Fix the prompt and settings above first: {problem}")
        return False
    return True


def _round(state: MutableMapping[str, Any]) -> None:
    lanes: Lanes | None = state.get(CHAIN.lanes)
    if lanes is None:
        return
    try:
        lanes.speculative.step()
    except (GenerationFinished, SettingsError, PromptError) as exc:
        set_message(state, "buttons", str(exc))
        return
    set_message(state, "buttons", None)
    catch_up(lanes)


def reset(state: MutableMapping[str, Any], lm: LoadedModel, make_draft: MakeDraft) -> None:
    """Both lanes start over from the prompt with the current settings."""
    state.pop(CHAIN.lanes, None)
    RUN.stop(state)
    set_message(state, "buttons", None)
    set_message(state, "method", None)
    sync(state, lm, make_draft)


# ---- Run: one round per rerun, paced ----------------------------------------------------------


def start_run(state: MutableMapping[str, Any], make_draft: MakeDraft) -> None:
    """Run: rounds until a stop condition fires, from the prompt in the field now (as Step)."""
    if current_for_round(state, make_draft):
        RUN.start(state)


stop_run, is_running, run_frame_wait = RUN.stop, RUN.is_running, RUN.frame_wait


def advance_run(state: MutableMapping[str, Any], now: float) -> None:
    """One round of a Run (`now`: time.monotonic()), ui/session/run_clock.py; the Run ends when
    the generation finishes or a round fails."""
    RUN.frame_begins(state, now)
    _round(state)
    run_should_continue(state)


def run_should_continue(state: MutableMapping[str, Any]) -> bool:
    """After a Run's round: go on unless the generation finished or a round failed."""
    lanes: Lanes | None = state.get(CHAIN.lanes)
    if lanes is None or lanes.speculative.finished or message(state, "buttons") is not None:
        RUN.stop(state)
    return RUN.is_running(state)


def measure(state: MutableMapping[str, Any], lm: LoadedModel) -> None:
    """The KV cache & speed page's measurement: the prompt in one pass against one token per pass."""
    state[CHAIN.measured] = measure_prefill_decode(lm, prompt_tokens=16, decode_steps=4, repeats=3)


# ---- what the page says about the lanes ----------------------------------------------------------


def story(lanes: Lanes) -> RoundStory | None:
    """The latest round, told step by step (None before the first)."""
    return round_story(lanes.speculative)


def costs(lanes: Lanes) -> CostSummary:
    """What checking k guesses costs: in theory, in the lanes' own timings, on this server's verify pass."""
    decision = verify_pass_decision(lanes.speculative.lm)
    return cost_summary(cost_figures(lanes.speculative, lanes.plain), decision.fast, decision.reason)


def measured_note(state: MutableMapping[str, Any]) -> str | None:
    """The prefill-against-decode measurement in words, once it was asked for."""
    return None if (measured := state.get(CHAIN.measured)) is None else measured_words(measured)


class Upload(Protocol):
    """An uploaded file (Streamlit's UploadedFile): its name and size are known before it is read."""

    name: str
    size: int

    def getvalue(self) -> bytes: ...


def upload_trace(state: MutableMapping[str, Any], lm: LoadedModel, make_draft: MakeDraft, upload: Upload | None
                 ) -> None:
    """The trace uploader changed: a file the server refuses by its size is not read; any
    other is loaded (load_trace)."""
    if upload is None:
        return
    if problem := upload_problem(upload.name, upload.size):
        set_message(state, "trace_error", problem)
        return
    load_trace(state, lm, make_draft, upload.getvalue(), upload.name)


def load_trace(state: MutableMapping[str, Any], lm: LoadedModel, make_draft: MakeDraft, data: bytes | str,
               filename: str) -> None:
    """Replay a saved speculative trace into both lanes and make the widgets describe it; a bad
    file leaves a message and the current lanes."""

    limits = current_deployment().limits
    try:
        result = replay_speculative(lm, parse_trace(data, limits), drafts_by_name(lm, make_draft), limits)
    except (TraceError, ModelLoadError, SettingsError) as exc:
        set_message(state, "trace_error", f"{filename}: {exc}")
        return
    spec, sampler = result.generation, result.generation.sampler
    values = {CHAIN.temperature: sampler.temperature, CHAIN.top_k: sampler.top_k, CHAIN.top_p: sampler.top_p,
              CHAIN.min_p: sampler.min_p, CHAIN.repetition_penalty: sampler.repetition_penalty,
              CHAIN.max_new_tokens: spec.stop.max_new_tokens, CHAIN.seed: spec.seed}
    if problem := settings.outside_ranges({SAME_RANGE_AS[key]: value for key, value in values.items()}):
        set_message(state, "trace_error", f"{filename}: {problem}")  # a widget could not show it
        return
    lanes = with_plain_lane(spec, limits)
    method = method_of(spec.draft.name) or PROMPT_LOOKUP
    state.update(values | {CHAIN.prompt: spec.prompt, CHAIN.chat: spec.chat, CHAIN.k: spec.k,
                           CHAIN.stop_sequences: format_stop_sequences(spec.stop.stop_sequences),
                           CHAIN.method: method, CHAIN.active_method: method, CHAIN.lanes: lanes,
                           CHAIN.running: False})
    note = f"Loaded {filename}: {counted(len(spec.rounds), 'round')} replayed."
    if mismatched := result.mismatched_rounds:
        note += (f" {'Round' if len(mismatched) == 1 else 'Rounds'} {', '.join(map(str, mismatched))} came out "
                 "differently on this machine (another model, or float rounding).")
    set_message(state, "trace_error", None)
    set_message(state, "trace", note, level="success")


# ---- an open tab left idle -------------------------------------------------------------------


def keep_open(state: MutableMapping[str, Any], make_draft: MakeDraft, clicked: bool = False) -> Lanes | None:
    """Note that this visitor is here (ui/session/idle_rebuild.py, as on the Step page) and return their
    lanes. Lanes put away while they were idle are first rebuilt exactly: the speculative lane
    from its own rounds, the plain lane caught up again. `clicked`: a button's action follows,
    so an earlier welcome-back note goes. None when there are no lanes or they could not be
    rebuilt."""
    return idle_rebuild.keep_open(state, CHAIN.lanes, generations=lambda lanes: (lanes.speculative, lanes.plain),
                                  rebuild=lambda lanes: _rebuilt(lanes, make_draft), subject="Your two lanes were",
                                  rebuilt_from=lambda lanes: f"their {counted(len(lanes.speculative.rounds), 'round')}",
                                  messages=CHAIN.messages, clicked=clicked)


def _rebuilt(lanes: Lanes, make_draft: MakeDraft) -> Lanes:
    spec, limits = lanes.speculative, rebuild_limits()
    result = replay_speculative(spec.lm, speculative_to_trace(spec), drafts_by_name(spec.lm, make_draft), limits)
    return with_plain_lane(result.generation, limits)


# ---- the race: every method on one prompt ------------------------------------------------------

RACE_METHODS = (PROMPT_LOOKUP, LOOKAHEAD, HEADS, MTP, EARLY_EXIT, SELF_BF16, SELF_INT8)
RACE_TOKENS = 48


def start_race_job(state: MutableMapping[str, Any], lm: LoadedModel, make_draft: MakeDraft, k: int = 4) -> None:
    """Race: plain greedy decoding, then each of RACE_METHODS on the lanes' prompt, on a thread
    of its own (engine/speculative/race.py): the page stays usable and shows each row as it comes.
    One race per visitor at a time; its drafts keep no pictures, so the times are the methods'."""
    lanes, job = current_lanes(state), state.get(CHAIN.race_job)
    if lanes is not None and (job is None or job.done):
        entrants = [Entrant(method, lambda method=method: make_draft(lm, method), k) for method in RACE_METHODS]
        spec = lanes.speculative
        state[CHAIN.race_job] = start_race(lm, spec.prompt, spec.chat, entrants, RACE_TOKENS)


def race_job(state: MutableMapping[str, Any]) -> RaceJob | None:
    """The race under way; once it has ended, its rows (or why it stopped) are kept for the page."""
    if (job := state.get(CHAIN.race_job)) is None or not job.done:
        return job
    del state[CHAIN.race_job]
    state.update({CHAIN.race_rows: list(job.result.all_rows)} if job.result is not None else {})
    set_message(state, "race", job.error)
    return None
