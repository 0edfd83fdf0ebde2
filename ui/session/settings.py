"""Settings read from a page's widgets, for every page that has them: sampler and stop
settings from a page's widgets (`SettingWidgets`: the Step page's, the chain page's), the
widgets' ranges and defaults, the messages shown beside a control, and the visitor's own
Step-page Generation in their session state (the Sampler lab and the Class page read it too).
The model is shared; nothing here is. The keys themselves are in ui/session/keys.py."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from engine import Generation, LoadedModel, SamplerSettings, SettingsError, StopSettings, escape, unescape
from ui.server.deployment import current_deployment
from ui.session.keys import CHAIN, STEP

DEFAULT_PROMPT = "The capital of France is"
# The seed decides every random draw u of a sampled generation. Seed 0's first draw is 0.970, so
# every default demo began with an unlikely pick; seed 14 draws 0.556, 0.442, 0.636, 0.480, 0.339
# first: the typical picks a first demo should show.
DEFAULT_SEED = 14
DETAIL_VIEWS = ("Termination", "Inside the pass", "P(sequence)", "KV cache", "History", "Share")  # the Step page's
WIDGET_DEFAULTS: dict[str, Any] = {
    STEP.prompt: DEFAULT_PROMPT, STEP.chat: False, STEP.allow_special: False, STEP.seed: DEFAULT_SEED,
    STEP.temperature: 0.0, STEP.top_k: 0, STEP.top_p: 1.0, STEP.min_p: 0.0, STEP.repetition_penalty: 1.0,
    STEP.chain: "transformers", STEP.max_new_tokens: 32, STEP.stop_sequences: "", STEP.ignore_eos: False,
    STEP.chart_mode: "probability", STEP.sequence_basis: "raw", STEP.tabs: DETAIL_VIEWS[0],
}

# The widgets' ranges (min, max, step). Settings from a link or a trace must fit them: a
# widget cannot show a value outside its range.
RANGES: dict[str, tuple[float, float, float]] = {
    STEP.temperature: (0.0, 2.0, 0.05), STEP.top_k: (0, 100, 1), STEP.top_p: (0.0, 1.0, 0.01),
    STEP.min_p: (0.0, 1.0, 0.01), STEP.repetition_penalty: (0.5, 2.0, 0.05), STEP.max_new_tokens: (1, 4096, 1),
    STEP.seed: (0, 2**31 - 1, 1),
}
RANGE_NAMES = {STEP.temperature: "temperature", STEP.top_k: "top_k", STEP.top_p: "top_p", STEP.min_p: "min_p",
               STEP.repetition_penalty: "repetition_penalty", STEP.max_new_tokens: "max_new_tokens",
               STEP.seed: "seed"}


def ranges() -> dict[str, tuple[float, float, float]]:
    """RANGES with max new tokens capped at this server's limit."""
    low, high, step = RANGES[STEP.max_new_tokens]
    cap = current_deployment().limits.max_new_tokens
    return RANGES | {STEP.max_new_tokens: (low, min(high, cap), step)}


def widget_range(key: str) -> dict[str, float]:
    """A widget's min, max and step, from the one table links and traces are checked against."""
    low, high, step = ranges()[key]
    return {"min_value": low, "max_value": high, "step": step}


@dataclass(frozen=True)
class Setup:
    """What defines a generation from its first token: changing any of it starts over."""

    model: LoadedModel
    prompt: str
    chat: bool
    seed: int
    allow_special: bool  # chat mode: typed special-token text becomes special tokens


def slider_range(key: str, state: Mapping[str, Any]) -> dict[str, Any]:
    """A slider's range and its value now. The value is the one session state already holds,
    so it never differs from what a preset, link or trace set. Without it, Streamlit copies the
    whole session state on every run to learn whether the slider picks a range (a cost per
    slider on every Step click, seen in a profile of the server; figures in docs/decisions.md)."""
    return widget_range(key) | {"value": state[key]}


def init_defaults(state: MutableMapping[str, Any]) -> None:
    """Give every widget its default once, so that a widget's value always comes from session
    state, whatever set it (a preset, a share link, a trace)."""
    for key, value in WIDGET_DEFAULTS.items():
        state.setdefault(key, value)


def parse_stop_sequences(text: str) -> tuple[str, ...]:
    """One stop sequence per line; `\\n`, `\\t` and `\\\\` are written as escapes so a stop
    sequence can contain a newline."""
    return tuple(unescape(line) for line in text.splitlines() if line)


def format_stop_sequences(sequences: tuple[str, ...]) -> str:
    """The inverse of parse_stop_sequences: one escaped sequence per line."""
    return "\n".join(escape(s) for s in sequences)


@dataclass(frozen=True)
class SettingWidgets:
    """The keys of the widgets a page sets the sampler and the stop settings with. A page
    without a chain-order or ignore-EOS widget leaves that key None: the setting's default."""

    temperature: str
    top_k: str
    top_p: str
    min_p: str
    repetition_penalty: str
    max_new_tokens: str
    stop_sequences: str
    chain: str | None = None
    ignore_eos: str | None = None


STEP_SETTINGS = SettingWidgets(STEP.temperature, STEP.top_k, STEP.top_p, STEP.min_p, STEP.repetition_penalty,
                               STEP.max_new_tokens, STEP.stop_sequences, chain=STEP.chain, ignore_eos=STEP.ignore_eos)
CHAIN_SETTINGS = SettingWidgets(CHAIN.temperature, CHAIN.top_k, CHAIN.top_p, CHAIN.min_p, CHAIN.repetition_penalty,
                                CHAIN.max_new_tokens, CHAIN.stop_sequences)


def sampler_from(state: Mapping[str, Any], widgets: SettingWidgets = STEP_SETTINGS) -> SamplerSettings:
    """The sampler a page's widgets describe, the Step page's by default (raises SettingsError
    when a value is not allowed). Every page reads its sampler widgets through here."""
    chain = {} if widgets.chain is None else {"chain": state[widgets.chain]}
    return SamplerSettings(temperature=round(float(state[widgets.temperature]), 4), top_k=int(state[widgets.top_k]),
                           top_p=round(float(state[widgets.top_p]), 4), min_p=round(float(state[widgets.min_p]), 4),
                           repetition_penalty=round(float(state[widgets.repetition_penalty]), 4), **chain)


# the engine's parameter names as the widgets label them
WIDGET_LABELS = {
    "temperature": "Temperature", "top_k": "Top-k", "top_p": "Top-p", "min_p": "Min-p",
    "repetition_penalty": "Repetition penalty", "chain": "Chain order", "seed": "Seed",
    "max_new_tokens": "Max new tokens", "stop_sequences": "Stop sequences", "ignore_eos": "Ignore EOS",
}


def setting_problem(exc: SettingsError) -> str:
    """An engine settings error in a visitor's words: the widget's label, the value as typed (a
    count for a list of stop sequences, never a Python tuple), and what is allowed."""
    label = WIDGET_LABELS.get(exc.parameter)
    if label is None:
        return str(exc)
    value = exc.value
    if isinstance(value, tuple | list):
        count = len(value)
        given = f"{count} {'sequence' if count == 1 else 'sequences'}"
    elif isinstance(value, str):
        given = f"“{value[:40]}{'…' if len(value) > 40 else ''}” ({len(value):,} characters)"
    else:
        given = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
    return f"{label}: {given} is not allowed; {exc.allowed}."


def stop_from(state: Mapping[str, Any], widgets: SettingWidgets = STEP_SETTINGS) -> StopSettings:
    """The stop settings a page's widgets describe, the Step page's by default (raises
    SettingsError when not allowed). Every page reads its stop widgets through here."""
    ignore_eos = widgets.ignore_eos is not None and bool(state[widgets.ignore_eos])
    return StopSettings(max_new_tokens=int(state[widgets.max_new_tokens]),
                        stop_sequences=parse_stop_sequences(state[widgets.stop_sequences]), ignore_eos=ignore_eos)


def setup_from(state: MutableMapping[str, Any], lm: LoadedModel) -> Setup:
    return Setup(model=lm, prompt=state[STEP.prompt], chat=bool(state[STEP.chat]), seed=int(state[STEP.seed]),
                 allow_special=bool(state[STEP.allow_special]))


def setup_of(generation: Generation) -> Setup:
    return Setup(model=generation.lm, prompt=generation.prompt, chat=generation.chat, seed=generation.seed,
                 allow_special=generation.allow_special)


def write_sampler(state: MutableMapping[str, Any], sampler: SamplerSettings) -> None:
    """Put a sampler's values into the widgets (before they are drawn)."""
    state.update({STEP.temperature: sampler.temperature, STEP.top_k: sampler.top_k, STEP.top_p: sampler.top_p,
                  STEP.min_p: sampler.min_p, STEP.repetition_penalty: sampler.repetition_penalty,
                  STEP.chain: sampler.chain})


def write_stop(state: MutableMapping[str, Any], stop: StopSettings) -> None:
    """Put stop settings into the widgets (before they are drawn)."""
    state.update({STEP.max_new_tokens: stop.max_new_tokens,
                  STEP.stop_sequences: format_stop_sequences(stop.stop_sequences), STEP.ignore_eos: stop.ignore_eos})


def outside_ranges(values: dict[str, Any]) -> str | None:
    """What does not fit the widgets' ranges, in words, or None when everything fits."""
    for key, (low, high, _) in ranges().items():
        if key in values and not low <= values[key] <= high:
            return (f"{RANGE_NAMES[key]} = {values[key]!r} is outside what this page's controls allow "
                    f"({low:g} to {high:g}).")
    return None


def write_generation(state: MutableMapping[str, Any], generation: Generation) -> str | None:
    """Make the widgets describe `generation` and make it the visitor's current one. Returns
    why not (and changes nothing) when a setting does not fit a widget's range."""
    values: dict[str, Any] = {STEP.prompt: generation.prompt, STEP.chat: generation.chat,
                              STEP.seed: generation.seed, STEP.allow_special: generation.allow_special}
    scratch: dict[str, Any] = {}
    write_sampler(scratch, generation.sampler)
    write_stop(scratch, generation.stop)
    values.update(scratch)
    if problem := outside_ranges(values):
        return problem
    state.update(values)
    state[STEP.generation] = generation
    return None


def step_generation(state: Mapping[str, Any]) -> Generation | None:
    """The visitor's Generation on the Step-through page (None before the page first ran).
    Every page reads it through here, so there is one key for it."""
    return state.get(STEP.generation)


MESSAGE_LEVELS = ("error", "warning", "info", "success")  # as Streamlit's st.error … st.success


@dataclass(frozen=True)
class Message:
    """A message shown beside a control, with how the page shows it: a problem ("error",
    "warning") or a note ("info", "success")."""

    text: str
    level: str = "error"


def set_message(state: MutableMapping[str, Any], control: str, message: str | None,
                store: str = STEP.messages, level: str = "error") -> None:
    """Remember (or clear, with None) the message shown beside a control, at `level` (one of
    MESSAGE_LEVELS); `store` is the page's key for its messages (the Step page's by default)."""
    if level not in MESSAGE_LEVELS:
        raise ValueError(f"message level {level!r}: one of {', '.join(MESSAGE_LEVELS)}")
    messages = state.setdefault(store, {})
    if message is None:
        messages.pop(control, None)
    else:
        messages[control] = Message(message, level)


def notice(state: Mapping[str, Any], control: str, store: str = STEP.messages) -> Message | None:
    """The message beside a control with its level (None when there is none)."""
    return state.get(store, {}).get(control)


def message(state: Mapping[str, Any], control: str, store: str = STEP.messages) -> str | None:
    """The text of the message beside a control."""
    return None if (note := notice(state, control, store)) is None else note.text
