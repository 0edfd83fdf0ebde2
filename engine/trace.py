"""A generation as versioned JSON: save it, load it back, replay it on a model.

The trace holds every step's record (the pick, the top candidates, the sampler stages, the
KV cache, termination, timing) plus what is needed to replay it: model, prompt, seed,
per-step sampler settings and which tokens were forced.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.errors import SettingsError, TraceError
from engine.generation import Generation, StepRecord
from engine.loading import LoadedModel
from engine.settings import SamplerSettings, StopSettings

TRACE_FORMAT = "token-by-token/trace"
TRACE_VERSION = 1
REQUIRED_KEYS = ("prompt", "chat", "seed", "stop", "prompt_token_ids", "steps", "finish_reason", "text")
REQUIRED_STEP_KEYS = ("index", "token_id", "sampler", "forced")


def _step_to_dict(step: StepRecord) -> dict[str, Any]:
    decision = step.decision
    return {
        "index": step.index,
        "position": step.position,
        "token_id": step.token_id,
        "text": step.token.text,
        "special": step.token.special,
        "partial_bytes": step.token.partial_bytes,
        "logit": step.logit,
        "prob": step.prob,
        "rank": step.rank,
        "final_prob": step.final_prob,
        "forced": decision.forced,
        "sampler_token_id": decision.sampler_token_id,
        "greedy": decision.greedy,
        "draw": asdict(decision.draw) if decision.draw else None,
        "sampler": asdict(decision.settings),
        "stages": [asdict(stage) for stage in decision.stages],
        "entropy_bits": step.distribution.raw_entropy_bits,
        "final_entropy_bits": step.distribution.final_entropy_bits,
        "top": [asdict(candidate) for candidate in step.distribution.top],
        "others": {"count": step.distribution.others_count, "prob": step.distribution.others_prob,
                   "final_prob": step.distribution.others_final_prob},
        "kv_cache": {"tokens": step.kv.positions, "bytes": step.kv.bytes,
                     "formula_bytes": step.kv.formula_bytes, "formula": step.kv.formula,
                     "dtype": step.kv.dtype, "layers": step.kv.layers,
                     "layer_shapes": [[list(k), list(v)] for k, v in step.kv.layer_shapes]},
        "forward_tokens": step.forward_tokens,
        "termination": asdict(step.termination),
        "output_text": step.output_text,
        "timing": asdict(step.timing),
    }


def to_trace(generation: Generation) -> dict[str, Any]:
    """The generation as a JSON-ready dict (the format's top level is documented in README)."""
    steps = generation.steps
    lm = generation.lm
    return {
        "format": TRACE_FORMAT,
        "version": TRACE_VERSION,
        "model": {"name": lm.name, "source": lm.source.kind, "location": lm.source.location,
                  "device": str(lm.device), "dtype": str(lm.dtype).removeprefix("torch.")},
        "prompt": generation.prompt,
        "chat": generation.chat,
        "system_prompt": generation.system_prompt,
        "prompt_text": generation.prompt_text,
        "prompt_token_ids": list(generation.prompt_ids),
        "seed": generation.seed,
        "draw": generation.draw,
        "sampler": asdict(generation.sampler),
        "stop": asdict(generation.stop) | {"stop_sequences": list(generation.stop.stop_sequences)},
        "steps": [_step_to_dict(step) for step in steps],
        "finish_reason": generation.finish_reason,
        "text": generation.text,
        "timing": {
            "load_s": lm.load_seconds,
            "prefill_s": steps[0].timing.forward_ms / 1e3 if steps else 0.0,
            "decode_s": sum(step.timing.step_ms for step in steps[1:]) / 1e3,
        },
    }


def save_trace(generation: Generation, path: str | Path) -> Path:
    """Write the trace as JSON and return its path."""
    path = Path(path)
    path.write_text(json.dumps(to_trace(generation), indent=1, ensure_ascii=False))
    return path


def parse_trace(data: str | bytes | dict[str, Any]) -> dict[str, Any]:
    """Check a trace (JSON text or an already parsed dict) and return it as a dict.

    Raises TraceError naming what is missing or wrong.
    """
    if not isinstance(data, dict):
        try:
            data = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise TraceError(f"The trace is not valid JSON: {exc}.") from exc
    if not isinstance(data, dict) or data.get("format") != TRACE_FORMAT:
        raise TraceError(f"This is not a Token by Token trace: its 'format' must be '{TRACE_FORMAT}'.")
    if data.get("version") != TRACE_VERSION:
        raise TraceError(f"Trace version {data.get('version')!r} is not supported; this app reads "
                         f"version {TRACE_VERSION}.")
    missing = [key for key in REQUIRED_KEYS if key not in data]
    if missing:
        raise TraceError(f"The trace is missing {', '.join(missing)}.")
    if not isinstance(data["steps"], list):
        raise TraceError("The trace's 'steps' must be a list.")
    for position, step in enumerate(data["steps"], start=1):
        if not isinstance(step, dict) or any(key not in step for key in REQUIRED_STEP_KEYS):
            raise TraceError(f"Step {position} of the trace lacks one of {', '.join(REQUIRED_STEP_KEYS)}.")
    return data


def load_trace(path: str | Path) -> dict[str, Any]:
    """Read and check a trace file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise TraceError(f"Cannot read the trace file {path}: {exc}.") from exc
    return parse_trace(text)


@dataclass(frozen=True)
class Replay:
    """A trace replayed into a live generation."""

    generation: Generation
    mismatched_steps: tuple[int, ...]  # steps whose sampled token differed here and were forced


def replay(lm: LoadedModel, trace: dict[str, Any]) -> Replay:
    """Rebuild a live generation from a trace: same prompt, seed and per-step settings.

    Sampled steps are sampled again (same seed, same draws); a step whose token differs on
    this machine is forced to the recorded token and reported. Forced steps are forced again.
    """
    trace = parse_trace(trace)
    try:
        stop = StopSettings(**(trace["stop"] | {"stop_sequences": tuple(trace["stop"]["stop_sequences"])}))
        generation = Generation(lm, trace["prompt"], chat=bool(trace["chat"]),
                                system_prompt=trace.get("system_prompt"),
                                sampler=SamplerSettings(**trace.get("sampler", {})),
                                stop=StopSettings(max_new_tokens=max(stop.max_new_tokens, len(trace["steps"]) or 1),
                                                  ignore_eos=True),
                                seed=int(trace["seed"]), draw=trace.get("draw", "cdf"))
        mismatched = []
        for step in trace["steps"]:
            generation.sampler = SamplerSettings(**step["sampler"])
            recorded = int(step["token_id"])
            record = generation.step(force_token_id=recorded if step["forced"] else None)
            if record.token_id != recorded:
                mismatched.append(record.index)
                generation.rewind(record.index - 1)
                generation.step(force_token_id=recorded)
        generation.sampler = SamplerSettings(**(trace.get("sampler") or {}))
        generation.stop = stop
    except (TypeError, KeyError, SettingsError) as exc:
        raise TraceError(f"The trace's settings cannot be used: {exc}") from exc
    return Replay(generation, tuple(mismatched))

