"""A generation as versioned JSON: save it, load it back, replay it on a model.

The trace holds every step's record (the pick, the top candidates, the sampler stages, the
KV cache, termination, timing) plus what is needed to replay it: model, prompt, seed,
per-step sampler settings and which tokens were forced.

A speculative generation's trace (engine/speculative/trace.py) has the same top level, read
back by the same functions here, and one short step per token (so the step-through page can
replay it as plain decoding), plus two optional keys: "speculative" (the draft method and k)
and "rounds" (every round's record). Traces without them load as before, so the version
stays 1.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.errors import GenerationFinished, SettingsError, TraceError, shown
from engine.generation import Generation, StepRecord
from engine.limits import Limits
from engine.loading import LoadedModel
from engine.recording import recording_html, trace_from_recording
from engine.settings import SamplerSettings, StopSettings
from engine.shell import GenerationShell, PassQueue
from engine.slide import step_slide

TRACE_FORMAT = "token-by-token/trace"
TRACE_VERSION = 1
REQUIRED_KEYS = ("prompt", "chat", "seed", "stop", "prompt_token_ids", "steps", "finish_reason", "text")
REQUIRED_STEP_KEYS = ("index", "token_id", "sampler", "forced")
REQUIRED_ROUND_KEYS = ("index", "method", "k", "sampler", "emitted_ids")


def _step_to_dict(step: StepRecord, output_text: str) -> dict[str, Any]:
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
        "output_text": output_text,
        "timing": asdict(step.timing),
    }


def trace_head(generation: GenerationShell, draw: str) -> dict[str, Any]:
    """What every trace starts with: the format, the model, and what a replay starts from."""
    lm = generation.lm
    return {
        "format": TRACE_FORMAT,
        "version": TRACE_VERSION,
        "model": {"name": lm.name, "source": lm.source.kind, "location": lm.source.location,
                  "device": str(lm.device), "dtype": str(lm.dtype).removeprefix("torch.")},
        "prompt": generation.prompt,
        "chat": generation.chat,
        "system_prompt": generation.system_prompt,
        "allow_special": generation.allow_special,
        "prompt_text": generation.prompt_text,
        "prompt_token_ids": list(generation.prompt_ids),
        "seed": generation.seed,
        "draw": draw,
        "sampler": asdict(generation.sampler),
        "stop": asdict(generation.stop) | {"stop_sequences": list(generation.stop.stop_sequences)},
    }


def to_trace(generation: Generation) -> dict[str, Any]:
    """The generation as a JSON-ready dict (the format's top level is documented in docs/cli.md)."""
    steps = [_step_to_dict(step, text) for step, text in zip(generation.steps, _texts_so_far(generation), strict=True)]
    return {**trace_head(generation, generation.draw), "steps": steps, **_trace_end(generation)}


def _trace_end(generation: Generation) -> dict[str, Any]:
    """What follows the steps: how the generation ended, its text and its time."""
    steps = generation.steps
    return {
        "finish_reason": generation.finish_reason,
        "text": generation.text,
        "timing": {
            "load_s": generation.lm.load_seconds,
            "prefill_s": steps[0].timing.forward_ms / 1e3 if steps else 0.0,
            "decode_s": sum(step.timing.step_ms for step in steps[1:]) / 1e3,
        },
    }


def _texts_so_far(generation: Generation, start: int = 0) -> list[str]:
    """After each step from `start` on, the output decoded so far (before any stop-sequence
    cut). Computed here, at export, rather than kept on every step: kept, they grew with the
    square of the length (`bench.memory_bench`)."""
    ids = generation.generated_ids
    prefixes = [ids[:count] for count in range(start + 1, len(ids) + 1)]
    return generation.lm.tokenizer.batch_decode(prefixes, skip_special_tokens=True) if prefixes else []


class TraceText:
    """One generation's trace as JSON text, saved again after every step (a class room's):
    each step's part is encoded once and reused while that step's record stands, so a save
    encodes the new steps only, where `json.dumps(to_trace(...))` encodes every step each time
    (its cost grows with the lesson: docs/class.md, A lesson-long soak). The text loads as the
    same dict as `to_trace`'s; its steps come last."""

    def __init__(self) -> None:
        self._records: list[StepRecord] = []  # the records the parts were made from
        self._parts: list[str] = []

    def of(self, generation: Generation) -> str:
        steps = generation.steps
        kept = 0  # a step's part holds the text so far, so it stands only while every record up to it does
        while kept < min(len(steps), len(self._records)) and self._records[kept] is steps[kept]:
            kept += 1
        del self._records[kept:], self._parts[kept:]
        for step, text in zip(steps[kept:], _texts_so_far(generation, kept), strict=True):
            self._records.append(step)
            self._parts.append(json.dumps(_step_to_dict(step, text)))
        rest = json.dumps({**trace_head(generation, generation.draw), **_trace_end(generation)})
        return f'{rest[:-1]}, "steps": [{", ".join(self._parts)}]}}'


def save_trace(generation: Generation, path: str | Path) -> Path:
    """Write the trace as JSON and return its path."""
    return write_json(to_trace(generation), path)


def write_json(trace: dict[str, Any], path: str | Path) -> Path:
    """Write a trace as the JSON this app reads back, and return its path."""
    path = Path(path)
    path.write_text(json.dumps(trace, indent=1, ensure_ascii=False))
    return path


def generation_recording(generation: Generation, trace: dict[str, Any] | None = None,
                         share_query: str | None = None) -> str:
    """A Generation's recording, one web page (engine/recording.py): its trace unless one is
    given (paths hidden, each step's look inside added)."""
    return recording_html(trace if trace is not None else to_trace(generation), _prompt_pieces(generation),
                          share_query)


def generation_slide(generation: Generation, step: int | None = None, size: tuple[int, int] = (1920, 1080),
                     theme: str = "light", trace: dict[str, Any] | None = None) -> bytes:
    """One step of a Generation (the latest when None) as a PNG for a slide (engine/slide.py)."""
    return step_slide(trace if trace is not None else to_trace(generation), _prompt_pieces(generation), step, size,
                      theme)


def _prompt_pieces(generation: Generation) -> list[dict[str, Any]]:
    """The prompt's tokens as a recording and a slide draw them (the trace keeps their ids only)."""
    return [{"text": piece.text, "special": piece.special} for piece in generation.prompt_pieces]


def save_recording(generation: Generation, path: str | Path, share_query: str | None = None) -> Path:
    """Write a Generation's recording to `path` and return the path."""
    target = Path(path)
    target.write_text(generation_recording(generation, share_query=share_query), encoding="utf-8")
    return target


def parse_trace(data: str | bytes | dict[str, Any], limits: Limits | None = None) -> dict[str, Any]:
    """Check a trace (JSON text or an already parsed dict) and return it as a dict.

    Every field replay reads is checked for its type here, and the size and step count
    against `limits` before any other work. Raises TraceError naming what is missing or wrong.
    """
    limits = limits or Limits()
    if isinstance(data, (str, bytes)):
        limits.check_upload(len(data))
        data = _json(data)
    if not isinstance(data, dict) or data.get("format") != TRACE_FORMAT:
        raise TraceError(f"This is not a Token by Token trace: its 'format' must be '{TRACE_FORMAT}'.")
    if data.get("version") != TRACE_VERSION:
        raise TraceError(f"Trace version {shown(data.get('version'))} is not supported; this app reads "
                         f"version {TRACE_VERSION}.")
    missing = [key for key in REQUIRED_KEYS if key not in data]
    if missing:
        raise TraceError(f"The trace is missing {', '.join(missing)}.")
    if not isinstance(data["steps"], list):
        raise TraceError("The trace's 'steps' must be a list.")
    limits.check_replay_steps(len(data["steps"]))
    for key, kind, words in TOP_LEVEL_TYPES:
        if key in data and not (data[key] is None and key in NULLABLE) and not _is_a(data[key], kind):
            raise TraceError(f"The trace's '{key}' must be {words}, not {shown(data[key])}.")
    for position, step in enumerate(data["steps"], start=1):
        _check_step(position, step)
    rounds = data.get("rounds", [])
    if not isinstance(rounds, list):
        raise TraceError("The trace's 'rounds' must be a list.")
    for position, record in enumerate(rounds, start=1):
        if not isinstance(record, dict) or any(key not in record for key in REQUIRED_ROUND_KEYS):
            raise TraceError(f"Round {position} of the trace lacks one of {', '.join(REQUIRED_ROUND_KEYS)}.")
    return data


# (key, type, in words) for the fields replay reads
TOP_LEVEL_TYPES: tuple[tuple[str, type, str], ...] = (
    ("prompt", str, "text"), ("chat", bool, "true or false"), ("seed", int, "a whole number"),
    ("stop", dict, "an object"), ("sampler", dict, "an object"), ("draw", str, "text"),
    ("system_prompt", str, "text or null"), ("allow_special", bool, "true or false"),
    ("prompt_token_ids", list, "a list"),
)
NULLABLE = ("system_prompt", "sampler")
STEP_TYPES: tuple[tuple[str, type, str], ...] = (
    ("token_id", int, "a whole number"), ("sampler", dict, "an object"), ("forced", bool, "true or false"),
)


def _check_step(position: int, step: object) -> None:
    if not isinstance(step, dict) or any(key not in step for key in REQUIRED_STEP_KEYS):
        raise TraceError(f"Step {position} of the trace lacks one of {', '.join(REQUIRED_STEP_KEYS)}.")
    for key, kind, words in STEP_TYPES:
        if not _is_a(step[key], kind):
            raise TraceError(f"Step {position}'s '{key}' must be {words}, not {shown(step[key])}.")


def _is_a(value: object, kind: type) -> bool:
    """isinstance, except that true and false are not whole numbers here."""
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


def _json(data: str | bytes) -> Any:
    """Parse JSON text, or take the trace a recording's web page carries (engine/recording.py);
    bytes must be UTF-8 (what this app writes)."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise TraceError(f"The trace is not UTF-8 text (byte {exc.start} cannot be read): save it as UTF-8 "
                         "JSON.") from exc
    if text.lstrip()[:1] == "<":  # a web page: a recording carries its trace, any other page none
        return trace_from_recording(text)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise TraceError(f"The trace is not valid JSON: {exc}.") from exc
    except RecursionError as exc:  # thousands of nested brackets
        raise TraceError("The trace nests lists or objects too deeply to be a trace.") from exc


def load_trace(path: str | Path, limits: Limits | None = None) -> dict[str, Any]:
    """Read and check a trace file."""
    limits = limits or Limits()
    try:
        path = Path(path)
        limits.check_upload(path.stat().st_size)
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"Cannot read the trace file {path}: {exc.strerror or exc}.") from exc
    return parse_trace(data, limits)


@dataclass(frozen=True)
class Replay:
    """A trace replayed into a live generation."""

    generation: Generation
    mismatched_steps: tuple[int, ...]  # steps whose sampled token differed here and were forced


class ReplayCancelled(TraceError):
    """A replay was stopped before its end (by the visitor, or by the server's time cap)."""


def replay(lm: LoadedModel, trace: dict[str, Any], limits: Limits | None = None,
           progress: Callable[[int, int], bool] | None = None, scheduler: PassQueue | None = None) -> Replay:
    """Rebuild a live generation from a trace: same prompt, seed and per-step settings.

    Sampled steps are sampled again (same seed, same draws); a step whose token differs on
    this machine is forced to the recorded token and reported. Forced steps are forced again.
    `progress(done, total)` is called after each step; returning False cancels the replay
    (ReplayCancelled), as does running past `limits.replay_seconds`. The generation's passes
    go through `scheduler` (the server's), during the replay and after it.
    """
    limits = limits or Limits()
    trace = parse_trace(trace, limits)
    _check_token_ids(trace["steps"], lm.vocab_size)
    started = time.monotonic()
    try:
        generation, stop = _replay_start(lm, trace, limits, scheduler)
        mismatched = _replay_steps(generation, trace["steps"], 0, limits, started, progress)
        _end_as_recorded(generation, trace, stop)
    except (TypeError, KeyError, SettingsError, GenerationFinished) as exc:
        raise TraceError(f"The trace's settings cannot be used: {exc}") from exc
    return Replay(generation, tuple(mismatched))


def catch_up(generation: Generation, trace: dict[str, Any], limits: Limits | None = None) -> bool:
    """Bring a live generation to `trace`, a later version of the same generation (another
    process's: a class served by several): the steps they share are kept, any after them are
    rewound (the presenter went Back, or changed a step), and the trace's remaining steps are
    taken as a replay takes them. Returns False, changing nothing, when the trace does not
    continue this generation (another prompt, seed or way of drawing): replay it whole."""
    limits = limits or Limits()
    trace = parse_trace(trace, limits)
    if (list(trace["prompt_token_ids"]) != list(generation.prompt_ids) or trace["seed"] != generation.seed
            or trace.get("draw", "cdf") != generation.draw):
        return False
    _check_token_ids(trace["steps"], generation.lm.vocab_size)
    recorded, kept = trace["steps"], 0
    for mine, theirs in zip(generation.steps, recorded, strict=False):
        if mine.token_id != theirs["token_id"] or asdict(mine.decision.settings) != theirs["sampler"]:
            break
        kept += 1
    started = time.monotonic()
    try:
        generation.rewind(kept)
        stop = trace_stop(trace)
        generation.stop = StopSettings(max_new_tokens=max(stop.max_new_tokens, len(recorded) or 1), ignore_eos=True)
        generation.recheck_terminations()  # the kept steps may have ended it under the old settings
        _replay_steps(generation, recorded, kept, limits, started)
        _end_as_recorded(generation, trace, stop)
    except (TypeError, KeyError, SettingsError, GenerationFinished) as exc:
        raise TraceError(f"The trace's settings cannot be used: {exc}") from exc
    return True


def _replay_steps(generation: Generation, steps: list[dict[str, Any]], start: int, limits: Limits, started: float,
                  progress: Callable[[int, int], bool] | None = None) -> list[int]:
    """Take `steps[start:]` again, within the server's time cap; returns the steps (from 1) that
    sampled differently here and were forced. `progress(done, total)` returning False cancels."""
    mismatched, total = [], len(steps)
    for done, step in enumerate(steps[start:], start=start + 1):
        if _replay_step(generation, step):
            mismatched.append(done)
        if progress is not None and progress(done, total) is False:
            raise ReplayCancelled(f"The replay was cancelled after {done} of {total} steps.")
        check_replay_time(limits, started, f"{done} of {total} steps")
    return mismatched


def _end_as_recorded(generation: Generation, trace: dict[str, Any], stop: StopSettings) -> None:
    """After the steps: the trace's own sampler and stop settings, and every step's conditions
    checked again under them (steps were taken with EOS ignored and the cap raised)."""
    generation.sampler = trace_sampler(trace.get("sampler"))
    generation.stop = stop
    generation.recheck_terminations()


def _check_token_ids(steps: list[dict[str, Any]], vocab_size: int) -> None:
    """Every recorded token must be one of this model's, checked before any step runs."""
    for position, step in enumerate(steps, start=1):
        if not 0 <= step["token_id"] < vocab_size:
            raise TraceError(f"Step {position}'s token_id {shown(step['token_id'])} is not a token of this model "
                             f"(0 to {vocab_size - 1}).")


def _replay_start(lm: LoadedModel, trace: dict[str, Any], limits: Limits, scheduler: PassQueue | None
                  ) -> tuple[Generation, StopSettings]:
    """The generation a replay steps, and the stop settings it ends with. While replaying,
    EOS is ignored and the cap covers every recorded step."""
    stop = trace_stop(trace)
    generation = Generation(lm, **trace_prompt(trace, limits), sampler=trace_sampler(trace.get("sampler")),
                            stop=StopSettings(max_new_tokens=max(stop.max_new_tokens, len(trace["steps"]) or 1),
                                              ignore_eos=True),
                            draw=trace.get("draw", "cdf"), scheduler=scheduler)
    return generation, stop


def _replay_step(generation: Generation, step: dict[str, Any]) -> bool:
    """Take one recorded step again; True when it sampled differently here and was forced."""
    generation.sampler = trace_sampler(step["sampler"])
    recorded = step["token_id"]
    record = generation.step(force_token_id=recorded if step["forced"] else None)
    if record.token_id == recorded:
        return False
    generation.branch(recorded)
    return True


def other_device_note(recorded: object, lm: LoadedModel) -> str | None:
    """Why a generation made on another kind of device (`recorded`: a trace's model.device or a
    link's, e.g. "cuda:0") may replay differently on `lm`'s; None on the same kind, or unknown."""
    if not isinstance(recorded, str) or not recorded:
        return None
    made, here = recorded.split(":")[0], lm.device.type
    if made == here:
        return None
    return (f"It was made on {made} and is replayed here on {here}: every generation draws its random numbers "
            "from its own generator on the CPU, so the draws are the same, but the two devices' kernels round the "
            "logits differently in the last bits, so a sampled step on a rounding edge can pick another token "
            "(such a step is forced to the recorded one and listed).")


# ---- what every replay reads from a trace (plain and speculative alike) ---------------------


def trace_prompt(trace: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """The keyword arguments every generation starts from: the prompt and how it is read, the
    seed, and the server's caps."""
    return {"prompt": trace["prompt"], "chat": trace["chat"], "system_prompt": trace.get("system_prompt"),
            "allow_special": trace.get("allow_special", False), "seed": trace["seed"], "limits": limits}


def trace_sampler(settings: dict[str, Any] | None) -> SamplerSettings:
    """A recorded sampler (None or an empty object: the defaults), validated by SamplerSettings."""
    return SamplerSettings(**(settings or {}))


def trace_stop(trace: dict[str, Any]) -> StopSettings:
    """The recorded stop settings; a JSON list of stop sequences becomes the tuple StopSettings
    takes, anything else is left for StopSettings to refuse by name."""
    sequences = trace["stop"].get("stop_sequences", [])
    return StopSettings(**(trace["stop"] | {"stop_sequences": tuple(sequences) if isinstance(sequences, list)
                                                              else sequences}))


def check_replay_time(limits: Limits, started: float, done: str) -> None:
    """ReplayCancelled once a replay has run past the server's time cap (`done`: how far it got)."""
    if limits.replay_seconds is not None and time.monotonic() - started > limits.replay_seconds:
        raise ReplayCancelled(f"The replay took longer than this server allows ({limits.replay_seconds:g} s) "
                              f"and stopped after {done}.")
