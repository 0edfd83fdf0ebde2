"""One registry of proofs: every fast path's probe decides once, here, and is kept here.

Why: a fast path is used only once a probe on this machine has shown it gives the digits of the
path it replaces (or, for the lens kernel, numbers within float32 rounding of float64 ones).
Each probe answers for a key (a path, a model or a weight shape, often a thread count), and the
answer must be kept: probing again would cost seconds, and a path must not change its mind
half-way through a visitor's generation. One registry keeps every answer with ONE lock and
writes ONE log line per decision, in one format, and `proof_decisions()` lists them for the KV
cache & speed page and `python -m engine proofs`.

The registry decides nothing itself: each probe still runs its own bit-for-bit comparison and
returns a `Verdict` (proven or not, why, and what the path runs with). A probe that raises is
not kept (the next call probes again); probes that want a failure to count as "not proven"
catch it themselves, as the lone pass's does.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

import torch

MACHINE = "this machine"  # the `model` of a proof that holds for every model (a kernel's build)

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Proof:
    """One probe's decision: whether a fast path is proven for a model (or a weight shape, or the
    whole machine) at a thread count, and why, or why not."""

    path: str  # the fast path, e.g. "lone decode step"
    model: str  # the model's name, a weight's shape, or MACHINE
    threads: int | None  # torch's thread count the answer holds for; None: every count (decided once)
    proven: bool
    why: str  # what was compared, where proven; why not, where not
    at: datetime  # when it was decided (UTC)

    @property
    def for_machine(self) -> bool:
        """Whether the decision holds for every model on this machine (a kernel's build)."""
        return self.model == MACHINE

    @property
    def threads_text(self) -> str:
        return "any" if self.threads is None else str(self.threads)

    def line(self) -> str:
        """The log's one line for a decision."""
        verdict = "proven" if self.proven else "not proven"
        return f"fast path {self.path!r} for {self.model} at {self.threads_text} threads: {verdict} ({self.why})"


@dataclass(frozen=True)
class Verdict:
    """What a probe returns: proven or not, why, and what the fast path runs with (a compiled
    pass, a plan; kept beside the proof, whatever the answer)."""

    proven: bool
    why: str
    value: object = None
    warn: bool = False  # logged as a warning: something that should work here did not (a build, a probe)


def proven(why: str, value: object = True) -> Verdict:
    """A probe's yes: `why` says what was compared."""
    return Verdict(True, why, value)


def refused(why: str, value: object = None, warn: bool = False) -> Verdict:
    """A probe's no: `why` says what stood in the way."""
    return Verdict(False, why, value, warn)


class Settled(NamedTuple):
    """A kept decision: the proof and what the fast path runs with (None where nothing)."""

    proof: Proof
    value: object


Key = tuple[str, Hashable, int | None]  # (path, the rest of the probe's key, threads or None)


class ProofRegistry:
    """Decisions kept per (path, key, thread count); those about a model are dropped with the
    model (kept by weak reference to it). A kept decision is read without the lock, so a probe
    that runs for seconds never holds up a path that is already decided."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # a probe may settle other keys inside its own (the verify pass's)
        self._by_model: weakref.WeakKeyDictionary[object, dict[Key, Settled]] = weakref.WeakKeyDictionary()
        self._machine: dict[Key, Settled] = {}
        self._deciding: set[tuple[int, Key]] = set()

    def settle(self, path: str, probe: Callable[[], Verdict], *, owner: object | None = None, name: str = MACHINE,
               key: Hashable = (), per_thread: bool = True) -> Settled:
        """`probe()`'s decision for `path` (with `key`, for `owner`'s lifetime: a model; at this
        thread's count where `per_thread`), run once and kept; later calls return it."""
        full: Key = (path, key, torch.get_num_threads() if per_thread else None)
        table = self._machine if owner is None else self._by_model.get(owner)
        if table is not None and (known := table.get(full)) is not None:
            return known
        with self._lock:
            table = self._machine if owner is None else self._by_model.setdefault(owner, {})
            if (known := table.get(full)) is not None:
                return known
            marker = (id(owner), full)
            if marker in self._deciding:
                raise RuntimeError(f"the probe of {path!r} asked for its own decision")
            self._deciding.add(marker)
            try:
                verdict = probe()
            finally:
                self._deciding.discard(marker)
            proof = Proof(path, name, full[2], verdict.proven, verdict.why, datetime.now(UTC))
            table[full] = settled = Settled(proof, verdict.value)
            _log.log(logging.WARNING if verdict.warn else logging.INFO, "%s", proof.line())
            return settled

    def decisions(self) -> list[Proof]:
        """Every decision kept, in the order they were made."""
        with self._lock:
            tables = [self._machine, *(table for _, table in self._by_model.items())]
            return sorted((settled.proof for table in tables for settled in table.values()), key=lambda p: p.at)

    @contextmanager
    def set_aside(self, *paths: str) -> Iterator[None]:
        """For tests: the decisions of `paths` forgotten inside the block (their probes run again)
        and the ones from before put back after it."""
        with self._lock:
            kept = [(table, self._take(table, paths)) for table in self._tables()]
        try:
            yield
        finally:
            with self._lock:
                for table in self._tables():
                    self._take(table, paths)
                for table, entries in kept:
                    table.update(entries)

    def _tables(self) -> list[dict[Key, Settled]]:
        return [self._machine, *(table for _, table in self._by_model.items())]

    @staticmethod
    def _take(table: dict[Key, Settled], paths: tuple[str, ...]) -> dict[Key, Settled]:
        taken = {full: settled for full, settled in table.items() if full[0] in paths}
        for full in taken:
            del table[full]
        return taken


REGISTRY = ProofRegistry()


def settle(path: str, probe: Callable[[], Verdict], *, owner: object | None = None, name: str = MACHINE,
           key: Hashable = (), per_thread: bool = True) -> Settled:
    """`ProofRegistry.settle` on the process's one registry."""
    return REGISTRY.settle(path, probe, owner=owner, name=name, key=key, per_thread=per_thread)


def proof_decisions() -> list[Proof]:
    """Every fast path's decision made in this process so far, oldest first: what the KV cache &
    speed page lists and `python -m engine proofs` prints."""
    return REGISTRY.decisions()


def shape_name(weight: torch.Tensor) -> str:
    """A weight's name in a proof: its shape."""
    return "weight " + "x".join(str(size) for size in weight.shape)


def set_aside(*paths: str) -> contextlib.AbstractContextManager[None]:
    """`ProofRegistry.set_aside` on the process's one registry (for tests)."""
    return REGISTRY.set_aside(*paths)
