"""Example prompts with the settings that make them teach something, from assets/presets.json."""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from engine import SamplerSettings, StopSettings
from ui import state as keys

PRESETS_FILE = Path(__file__).resolve().parent.parent / "assets" / "presets.json"


@dataclass(frozen=True)
class Preset:
    name: str
    about: str
    prompt: str
    chat: bool
    sampler: SamplerSettings
    stop: StopSettings


@lru_cache(maxsize=1)
def load_presets(path: Path = PRESETS_FILE) -> tuple[Preset, ...]:
    """The presets, validated by the engine's own settings classes."""
    entries = json.loads(path.read_text())
    return tuple(
        Preset(name=e["name"], about=e["about"], prompt=e["prompt"], chat=bool(e["chat"]),
               sampler=SamplerSettings(**e.get("sampler", {})),
               stop=StopSettings(**(e.get("stop", {}) | {"stop_sequences": tuple(e.get("stop", {}).get(
                   "stop_sequences", ()))})))
        for e in entries)


def preset_named(name: str) -> Preset:
    return next(p for p in load_presets() if p.name == name)


def apply_preset(state: MutableMapping[str, Any], preset: Preset) -> None:
    """Fill the prompt, chat, sampler and stop widgets from a preset."""
    state.update({keys.PROMPT: preset.prompt, keys.CHAT: preset.chat})
    keys.write_sampler(state, preset.sampler)
    keys.write_stop(state, preset.stop)
