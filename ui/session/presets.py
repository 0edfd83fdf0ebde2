"""Example prompts with the settings that make them teach something: every page's presets, read
from assets/ in one format (a JSON list of name, about, prompt, chat, sampler and stop settings):
the Step page's from presets.json, Breaking the chain's from chain_presets.json."""

from __future__ import annotations

import json
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, TypeVar

from engine import SamplerSettings, StopSettings
from ui.session import settings as keys
from ui.session.keys import STEP

ASSETS = Path(__file__).resolve().parents[2] / "assets"
PRESETS_FILE = ASSETS / "presets.json"
CHAIN_PRESETS_FILE = ASSETS / "chain_presets.json"


@dataclass(frozen=True)
class Preset:
    name: str
    about: str
    prompt: str
    chat: bool
    sampler: SamplerSettings
    stop: StopSettings


@lru_cache(maxsize=4)
def load_presets(path: Path = PRESETS_FILE) -> tuple[Preset, ...]:
    """A page's presets (the Step page's by default), validated by the engine's own settings
    classes."""
    entries = json.loads(path.read_text())
    return tuple(
        Preset(name=e["name"], about=e["about"], prompt=e["prompt"], chat=bool(e["chat"]),
               sampler=SamplerSettings(**e.get("sampler", {})),
               stop=StopSettings(**(e.get("stop", {}) | {"stop_sequences": tuple(e.get("stop", {}).get(
                   "stop_sequences", ()))})))
        for e in entries)


class Named(Protocol):
    """Anything with a name: the Step page's presets and the Lesson's."""

    @property
    def name(self) -> str: ...


P = TypeVar("P", bound=Named)


def preset_named(presets: Sequence[P], name: str) -> P:
    """The preset called `name` among `presets` (the Step page's, or the Lesson's); ValueError
    naming the choices for an unknown one."""
    for preset in presets:
        if preset.name == name:
            return preset
    raise ValueError(f"No preset named {name!r}; choose one of: {', '.join(p.name for p in presets)}.")


def apply_preset(state: MutableMapping[str, Any], preset: Preset) -> None:
    """Fill the prompt, chat, sampler and stop widgets from a preset."""
    state.update({STEP.prompt: preset.prompt, STEP.chat: preset.chat})
    keys.write_sampler(state, preset.sampler)
    keys.write_stop(state, preset.stop)
