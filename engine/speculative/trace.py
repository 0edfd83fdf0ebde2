"""A speculative generation as a trace: the plain trace's top level (engine/trace.py, read back
by the same functions), one short step per token so the Step through page can replay it as
plain decoding, and every round's record under "rounds"."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.errors import PromptError, SettingsError, TraceError
from engine.limits import Limits
from engine.loading import LoadedModel
from engine.speculative.drafting import DraftMethod
from engine.speculative.generation import RoundRecord, SpeculativeGeneration
from engine.trace import (
    ReplayCancelled,
    check_replay_time,
    parse_trace,
    trace_head,
    trace_prompt,
    trace_sampler,
    trace_stop,
    write_json,
)


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
        **trace_head(generation, "cdf"),
        "speculative": {"method": generation.draft.name, "k": generation.k},
        "steps": steps,
        "rounds": [_round_to_dict(record) for record in rounds],
        "finish_reason": generation.finish_reason,
        "text": generation.text,
        "timing": {"load_s": lm.load_seconds, "rounds_s": sum(r.timing.round_ms for r in rounds) / 1e3},
    }


def save_speculative_trace(generation: SpeculativeGeneration, path: str | Path) -> Path:
    """Write a speculative generation's trace as JSON and return its path."""
    return write_json(speculative_to_trace(generation), path)


@dataclass(frozen=True)
class SpeculativeReplay:
    """A speculative trace replayed into a live generation."""

    generation: SpeculativeGeneration
    mismatched_rounds: tuple[int, ...]  # rounds whose tokens came out differently on this machine


def replay_speculative(lm: LoadedModel, trace: dict[str, Any], make_draft: Callable[[str], DraftMethod],
                       limits: Limits | None = None) -> SpeculativeReplay:
    """Rebuild a speculative generation from its trace: same prompt, seed and stop settings, and
    each round again with its recorded sampler, k and draft method (`make_draft(method name)`).
    Rounds are deterministic given the seed, so they repeat; a round whose tokens differ here
    (another model, or float rounding on another machine) is reported, not forced. The server's
    `limits` cap the trace, its prompt and new tokens, and the replay's time (ReplayCancelled)."""
    limits = limits or Limits()
    trace = parse_trace(trace, limits)
    if not trace.get("rounds"):
        raise TraceError("This trace has no speculative rounds: load it on the Step through page instead.")
    started = time.monotonic()
    try:
        first = trace["rounds"][0]
        generation = SpeculativeGeneration(lm, **trace_prompt(trace, limits), draft=make_draft(first["method"]),
                                           k=int(first["k"]) or 1, sampler=trace_sampler(first["sampler"]),
                                           stop=trace_stop(trace))
        mismatched = []
        for record in trace["rounds"]:
            if record["method"] != generation.draft.name:
                generation.draft = make_draft(record["method"])
            generation.sampler = trace_sampler(record["sampler"])
            if int(record["k"]) >= 1:  # k is recorded after capping; 0 only where no room was left
                generation.set_k(int(record["k"]))
            if generation.finished:
                break
            if list(generation.step().emitted_ids) != [int(i) for i in record["emitted_ids"]]:
                mismatched.append(int(record["index"]))
            check_replay_time(limits, started, f"{len(generation.rounds)} of {len(trace['rounds'])} rounds")
        speculative = trace.get("speculative") or {}
        if speculative.get("k"):
            generation.set_k(int(speculative["k"]))
        generation.sampler = trace_sampler(trace.get("sampler"))
    except ReplayCancelled:
        raise
    except (TypeError, KeyError, ValueError, SettingsError, PromptError) as exc:
        raise TraceError(f"The trace's settings cannot be used: {exc}") from exc
    return SpeculativeReplay(generation, tuple(mismatched))
