"""The KV cache & speed page's controller: which sizes a visitor measures, each measurement taken
once per server and kept for the visitor, and the tables and sentences made from the results.

Plain functions over the visitor's state (`st.session_state` on the page, a dict in tests), as
ui/controllers/step_through.py. No Streamlit here: the page passes in the server's board, the
count of tokens served and how to show a wait (st.spinner).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, MutableMapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pandas as pd

from engine import LoadedModel, Proof, proof_decisions
from engine.speed import KNOWN_CONFIGS, MORE, QUICK, DecodeReads, KVConfig, Sizes, loaded_kv_config
from ui.server.measurement_board import Measured, MeasurementBoard
from ui.session.keys import KV
from ui.session.memo import remember
from ui.views.format import nbytes

State = MutableMapping[str, Any]
T = TypeVar("T")

KV_SAMPLE_POSITIONS = 16  # positions put in a real cache to weigh one position
TIERS = {"quick": QUICK, "more": MORE}


def tier(state: State) -> str:
    """The visitor's tier of sizes: "quick" until they press Measure more."""
    return state.get(KV.tier, "quick")


def measure_more(state: State) -> None:
    """Measure more: longer contexts and more repeats from now on."""
    state[KV.tier] = "more"


def sizes(state: State, lm: LoadedModel) -> Sizes:
    """The sizes of the visitor's tier, fitted to the model's context window."""
    return TIERS[tier(state)].fitted(lm.context_window)


def measured(state: State, lm: LoadedModel, what: str, run: Callable[[], T], board: MeasurementBoard,
             served: Callable[[], int], waiting: Callable[[str], AbstractContextManager]) -> T:
    """Measured once per server for (model, device, tier, what) and shared by every visitor
    (ui/server/measurement_board.py); this visitor keeps the result it showed, so reruns only
    redraw. `served` counts the server's tokens (how busy it was meanwhile); `waiting(text)`
    shows the wait while this visitor's measurement, or another's, runs."""
    key = (lm.name, str(lm.device), tier(state), what)

    def shared() -> T:
        if (result := board.kept(key)) is None:
            doing = "another visitor's measurement to finish, then measuring" if board.busy else "Measuring"
            with waiting(f"{doing} {what} on {lm.device}, once for everyone on this server…"):
                result = board.get(key, run, served)
        state.setdefault(KV.taken, {})[key] = result
        return result.value

    return remember(state, KV.results, key, shared)


def measure_again(state: State, board: MeasurementBoard, lm: LoadedModel) -> None:
    """Measure again: this model's results re-measured for everyone (the board keeps results
    just taken), and this visitor's kept ones dropped."""
    board.refresh(lambda key: key[:2] == (lm.name, str(lm.device)))
    state.pop(KV.results, None)
    state.pop(KV.taken, None)


def provenance(taken: Mapping[Any, Measured]) -> str | None:
    """When the numbers on the page were taken, and how busy the server was meanwhile."""
    if not taken:
        return None
    results = list(taken.values())
    oldest, newest = min(r.taken_at for r in results), max(r.taken_at for r in results)
    others = sum(r.other_tokens for r in results)
    first, last = (time.strftime("%H:%M UTC", time.gmtime(t)) for t in (oldest, newest))
    when = first if first == last else f"{first} to {last}"
    load = ("the server was making no tokens for visitors meanwhile, so the model had the machine to itself"
            if others == 0 else
            f"meanwhile the server made {others:,} tokens for visitors, so some times may be higher than the "
            "machine gives when quiet: press Measure again when the class is not stepping")
    return f"Measured once for everyone on this server at {when}, one measurement at a time; {load}."


def cached_trend(first_ms: float, last_ms: float) -> str:
    """The cached step's change over the measured contexts, in words its numbers cannot contradict."""
    if last_ms > first_ms * 1.05:
        return f"the cached step grew from {first_ms:.1f} to {last_ms:.1f} ms"
    if last_ms >= first_ms * 0.95:
        return f"the cached step stayed at about {first_ms:.0f} ms ({first_ms:.1f} and {last_ms:.1f} ms)"
    return (f"the cached step measured {first_ms:.1f} ms, then {last_ms:.1f} ms: at these lengths reading the cache "
            "adds less to a step than the machine's own variation, so the longer context happened to be timed on "
            "a quieter moment")


@dataclass(frozen=True)
class KVRow:
    """One model's KV cache cost per position."""

    name: str
    shape: KVConfig
    per_position: int  # bytes


def kv_rows(lm: LoadedModel, measured_per_position: int) -> list[KVRow]:
    """The loaded model (its per-position bytes measured from its cache), then the published configs."""
    loaded = replace(loaded_kv_config(lm), source="measured from this app's own cache tensors")
    return [KVRow(f"{lm.name.split(' (')[0]}, loaded here", loaded, measured_per_position),
            *(KVRow(c.name, c, c.bytes_per_position) for c in KNOWN_CONFIGS)]


def kv_table(rows: list[KVRow], positions: int) -> pd.DataFrame:
    """The KV rows as a table: shape, bytes per position and for the chosen context."""
    return pd.DataFrame([{
        "model": r.name, "layers": r.shape.layers, "KV heads": r.shape.kv_heads, "head dim": r.shape.head_dim,
        "dtype": r.shape.dtype, "per position": nbytes(r.per_position),
        f"{positions:,} positions": nbytes(r.per_position * positions), "source": r.shape.source} for r in rows])


def kv_sizes(rows: list[KVRow], positions: int) -> list[tuple[str, int]]:
    """Each row's cache for `positions` tokens, named with its dtype: the memory chart's bars."""
    return [(f"{r.name} ({r.shape.dtype})", r.per_position * positions) for r in rows]


def step_parts(reads: DecodeReads) -> pd.DataFrame:
    """Where a decode step's time goes, each part measured: the products, attention, the rest
    (shares of `reads.step`, the step they were set against)."""
    step = reads.step
    return pd.DataFrame({
        "part of the step": ["the products (every weight, one row)", "attention over the cache, every layer",
                             "everything else: norms, rotary, activation, residuals, the calls between"],
        "ms": [f"{reads.products_ms:.1f}", f"{reads.attention_ms:.2f}", f"{reads.other_ms:.1f}"],
        "share": [f"{100 * ms / step.step_ms:.0f}%" for ms in (reads.products_ms, reads.attention_ms, reads.other_ms)],
    })


def batch_saving(one_ms: float, most_ms: float) -> str:
    """Time per token at the largest batch against batch 1, in words."""
    return (f"{one_ms / most_ms:.1f}× less" if most_ms < one_ms
            else "no saving this time: the machine may be busy, press Measure again")


def proof_table(lm: LoadedModel, proofs: list[Proof] | None = None) -> pd.DataFrame:
    """Every fast path this server has probed for `lm` (and for the whole machine), proven or
    not and why: the one answer to "why is this machine on the eager pass?"."""
    rows = [p for p in (proof_decisions() if proofs is None else proofs) if p.model == lm.name or p.for_machine]
    return pd.DataFrame([{"fast path": p.path, "for": p.model, "threads": p.threads_text,
                          "proven": "yes" if p.proven else "no", "why": p.why} for p in rows],
                        columns=["fast path", "for", "threads", "proven", "why"])
