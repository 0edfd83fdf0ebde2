"""Per-visitor state for the step-through page: widget keys, the settings they make, and
the visitor's own Generation in st.session_state. The model is shared; nothing here is."""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from engine import Generation, LoadedModel, SamplerSettings, StopSettings

# Widget keys, namespaced "st_" for the step-through page.
PROMPT = "st_prompt"
PRESET = "st_preset"
CHAT = "st_chat"
SEED = "st_seed"
TEMPERATURE = "st_temperature"
TOP_K = "st_top_k"
TOP_P = "st_top_p"
MIN_P = "st_min_p"
REPETITION = "st_repetition_penalty"
CHAIN = "st_chain"
MAX_NEW = "st_max_new_tokens"
STOPS = "st_stop_sequences"
IGNORE_EOS = "st_ignore_eos"
CHART_MODE = "st_chart_mode"
SEQ_BASIS = "st_sequence_basis"
PRESENTATION = "app_presentation"  # app-wide: the sidebar's presentation-mode toggle
# Non-widget keys.
GENERATION = "st_generation"
MESSAGES = "st_messages"  # control name -> message shown beside that control
RUNNING = "st_running"
RUN_FRAME_STARTED = "st_run_frame_started"  # when the Run's current token began

# A Run shows each token for at least this long. The server makes a token in ~60 ms, but a
# browser on a small machine needs ~250 ms of main-thread work to draw the workspace: unpaced,
# tokens queued up in the browser, it fell seconds behind the server, and Stop seemed ignored.
RUN_FRAME_S = 0.3

DEFAULT_PROMPT = "The capital of France is"
WIDGET_DEFAULTS: dict[str, Any] = {
    PROMPT: DEFAULT_PROMPT, CHAT: False, SEED: 0,
    TEMPERATURE: 0.0, TOP_K: 0, TOP_P: 1.0, MIN_P: 0.0, REPETITION: 1.0, CHAIN: "transformers",
    MAX_NEW: 32, STOPS: "", IGNORE_EOS: False,
    CHART_MODE: "probability", SEQ_BASIS: "raw",
}

# The widgets' ranges (min, max, step). Settings from a link or a trace must fit them: a
# widget cannot show a value outside its range.
RANGES: dict[str, tuple[float, float, float]] = {
    TEMPERATURE: (0.0, 2.0, 0.05), TOP_K: (0, 100, 1), TOP_P: (0.0, 1.0, 0.01), MIN_P: (0.0, 1.0, 0.01),
    REPETITION: (0.5, 2.0, 0.05), MAX_NEW: (1, 4096, 1), SEED: (0, 2**31 - 1, 1),
}
RANGE_NAMES = {TEMPERATURE: "temperature", TOP_K: "top_k", TOP_P: "top_p", MIN_P: "min_p",
               REPETITION: "repetition_penalty", MAX_NEW: "max_new_tokens", SEED: "seed"}


@dataclass(frozen=True)
class Setup:
    """What defines a generation from its first token: changing any of it starts over."""

    model: LoadedModel
    prompt: str
    chat: bool
    seed: int


def init_defaults(state: MutableMapping[str, Any]) -> None:
    """Give every widget its default once, so widgets never need a `value=` argument (which
    would clash with values set by presets, share links and traces)."""
    for key, value in WIDGET_DEFAULTS.items():
        state.setdefault(key, value)


def parse_stop_sequences(text: str) -> tuple[str, ...]:
    """One stop sequence per line; `\\n`, `\\t` and `\\\\` are written as escapes so a stop
    sequence can contain a newline."""
    sequences = []
    for line in text.splitlines():
        if line:
            sequences.append(_unescape(line))
    return tuple(sequences)


def format_stop_sequences(sequences: tuple[str, ...]) -> str:
    """The inverse of parse_stop_sequences: one escaped sequence per line."""
    return "\n".join(s.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t") for s in sequences)


def _unescape(line: str) -> str:
    out, i = [], 0
    while i < len(line):
        if line[i] == "\\" and i + 1 < len(line) and line[i + 1] in "nt\\":
            out.append({"n": "\n", "t": "\t", "\\": "\\"}[line[i + 1]])
            i += 2
        else:
            out.append(line[i])
            i += 1
    return "".join(out)


def sampler_from(state: MutableMapping[str, Any]) -> SamplerSettings:
    """The sampler the widgets describe (raises SettingsError when a value is not allowed)."""
    return SamplerSettings(temperature=round(float(state[TEMPERATURE]), 4), top_k=int(state[TOP_K]),
                           top_p=round(float(state[TOP_P]), 4), min_p=round(float(state[MIN_P]), 4),
                           repetition_penalty=round(float(state[REPETITION]), 4), chain=state[CHAIN])


def stop_from(state: MutableMapping[str, Any]) -> StopSettings:
    """The stop settings the widgets describe (raises SettingsError when not allowed)."""
    return StopSettings(max_new_tokens=int(state[MAX_NEW]),
                        stop_sequences=parse_stop_sequences(state[STOPS]),
                        ignore_eos=bool(state[IGNORE_EOS]))


def setup_from(state: MutableMapping[str, Any], lm: LoadedModel) -> Setup:
    return Setup(model=lm, prompt=state[PROMPT], chat=bool(state[CHAT]), seed=int(state[SEED]))


def setup_of(generation: Generation) -> Setup:
    return Setup(model=generation.lm, prompt=generation.prompt, chat=generation.chat, seed=generation.seed)


def write_sampler(state: MutableMapping[str, Any], sampler: SamplerSettings) -> None:
    """Put a sampler's values into the widgets (before they are drawn)."""
    state.update({TEMPERATURE: sampler.temperature, TOP_K: sampler.top_k, TOP_P: sampler.top_p,
                  MIN_P: sampler.min_p, REPETITION: sampler.repetition_penalty, CHAIN: sampler.chain})


def write_stop(state: MutableMapping[str, Any], stop: StopSettings) -> None:
    """Put stop settings into the widgets (before they are drawn)."""
    state.update({MAX_NEW: stop.max_new_tokens, STOPS: format_stop_sequences(stop.stop_sequences),
                  IGNORE_EOS: stop.ignore_eos})


def outside_ranges(values: dict[str, Any]) -> str | None:
    """What does not fit the widgets' ranges, in words, or None when everything fits."""
    for key, (low, high, _) in RANGES.items():
        if key in values and not low <= values[key] <= high:
            return (f"{RANGE_NAMES[key]} = {values[key]!r} is outside what this page's controls allow "
                    f"({low:g} to {high:g}).")
    return None


def write_generation(state: MutableMapping[str, Any], generation: Generation) -> str | None:
    """Make the widgets describe `generation` and make it the visitor's current one. Returns
    why not (and changes nothing) when a setting does not fit a widget's range."""
    values: dict[str, Any] = {PROMPT: generation.prompt, CHAT: generation.chat, SEED: generation.seed}
    scratch: dict[str, Any] = {}
    write_sampler(scratch, generation.sampler)
    write_stop(scratch, generation.stop)
    values.update(scratch)
    if problem := outside_ranges(values):
        return problem
    state.update(values)
    state[GENERATION] = generation
    return None


def set_message(state: MutableMapping[str, Any], control: str, message: str | None) -> None:
    """Remember (or clear, with None) the message shown beside a control."""
    messages = state.setdefault(MESSAGES, {})
    if message is None:
        messages.pop(control, None)
    else:
        messages[control] = message


def message(state: MutableMapping[str, Any], control: str) -> str | None:
    return state.get(MESSAGES, {}).get(control)
