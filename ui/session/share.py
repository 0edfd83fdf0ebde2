"""Share links: the whole state of a generation in URL query parameters, and back.

A link holds the model, prompt, chat flag, seed, the current sampler and stop settings and
every step's token (forced ones marked `!`). Steps taken under other sampler settings than
the current ones carry them in `s` entries ("from step N on: settings"). Opening the link
replays the steps on the model with engine.trace.replay, so every number is recomputed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from engine import TRACE_FORMAT, TRACE_VERSION, Generation, SamplerSettings, StopSettings, shown


class ShareError(ValueError):
    """A share link's parameters cannot be read."""


@dataclass(frozen=True)
class SharedStep:
    token_id: int
    forced: bool
    sampler: SamplerSettings


@dataclass(frozen=True)
class SharedState:
    """Everything a link reproduces."""

    model: str  # what was typed to load it; "" = the bundled default
    draw: str  # the engine's draw method
    prompt: str
    chat: bool
    allow_special: bool  # chat mode: typed special-token text read as special tokens
    seed: int
    sampler: SamplerSettings
    stop: StopSettings
    steps: tuple[SharedStep, ...]


def from_generation(generation: Generation, model: str) -> SharedState:
    """The shareable state of a live generation."""
    steps = tuple(SharedStep(s.token_id, s.decision.forced, s.decision.settings) for s in generation.steps)
    return SharedState(model=model, draw=generation.draw, prompt=generation.prompt, chat=generation.chat,
                       allow_special=generation.allow_special,
                       seed=generation.seed, sampler=generation.sampler, stop=generation.stop, steps=steps)


def _sampler_code(sampler: SamplerSettings) -> str:
    return (f"{sampler.temperature!r}/{sampler.top_k}/{sampler.top_p!r}/{sampler.min_p!r}/"
            f"{sampler.repetition_penalty!r}/{sampler.chain}")


def _sampler_from_code(code: str) -> SamplerSettings:
    try:
        t, k, p, min_p, rep, chain = code.split("/")
        return SamplerSettings(temperature=float(t), top_k=int(k), top_p=float(p), min_p=float(min_p),
                               repetition_penalty=float(rep), chain=chain)
    except (ValueError, TypeError) as exc:  # SettingsError is a ValueError and says why
        raise ShareError(f"The link's sampler settings {shown(code)} cannot be used: {exc}") from exc


def to_params(state: SharedState) -> dict[str, str | list[str]]:
    """Query parameters for a share link (strings, repeated keys as lists)."""
    params: dict[str, str | list[str]] = {"prompt": state.prompt, "chat": str(int(state.chat)),
                                          "seed": str(state.seed), "sampler": _sampler_code(state.sampler),
                                          "max": str(state.stop.max_new_tokens)}
    if state.model:
        params["model"] = state.model
    if state.draw != "cdf":
        params["draw"] = state.draw
    if state.allow_special:
        params["special"] = "1"
    if state.stop.stop_sequences:
        params["stop"] = list(state.stop.stop_sequences)
    if state.stop.ignore_eos:
        params["ignore_eos"] = "1"
    if state.steps:
        params["tokens"] = ",".join(f"{s.token_id}{'!' if s.forced else ''}" for s in state.steps)
    if any(s.sampler != state.sampler for s in state.steps):
        changes, previous = [], None
        for index, step in enumerate(state.steps, start=1):
            if step.sampler != previous:
                changes.append(f"{index}:{_sampler_code(step.sampler)}")
                previous = step.sampler
        params["s"] = changes
    return params


def _one(params: Mapping[str, Sequence[str]], key: str, default: str | None = None) -> str:
    values = params.get(key) or ([] if default is None else [default])
    if not values:
        raise ShareError(f"The link has no '{key}' parameter.")
    return values[-1]


def _flag(params: Mapping[str, Sequence[str]], key: str) -> bool:
    value = _one(params, key, "0")
    if value not in ("0", "1"):
        raise ShareError(f"The link's '{key}' must be 0 or 1, not {shown(value)}.")
    return value == "1"


# ASCII digits only ('²'.isdigit() is true, and int() refuses it), and few enough to print
WHOLE = re.compile(r"[0-9]{1,100}")  # any size: the settings then name their own range


def _int(params: Mapping[str, Sequence[str]], key: str, default: str) -> int:
    value = _one(params, key, default)
    if not WHOLE.fullmatch(value):
        raise ShareError(f"The link's '{key}' must be a whole number, not {shown(value)}.")
    return int(value)


def _steps(params: Mapping[str, Sequence[str]], current: SamplerSettings) -> tuple[SharedStep, ...]:
    tokens = [t for t in _one(params, "tokens", "").split(",") if t]
    changes: dict[int, SamplerSettings] = {}
    for entry in params.get("s", []):
        index, _, code = entry.partition(":")
        if not WHOLE.fullmatch(index):
            raise ShareError(f"The link's sampler change {shown(entry)} must look like 'step:settings'.")
        changes[int(index)] = _sampler_from_code(code)
    steps, sampler = [], current
    for index, token in enumerate(tokens, start=1):
        sampler = changes.get(index, sampler)
        forced = token.endswith("!")
        if not WHOLE.fullmatch(token.removesuffix("!")):
            raise ShareError(f"The link's token {shown(token)} must be a token id, optionally followed by '!'.")
        steps.append(SharedStep(int(token.removesuffix("!")), forced, sampler))
    return tuple(steps)


def from_params(params: Mapping[str, Sequence[str]]) -> SharedState:
    """Read a link's parameters (each key to its list of values). Raises ShareError or the
    engine's SettingsError with a message that names the bad parameter."""
    sampler = _sampler_from_code(_one(params, "sampler", _sampler_code(SamplerSettings())))
    stop = StopSettings(max_new_tokens=_int(params, "max", "32"),
                        stop_sequences=tuple(params.get("stop", [])), ignore_eos=_flag(params, "ignore_eos"))
    return SharedState(model=_one(params, "model", ""), draw=_one(params, "draw", "cdf"),
                       prompt=_one(params, "prompt"), chat=_flag(params, "chat"),
                       allow_special=_flag(params, "special"), seed=_int(params, "seed", "0"),
                       sampler=sampler, stop=stop, steps=_steps(params, sampler))


def replay_trace(state: SharedState) -> dict[str, Any]:
    """The smallest trace engine.trace.replay accepts, built from a link's state."""
    return {
        "format": TRACE_FORMAT, "version": TRACE_VERSION, "prompt": state.prompt, "chat": state.chat,
        "allow_special": state.allow_special,
        "seed": state.seed, "draw": state.draw, "sampler": asdict(state.sampler),
        "stop": asdict(state.stop) | {"stop_sequences": list(state.stop.stop_sequences)},
        "prompt_token_ids": [], "finish_reason": None, "text": "",
        "steps": [{"index": i, "token_id": s.token_id, "sampler": asdict(s.sampler), "forced": s.forced}
                  for i, s in enumerate(state.steps, start=1)],
    }
