"""Example prompts with the settings that make them teach something: every page's presets, read
from assets/ in one format (a JSON list of name, about, prompt, chat, sampler and stop settings):
the Step page's from presets.json, Breaking the chain's from chain_presets.json, the Lesson's from
lesson_presets.json (each also names the finish reason it makes fire) and the Sampler lab's from
lab_presets.json."""

from __future__ import annotations

import json
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, TypeVar

from engine import FINISH_REASONS, SamplerSettings, StopSettings
from ui.session import settings as keys
from ui.session.keys import STEP

ASSETS = Path(__file__).resolve().parents[2] / "assets"
PRESETS_FILE = ASSETS / "presets.json"
CHAIN_PRESETS_FILE = ASSETS / "chain_presets.json"
LESSON_PRESETS_FILE = ASSETS / "lesson_presets.json"
LAB_PRESETS_FILE = ASSETS / "lab_presets.json"


@dataclass(frozen=True)
class Preset:
    name: str
    about: str
    prompt: str
    chat: bool
    sampler: SamplerSettings
    stop: StopSettings
    fires: str | None = None  # the finish reason the preset is made to produce (the Lesson's), if any


@lru_cache(maxsize=8)
def load_presets(path: Path = PRESETS_FILE) -> tuple[Preset, ...]:
    """A page's presets (the Step page's by default), validated by the engine's own settings
    classes; a finish reason the engine does not know is refused at load, not in class."""
    return tuple(_preset(entry) for entry in json.loads(path.read_text()))


def _preset(entry: dict[str, Any]) -> Preset:
    stop = entry.get("stop", {})
    fires = entry.get("fires")
    if fires is not None and fires not in FINISH_REASONS:
        raise ValueError(f"Preset {entry['name']!r} fires {fires!r}; "
                         f"the finish reasons are {', '.join(FINISH_REASONS)}.")
    return Preset(name=entry["name"], about=entry["about"], prompt=entry["prompt"], chat=bool(entry["chat"]),
                  sampler=SamplerSettings(**entry.get("sampler", {})),
                  stop=StopSettings(**(stop | {"stop_sequences": tuple(stop.get("stop_sequences", ()))})),
                  fires=fires)


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
