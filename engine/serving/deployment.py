"""How a server is deployed: which models visitors may load and what each visitor's work may
cost. Read once from environment variables; the defaults keep the local app as it always was.

    TBT_PRESET=public          the public preset: every setting below at its public value
    TBT_ALLOWED_MODELS=a,b     model sources visitors may load ("bundled" is the bundled model)
    TBT_MODEL_FIELD=0|1        whether the sidebar offers a field to type a model
    TBT_HIDE_PATHS=0|1         error messages never name a path on the server
    TBT_MAX_PROMPT_TOKENS=N    prompt tokens (below the context window)
    TBT_MAX_NEW_TOKENS=N       max new tokens a visitor may ask for
    TBT_MAX_REPLAY_STEPS=N     steps a share link or a trace may replay
    TBT_REPLAY_SECONDS=S       server time one replay may take
    TBT_MAX_UPLOAD_MB=N        size of an uploaded trace
    TBT_MAX_LINK_CHARS=N       length of a share link's query
    TBT_IDLE_MINUTES=M         minutes a tab may sit idle before its generation is put away

A setting given explicitly overrides the preset's value for it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from engine.errors import ModelLoadError, SettingsError
from engine.limits import Limits
from engine.loading import BUNDLED

ENV_PREFIX = "TBT_"


@dataclass(frozen=True)
class Deployment:
    """Who may load which model, and the caps on each visitor's work."""

    preset: str  # "local" or "public"
    allowed_models: tuple[str, ...] | None  # None: any source the machine can load
    model_field: bool  # visitors may type a model source
    hide_paths: bool  # error messages never name server paths
    limits: Limits
    idle_minutes: float = 30.0  # an open tab idle this long has its generation put away (engine/serving/idle.py)

    def check_model(self, source: str) -> None:
        """Refuse a model source this deployment does not allow, before anything is read."""
        name = source.strip() or BUNDLED
        if self.allowed_models is not None and name not in self.allowed_models:
            allowed = ", ".join(self.allowed_models)
            raise ModelLoadError(f"This server runs only these models: {allowed}. "
                                 f"'{name[:80]}' is not among them.")

    def describe_error(self, error: Exception) -> str:
        """An error's message as a visitor may see it: without server paths when hidden."""
        return redact_paths(str(error)) if self.hide_paths else str(error)

    def shareable_trace(self, trace: dict[str, Any]) -> dict[str, Any]:
        """A trace as a visitor may download it: where paths are hidden, the model is named
        but not where its file lies on the server (a replay never reads that location)."""
        model = trace.get("model")
        if not self.hide_paths or not isinstance(model, dict) or "location" not in model:
            return trace
        return {**trace, "model": {**model, "location": None if model.get("source") != "hub" else model["location"]}}


LOCAL = Deployment(preset="local", allowed_models=None, model_field=True, hide_paths=False, limits=Limits())
PUBLIC = Deployment(
    preset="public", allowed_models=(BUNDLED,), model_field=False, hide_paths=True,
    limits=Limits(max_prompt_tokens=512, max_new_tokens=256, max_replay_steps=256, replay_seconds=5.0,
                  max_upload_bytes=2**20, max_link_chars=16_000),
    idle_minutes=10.0,
)
PRESETS = {"local": LOCAL, "public": PUBLIC}

PATH = re.compile(r"(?:~|\.{1,2})?/[^\s'\"`:,;)]+")


def redact_paths(message: str) -> str:
    """Replace anything that looks like a file-system path with '<path>'."""
    return PATH.sub("<path>", message)


def _whole(name: str, text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise SettingsError(ENV_PREFIX + name, text, "a whole number >= 1")
    return int(text)


def _positive(unit: str) -> Callable[[str, str], float]:
    """A parser for a number of `unit` above 0 (and finite)."""

    def parse(name: str, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not 0 < value < float("inf"):
            raise SettingsError(ENV_PREFIX + name, text, f"a number of {unit} > 0")
        return value

    return parse


def _flag(name: str, text: str) -> bool:
    if text.strip() not in ("0", "1"):
        raise SettingsError(ENV_PREFIX + name, text, "0 or 1")
    return text.strip() == "1"


def _models(name: str, text: str) -> tuple[str, ...]:
    models = tuple(part.strip() for part in text.split(",") if part.strip())
    if not models:
        raise SettingsError(ENV_PREFIX + name, text, "model sources separated by commas, e.g. bundled")
    return models


# environment variable (without the prefix) -> (field, parser); limits' fields are under Limits
DEPLOYMENT_VARIABLES: dict[str, tuple[str, Callable[[str, str], object]]] = {
    "ALLOWED_MODELS": ("allowed_models", _models), "MODEL_FIELD": ("model_field", _flag),
    "HIDE_PATHS": ("hide_paths", _flag), "IDLE_MINUTES": ("idle_minutes", _positive("minutes")),
}
LIMIT_VARIABLES: dict[str, tuple[str, Callable[[str, str], object]]] = {
    "MAX_PROMPT_TOKENS": ("max_prompt_tokens", _whole), "MAX_NEW_TOKENS": ("max_new_tokens", _whole),
    "MAX_REPLAY_STEPS": ("max_replay_steps", _whole), "REPLAY_SECONDS": ("replay_seconds", _positive("seconds")),
    "MAX_UPLOAD_MB": ("max_upload_bytes", lambda name, text: _whole(name, text) * 2**20),
    "MAX_LINK_CHARS": ("max_link_chars", _whole),
}


def _overrides(environ: Mapping[str, str], variables: Mapping[str, tuple[str, Callable[[str, str], object]]]
               ) -> dict[str, object]:
    return {field: parse(name, environ[ENV_PREFIX + name]) for name, (field, parse) in variables.items()
            if ENV_PREFIX + name in environ}


def deployment_from_env(environ: Mapping[str, str] | None = None) -> Deployment:
    """The deployment the environment describes (raises SettingsError naming a bad variable)."""
    environ = os.environ if environ is None else environ
    preset_name = environ.get(ENV_PREFIX + "PRESET", "local").strip() or "local"
    if preset_name not in PRESETS:
        raise SettingsError(ENV_PREFIX + "PRESET", preset_name, f"one of {', '.join(PRESETS)}")
    preset = PRESETS[preset_name]
    limits = replace(preset.limits, **_overrides(environ, LIMIT_VARIABLES))
    return replace(preset, limits=limits, **_overrides(environ, DEPLOYMENT_VARIABLES))


def documented_variables() -> tuple[str, ...]:
    """Every variable this module reads, for docs/serving.md and its test."""
    return (ENV_PREFIX + "PRESET", *(ENV_PREFIX + name for name in (*DEPLOYMENT_VARIABLES, *LIMIT_VARIABLES)))

