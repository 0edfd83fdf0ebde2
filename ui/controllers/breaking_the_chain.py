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

import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

from engine import (
    Generation,
    GenerationFinished,
    Limits,
    LoadedModel,
    ModelLoadError,
    PromptError,
    PromptLookup,
    SamplerSettings,
    SettingsError,
    SpeculativeGeneration,
    StopSettings,
    TraceError,
    parse_trace,
)
from engine.speculative import (
    DraftMethod,
    DraftModel,
    EarlyExit,
    Lookahead,
    check_k,
    chosen_exit,
    draft_for,
    replay_speculative,
    speculative_to_trace,
)
from engine.speed import measure_prefill_decode
from ui.server.deployment import current_deployment, rebuild_limits, upload_problem
from ui.session import idle_rebuild, settings
from ui.session.keys import CHAIN, STEP
from ui.session.memo import remember
from ui.session.settings import CHAIN_SETTINGS, format_stop_sequences
from ui.views.breaking_the_chain import counted
from ui.views.chips import prompt_chips

PROMPT_LOOKUP = "prompt lookup"
SELF_BF16 = "draft model: bfloat16 copy of this model"
SELF_INT8 = "draft model: int8 copy of this model"
LOOKAHEAD = "lookahead decoding (Jacobi window + n-gram pool)"
EARLY_EXIT = "early exit: the model's own first layers draft"
HEADS = "parallel decoding heads (Medusa-style, trained here)"
MTP = "multi-token prediction module (trained here)"
METHODS = (PROMPT_LOOKUP, LOOKAHEAD, HEADS, MTP, EARLY_EXIT, SELF_BF16, SELF_INT8)
METHOD_OF_NAME = {"prompt-lookup": PROMPT_LOOKUP, "self-draft-bfloat16": SELF_BF16, "self-draft-int8": SELF_INT8,
                  "lookahead": LOOKAHEAD, "medusa-heads": HEADS, "mtp": MTP}


def method_of(name: str) -> str | None:
    """The page's method for a draft's name (a trace's "method"); early exit names its layer."""
    if name.startswith("early-exit-") and name.removeprefix("early-exit-").isdigit():
        return EARLY_EXIT
    return METHOD_OF_NAME.get(name)

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

MakeDraft = Callable[[LoadedModel, str], DraftMethod]
RUN_FRAME_S = 0.3  # each round stays on screen at least this long during a Run


def widget_range(key: str) -> dict[str, float]:
    """A widget's min, max and step (CHAIN keys of SAME_RANGE_AS)."""
    return settings.widget_range(SAME_RANGE_AS[key])


@dataclass(frozen=True)
class Preset:
    name: str
    about: str
    prompt: str
    chat: bool
    temperature: float = 0.0
    max_new_tokens: int = 48
    stop_sequences: str = ""


PRESETS = (
    Preset("Asked to fix the spelling, it copies",
           "Asked to fix a sentence's spelling, this small model writes the sentence back, misspellings and all: "
           "the context already holds most of the next tokens, so prompt lookup guesses them.",
           "Fix the spelling in this sentence and write it out again: The wether in Lndon was cold and rainy, so we "
           "stayed insid and read books all afternon.", True),
    Preset("Repeat a sentence (copying)", "Repeating given text: long runs of guesses survive.",
           "Repeat the following text exactly: Autoregressive models write one token at a time, and every new "
           "token depends on all the tokens before it.", True),
    Preset("Code: edit a given function",
           "Code: the answer reuses the given function's lines, and this small model then repeats itself, which "
           "lookup catches too.",
           "Add a docstring to this function and return the whole function:\n\ndef add_all(items):\n    total = 0\n"
           "    for item in items:\n        total = total + item\n    return total", True),
    Preset("Free-form story (lookup rarely helps)",
           "New text: the context seldom holds the next tokens, so most rounds have no guess and cost one plain "
           "pass.", "The history of the printing press", False),
    Preset("Sampled copying (temperature 0.7)",
           "With sampling, each guess survives with probability min(1, p/q): watch u against it.",
           "Fix the spelling in this sentence and write it out again: The wether in Lndon was cold and rainy, so we "
           "stayed insid and read books all afternon.", True, temperature=0.7),
)
PRESETS_BY_NAME = {p.name: p for p in PRESETS}
DEFAULT_PRESET = PRESETS[0]


@dataclass
class Lanes:
    """The visitor's two generations of the same prompt: speculative and plain."""

    speculative: SpeculativeGeneration
    plain: Generation

    @property
    def identical(self) -> bool:
        """Both lanes hold the same tokens so far (each compared up to the shorter)."""
        spec, plain = self.speculative.generated_ids, self.plain.generated_ids
        shared = min(len(spec), len(plain))
        return spec[:shared] == plain[:shared]


def current_lanes(state: MutableMapping[str, Any]) -> Lanes | None:
    """The visitor's two lanes (None before the page first made them)."""
    return state.get(CHAIN.lanes)


def prompt_html(state: MutableMapping[str, Any], lanes: Lanes) -> str:
    """The prompt's chips: they never change for a prompt, so they are built once."""
    plain = lanes.plain
    return remember(state, CHAIN.memo, ("prompt_chips", plain.lm.source, tuple(plain.prompt_ids)),
                    lambda: prompt_chips(plain.prompt_pieces))


# ---- messages ------------------------------------------------------------------------------


def set_message(state: MutableMapping[str, Any], control: str, text: str | None) -> None:
    settings.set_message(state, control, text, CHAIN.messages)


def message(state: MutableMapping[str, Any], control: str) -> str | None:
    return settings.message(state, control, CHAIN.messages)


# ---- settings from the widgets ---------------------------------------------------------------


def init_defaults(state: MutableMapping[str, Any]) -> None:
    """Every widget's value once (the first preset's prompt), so widgets take no `value=`."""
    if CHAIN.prompt not in state:
        write_preset(state, DEFAULT_PRESET)
    for key, value in WIDGET_DEFAULTS.items():
        state.setdefault(key, value)


def write_preset(state: MutableMapping[str, Any], preset: Preset) -> None:
    """Fill the prompt, chat, temperature and stop widgets from a preset (other filters off)."""
    state.update({CHAIN.prompt: preset.prompt, CHAIN.chat: preset.chat, CHAIN.temperature: preset.temperature,
                  CHAIN.top_k: 0, CHAIN.top_p: 1.0, CHAIN.min_p: 0.0, CHAIN.repetition_penalty: 1.0,
                  CHAIN.max_new_tokens: preset.max_new_tokens, CHAIN.stop_sequences: preset.stop_sequences})


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
        write_preset(state, PRESETS_BY_NAME[name])


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
        state[CHAIN.running] = False
    _pass_settings(state, lanes)
    return lanes


def _active_draft(state: MutableMapping[str, Any], lm: LoadedModel, make_draft: MakeDraft) -> DraftMethod:
    """The draft method in force: the last one that was built without error."""
    return pictured(make_draft(lm, state.get(CHAIN.active_method, PROMPT_LOOKUP)))


def pictured(draft: DraftMethod) -> DraftMethod:
    """The lane's draft keeps a picture of each round's draft for the page (ui/views/draft_pictures.py);
    the race's drafts do not, so their times are the methods' own."""
    if hasattr(draft, "picturing"):
        draft.picturing = True
    return draft


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


def draft_method(lm: LoadedModel, method: str, self_copy: Callable[[LoadedModel, str], LoadedModel]
                 ) -> DraftMethod:
    """A fresh draft method for this visitor (a draft model's KV cache is the visitor's own);
    `self_copy(lm, kind)` gives the shared, read-only bfloat16 or int8 copy of `lm` to draft with."""
    if method == PROMPT_LOOKUP:
        return PromptLookup(lm.eos_ids)
    if method == LOOKAHEAD:
        return Lookahead(lm.eos_ids)
    if method == EARLY_EXIT:  # the layer with the best expected speed-up, measured once per model
        return EarlyExit(lm, chosen_exit(lm).layer)
    if method in (HEADS, MTP):  # the shipped weights, checked once per model (ModelLoadError says why not)
        return draft_for(lm, "medusa-heads" if method == HEADS else "mtp")
    kind = "bfloat16" if method == SELF_BF16 else "int8"
    return DraftModel(self_copy(lm, kind), lm, name=f"self-draft-{kind}")


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
                    if rounds else None)


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


def catch_up(lanes: Lanes) -> None:
    """Plain decoding, one token per forward pass, until it has as many tokens as the speculative lane
    (or a stop condition ends it: with the same settings, at the same token)."""
    target = len(lanes.speculative.generated_ids)
    while len(lanes.plain.steps) < target and not lanes.plain.finished:
        lanes.plain.step()


def reset(state: MutableMapping[str, Any], lm: LoadedModel, make_draft: MakeDraft) -> None:
    """Both lanes start over from the prompt with the current settings."""
    state.pop(CHAIN.lanes, None)
    state[CHAIN.running] = False
    set_message(state, "buttons", None)
    set_message(state, "method", None)
    sync(state, lm, make_draft)


# ---- Run: one round per rerun, paced ----------------------------------------------------------


def start_run(state: MutableMapping[str, Any], make_draft: MakeDraft) -> None:
    """Run: rounds until a stop condition fires, from the prompt in the field now (as Step)."""
    if current_for_round(state, make_draft):
        state[CHAIN.running] = True


def stop_run(state: MutableMapping[str, Any]) -> None:
    state[CHAIN.running] = False


def is_running(state: MutableMapping[str, Any]) -> bool:
    return bool(state.get(CHAIN.running))


def advance_run(state: MutableMapping[str, Any]) -> None:
    """One round of a Run; the Run ends when the generation finishes or a round fails."""
    _round(state)
    run_should_continue(state)


def run_should_continue(state: MutableMapping[str, Any]) -> bool:
    """After a Run's round: go on unless the generation finished or a round failed."""
    lanes: Lanes | None = state.get(CHAIN.lanes)
    keep_going = lanes is not None and not lanes.speculative.finished and message(state, "buttons") is None
    state[CHAIN.running] = keep_going and bool(state.get(CHAIN.running))
    return state[CHAIN.running]


def run_frame_wait(started: float, now: float) -> float:
    """Seconds to wait before the Run's next round, so this one stays on screen RUN_FRAME_S
    (`started`, `now`: time.monotonic() when the round began, and now)."""
    return max(0.0, RUN_FRAME_S - (now - started))


def measure(state: MutableMapping[str, Any], lm: LoadedModel) -> None:
    """The KV cache & speed page's measurement: the prompt in one pass against one token per pass."""
    state[CHAIN.measured] = measure_prefill_decode(lm, prompt_tokens=16, decode_steps=4, repeats=3)


@dataclass(frozen=True)
class Counts:
    """The running totals the page compares."""

    tokens: int  # produced by the speculative lane
    target_passes: int  # forward passes of the target model, speculative lane
    plain_passes: int  # forward passes, plain lane (one per token)
    drafted: int
    checked: int
    accepted: int

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / self.target_passes if self.target_passes else 0.0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.checked if self.checked else None


def counts(lanes: Lanes) -> Counts:
    rounds = lanes.speculative.rounds
    return Counts(tokens=len(lanes.speculative.generated_ids), target_passes=len(rounds),
                  plain_passes=len(lanes.plain.steps), drafted=sum(len(r.drafted) for r in rounds),
                  checked=sum(len(r.checks) for r in rounds), accepted=sum(r.accepted for r in rounds))


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
        result = replay_speculative(lm, parse_trace(data, limits), _drafts_by_name(lm, make_draft), limits)
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
    lanes = _with_plain_lane(spec, limits)
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
    set_message(state, "trace", note)


def _drafts_by_name(lm: LoadedModel, make_draft: MakeDraft) -> Callable[[str], DraftMethod]:
    """A trace names each round's draft method; this makes the visitor's own of each."""

    def draft_named(name: str) -> DraftMethod:
        if (method := method_of(name)) is None:
            raise SettingsError("draft method", name, f"one of {', '.join(METHOD_OF_NAME)} or early-exit-<layer>")
        if method == EARLY_EXIT:  # the very layer the trace drafted with
            return pictured(EarlyExit(lm, int(name.removeprefix("early-exit-"))))
        return pictured(make_draft(lm, method))

    return draft_named


def _with_plain_lane(spec: SpeculativeGeneration, limits: Limits) -> Lanes:
    """Both lanes for a replayed speculative generation: plain decoding made again with the
    same settings, to as many tokens."""
    plain = Generation(spec.lm, spec.prompt, chat=spec.chat, system_prompt=spec.system_prompt, sampler=spec.sampler,
                       stop=spec.stop, seed=spec.seed, allow_special=spec.allow_special, limits=limits)
    lanes = Lanes(spec, plain)
    catch_up(lanes)
    return lanes


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
    result = replay_speculative(spec.lm, speculative_to_trace(spec), _drafts_by_name(spec.lm, make_draft), limits)
    return _with_plain_lane(result.generation, limits)


# ---- the race: every method on one prompt ------------------------------------------------------


@dataclass(frozen=True)
class RaceRow:
    """One method's greedy run of the race prompt, measured here."""

    method: str
    label: str
    tokens: int
    passes: int
    ms_per_token: float
    acceptance: float | None  # guesses kept / guesses checked
    by_position: tuple[float, ...]  # per guessed position: kept / reached
    same_text: bool  # the tokens equal plain decoding's

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / self.passes if self.passes else 0.0


RACE_METHODS = (PROMPT_LOOKUP, LOOKAHEAD, HEADS, MTP, EARLY_EXIT, SELF_BF16)  # int8 drafts as bf16, slower
RACE_TOKENS = 48


def _by_position(rounds: tuple[Any, ...], k: int) -> tuple[float, ...]:
    reached, kept = [0] * k, [0] * k
    for record in rounds:
        for index in range(min(k, len(record.checks))):
            reached[index] += 1
            kept[index] += index < record.accepted
    return tuple(kept[i] / reached[i] for i in range(k) if reached[i])


def race(lm: LoadedModel, prompt: str, chat: bool, make_draft: MakeDraft, k: int = 4, tokens: int | None = None,
         methods: tuple[str, ...] | None = None, progress: Callable[[int, int], None] | None = None
         ) -> list[RaceRow]:
    """Plain greedy decoding, then each method (RACE_METHODS unless told) on the same prompt and
    settings, one after another on this thread (a race measures each alone), ms per token after
    the prompt's pass."""
    methods = RACE_METHODS if methods is None else methods
    stop = StopSettings(max_new_tokens=RACE_TOKENS if tokens is None else tokens)
    greedy = SamplerSettings(temperature=0.0)
    plain = Generation(lm, prompt, chat=chat, sampler=greedy, stop=stop)
    plain.step()  # the prompt's pass: not a decode step, timed apart from the race
    started = time.perf_counter()
    for _ in plain.run():
        pass
    decode = len(plain.generated_ids) - 1
    plain_ms = (time.perf_counter() - started) * 1e3 / max(1, decode)
    expected = plain.generated_ids
    rows = [RaceRow("plain", "plain decoding (one token per pass)", len(expected), len(expected), plain_ms, None, (),
                    True)]
    plain.close()
    for done, method in enumerate(methods, start=1):
        try:
            draft = make_draft(lm, method)
        except (ModelLoadError, SettingsError):  # e.g. trained heads on another model: not in this race
            continue
        spec = SpeculativeGeneration(lm, prompt, chat=chat, draft=draft, k=min(k, getattr(draft, "max_k", k)),
                                     sampler=greedy, stop=stop)
        first = spec.step()
        started = time.perf_counter()
        for _ in spec.run():
            pass
        after = len(spec.generated_ids) - len(first.emitted)
        rows.append(RaceRow(spec.draft.name, method, len(spec.generated_ids), spec.forward_passes,
                            (time.perf_counter() - started) * 1e3 / max(1, after), spec.acceptance_rate,
                            _by_position(spec.rounds, k), spec.generated_ids == expected))
        spec.close()
        if progress is not None:
            progress(done, len(methods))
    return rows
