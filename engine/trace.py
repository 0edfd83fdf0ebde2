"""A generation as versioned JSON: save it, load it back, replay it on a model.

The trace holds every step's record (the pick, the top candidates, the sampler stages, the
KV cache, termination, timing) plus what is needed to replay it: model, prompt, seed,
per-step sampler settings and which tokens were forced.

A speculative generation's trace has the same top level and one short step per token (so the
step-through page can replay it as plain decoding), plus two optional keys: "speculative"
(the draft method and k) and "rounds" (every round's record). Traces without them load as
before, so the version stays 1.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.drafting import DraftMethod
from engine.errors import PromptError, SettingsError, TraceError
from engine.generation import Generation, StepRecord
from engine.loading import LoadedModel
from engine.settings import SamplerSettings, StopSettings
from engine.speculative import RoundRecord, SpeculativeGeneration

TRACE_FORMAT = "token-by-token/trace"
TRACE_VERSION = 1
REQUIRED_KEYS = ("prompt", "chat", "seed", "stop", "prompt_token_ids", "steps", "finish_reason", "text")
REQUIRED_STEP_KEYS = ("index", "token_id", "sampler", "forced")
REQUIRED_ROUND_KEYS = ("index", "method", "k", "sampler", "emitted_ids")


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
    rounds = data.get("rounds", [])
    if not isinstance(rounds, list):
        raise TraceError("The trace's 'rounds' must be a list.")
    for position, record in enumerate(rounds, start=1):
        if not isinstance(record, dict) or any(key not in record for key in REQUIRED_ROUND_KEYS):
            raise TraceError(f"Round {position} of the trace lacks one of {', '.join(REQUIRED_ROUND_KEYS)}.")
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



# ---- speculative generations ---------------------------------------------------------------


def _round_to_dict(record: RoundRecord) -> dict[str, Any]:
    rejection = record.rejection
    return {
        "index": record.index,
        "method": record.method,
        "k": record.k,
        "sampler": asdict(record.sampler),
        "drafted_ids": [p.token_id for p in record.drafted],
        "drafted_texts": [p.text for p in record.drafted],
        "deterministic_draft": record.deterministic_draft,
        "checks": [asdict(check) for check in record.checks],
        "accepted": record.accepted,
        "rejection": None if rejection is None else {
            "index": rejection.index, "position": rejection.position, "u": rejection.u,
            "accept_prob": rejection.accept_prob, "residual_mass": rejection.residual_mass,
            "token_id": rejection.token.token_id, "text": rejection.token.text,
            "draw": asdict(rejection.draw) if rejection.draw else None},
        "bonus_id": record.bonus.token_id if record.bonus else None,
        "emitted_ids": list(record.emitted_ids),
        "emitted_texts": [p.text for p in record.emitted],
        "emitted_kinds": list(record.emitted_kinds),
        "cut_by_stop": record.cut_by_stop,
        "first_position": record.first_position,
        "fed_tokens": record.fed_tokens,
        "positions": [{"position": v.position, "drafted_id": v.drafted_id, "reached": v.reached,
                       "others_p": v.others_p, "entropy_bits": v.entropy_bits,
                       "top": [asdict(row) for row in v.top]} for v in record.positions],
        "kv_cache": {"before": record.kv.before, "written": record.kv.written, "cropped": record.kv.cropped,
                     "after": record.kv.after, "bytes": record.kv.snapshot.bytes},
        "finish_reason": record.termination.finish_reason,
        "timing": asdict(record.timing),
    }


def speculative_to_trace(generation: SpeculativeGeneration) -> dict[str, Any]:
    """A speculative generation as a JSON-ready trace: the plain trace's top level, one short
    step per token, and every round's record under "rounds"."""
    lm, rounds = generation.lm, generation.rounds
    steps = []
    for record in rounds:
        for offset, (piece, kind) in enumerate(zip(record.emitted, record.emitted_kinds, strict=True)):
            steps.append({"index": len(steps) + 1, "position": record.first_position + offset,
                          "token_id": piece.token_id, "text": piece.text, "special": piece.special,
                          "sampler": asdict(record.sampler), "forced": False, "round": record.index, "kind": kind})
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
        "draw": "cdf",
        "sampler": asdict(generation.sampler),
        "stop": asdict(generation.stop) | {"stop_sequences": list(generation.stop.stop_sequences)},
        "speculative": {"method": generation.draft.name, "k": generation.k},
        "steps": steps,
        "rounds": [_round_to_dict(record) for record in rounds],
        "finish_reason": generation.finish_reason,
        "text": generation.text,
        "timing": {"load_s": lm.load_seconds, "rounds_s": sum(r.timing.round_ms for r in rounds) / 1e3},
    }


def save_speculative_trace(generation: SpeculativeGeneration, path: str | Path) -> Path:
    """Write a speculative generation's trace as JSON and return its path."""
    path = Path(path)
    path.write_text(json.dumps(speculative_to_trace(generation), indent=1, ensure_ascii=False))
    return path


@dataclass(frozen=True)
class SpeculativeReplay:
    """A speculative trace replayed into a live generation."""

    generation: SpeculativeGeneration
    mismatched_rounds: tuple[int, ...]  # rounds whose tokens came out differently on this machine


def replay_speculative(lm: LoadedModel, trace: dict[str, Any], make_draft: Callable[[str], DraftMethod]
                       ) -> SpeculativeReplay:
    """Rebuild a speculative generation from its trace: same prompt, seed and stop settings, and
    each round again with its recorded sampler, k and draft method (`make_draft(method name)`).
    Rounds are deterministic given the seed, so they repeat; a round whose tokens differ here
    (another model, or float rounding on another machine) is reported, not forced."""
    trace = parse_trace(trace)
    if not trace.get("rounds"):
        raise TraceError("This trace has no speculative rounds: load it on the Step through page instead.")
    try:
        stop = StopSettings(**(trace["stop"] | {"stop_sequences": tuple(trace["stop"]["stop_sequences"])}))
        first = trace["rounds"][0]
        generation = SpeculativeGeneration(lm, trace["prompt"], chat=bool(trace["chat"]),
                                           system_prompt=trace.get("system_prompt"),
                                           draft=make_draft(first["method"]), k=int(first["k"]) or 1,
                                           sampler=SamplerSettings(**first["sampler"]), stop=stop,
                                           seed=int(trace["seed"]))
        mismatched = []
        for record in trace["rounds"]:
            if record["method"] != generation.draft.name:
                generation.draft = make_draft(record["method"])
            generation.sampler = SamplerSettings(**record["sampler"])
            if int(record["k"]) >= 1:  # k is recorded after capping; 0 only where no room was left
                generation.set_k(int(record["k"]))
            if generation.finished:
                break
            if list(generation.step().emitted_ids) != [int(i) for i in record["emitted_ids"]]:
                mismatched.append(int(record["index"]))
        speculative = trace.get("speculative") or {}
        if speculative.get("k"):
            generation.set_k(int(speculative["k"]))
        generation.sampler = SamplerSettings(**(trace.get("sampler") or {}))
    except (TypeError, KeyError, ValueError, SettingsError, PromptError) as exc:
        raise TraceError(f"The trace's settings cannot be used: {exc}") from exc
    return SpeculativeReplay(generation, tuple(mismatched))
