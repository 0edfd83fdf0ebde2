"""One queue for the forward passes of every generation that shares a model.

Each visitor's generation runs on its own thread (Streamlit runs each session's script on
one). Left alone, thirty of them would run thirty forward passes at once, their thread teams
fighting over the cores, each pass many times slower than alone (`python -m bench.sched_bench`'s
"direct" mode; figures in docs/benchmarks.md). Here every pass waits in one queue and one
worker thread runs them, and the decode steps that are waiting together go through the model
as ONE packed pass (continuous batching): each weight is read once for all of them.

Numbers: a pass alone in its round is the plain batch-1 pass, so a visitor alone gets
transformers' own numbers. How a packed pass multiplies (engine/serving/packed.py) is the `batching`
setting, the server's TBT_BATCHING:
  - "exact" (default): each row summed in the order its lone 1-row product sums it (the
    orders: engine/fast/exact_rows_kernel.cpp's header), every weight read once for all rows:
    every visitor gets bit for bit the numbers it would get alone. On the CPU only: on a GPU no
    packed pass is proven to keep the lone digits, so there "exact" runs every pass alone
    (engine/serving/packed.py `scripted_passes_apply`);
  - "fast": one library matrix product for all rows; logits within ~1e-4 of the lone numbers
    (bench/batch_parity.py); on a CPU where the exact kernel is built, no faster;
  - "off": no batching, every pass alone, one at a time.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from transformers import DynamicCache

from engine.errors import SettingsError
from engine.forward import cache_length, forward_one, lone_pass_decision
from engine.loading import LoadedModel
from engine.serving.packed import (
    forward_packed,
    forward_prefills,
    scripted_passes_apply,
    scripted_plan,
    scripted_prefill,
)
from engine.serving.packed_twin import packed_twin
from engine.settings import is_whole

BATCHING_ENV = "TBT_BATCHING"  # the server's batching setting: exact, fast or off
BATCHING = ("exact", "fast", "off")
DEFAULT_MAX_BATCH = 32  # decode steps in one packed pass
GATHER_S = 0.03  # longest wait for the last pass's visitors to come back before the next pass
PREFILL_TOKENS = 256  # prompt tokens read per round (the oldest prompt always goes, however long)
SLOW_RETURN_S = 0.5  # visitors who take longer than this to step again (reading, thinking) are not waited for
RETURNS_KEPT = 32  # return times kept for their median
STATS_WINDOW_S = 10.0  # tokens/s and visitors are counted over this many seconds
RECENT_PASSES = 40  # batch sizes kept for the stats
# An eager pass (a model whose packed passes run on the twin, or no batching) gives up the GIL
# and takes it back around every torch op, thousands of times a pass. At Python's default
# switch interval (5 ms) each take can wait 5 ms behind a visitor's page script, so a short
# interval makes such a pass several times faster beside busy scripts (`bench.gil_bench`). A
# scripted packed pass (engine/fast/scripted_llama.py) takes the GIL once, and there the
# short interval only costs the page scripts, without a measurable gain (`bench.load_bench`),
# so it is left as it is. Figures: docs/benchmarks.md.
SWITCH_INTERVAL_S = 0.0002
T = TypeVar("T")


def batching_from_env(environ: Mapping[str, str] = os.environ) -> str:
    """The batching setting TBT_BATCHING names (exact when unset)."""
    value = environ.get(BATCHING_ENV, "").strip().lower() or "exact"
    if value not in BATCHING:
        raise SettingsError(BATCHING_ENV, value, f"one of {', '.join(BATCHING)}")
    return value


def worth_running_now(waiting: int, expected: int, typical_return_s: float) -> bool:
    """Whether the next pass starts at once with the `waiting` decode steps, rather than waiting
    up to GATHER_S for more of the `expected` visitors: when fewer than two are expected, or
    half of them are there already, or visitors come back too slowly for the wait to gather any
    (`typical_return_s`: the median time from a visitor's pass to its next step). With 30
    visitors about half are in the queue when a pass ends (the others are sampling and drawing
    theirs), and none of those could be back within GATHER_S: waiting for them cost the server
    tokens/s (alternating `python -m bench.load_bench` runs at 10 and at 30 visitors; figures in
    docs/benchmarks.md). A class that thinks a second or so between clicks comes back one by one:
    every pass waited its whole GATHER_S for less than one more visitor."""
    return expected < 2 or 2 * waiting >= expected or typical_return_s > SLOW_RETURN_S


class SchedulerClosed(RuntimeError):
    """A pass was asked of a scheduler that has been closed."""


@dataclass(frozen=True)
class SchedulerStats:
    """What the scheduler has been doing, for a page to show."""

    visitors: int  # generations that had a pass in the last `window_s` seconds
    waiting: int  # passes queued now
    passes: int  # forward passes run since the start
    tokens: int  # next tokens delivered since the start (one per request)
    recent_batches: tuple[int, ...]  # requests served by each of the latest passes, oldest first
    tokens_per_s: float  # next tokens delivered per second over the last `window_s` seconds
    window_s: float
    batching: str  # exact, fast or off ("off" too when the model cannot run packed passes)
    max_batch: int


@dataclass(eq=False)
class _Request:
    """One visitor's pass: `token_ids` read after `cache`'s positions; or, with `job`, a
    measurement's own pass (`ForwardScheduler.call`)."""

    token_ids: list[int]
    cache: DynamicCache | None
    future: Future
    job: Callable[[], Any] | None = None

    @property
    def is_decode(self) -> bool:
        return self.job is None and len(self.token_ids) == 1

    @property
    def is_prefill(self) -> bool:
        return self.job is None and len(self.token_ids) > 1


@dataclass(frozen=True)
class _Pass:
    finished: float  # perf_counter
    requests: int


_open: weakref.WeakSet[ForwardScheduler] = weakref.WeakSet()


@atexit.register
def _close_open() -> None:
    """At exit, stop each open scheduler's worker before the interpreter tears down: a worker
    thread that set its own torch thread count and is still alive then aborts the process
    ("terminate called without an active exception", exit status 134) after all else succeeded."""
    for scheduler in list(_open):
        scheduler.close()


class ForwardScheduler:
    """Runs every forward pass of the generations sharing one model, one pass at a time.

    The policy, one round after another on one worker thread:
      1. every decode step waiting (one new token after the cache), oldest first, up to
         `max_batch`, in ONE packed pass; a decode step alone in its round takes the plain
         batch-1 pass;
      2. then the waiting prefills (several tokens: a prompt), oldest first, until the round
         has read PREFILL_TOKENS prompt tokens; the oldest always goes. New visitors' prompts
         (empty caches) are read in one call (engine/serving/packed.py forward_prefills: each its lone
         prefill's numbers); a prompt read after a cache's positions runs alone.
    A request that arrives while a pass runs joins the next round. So a class that starts
    together has its short prompts read in one round, a long prompt delays the others'
    decode steps by one prompt at most, and a prompt waits one decode pass at most. With
    batching "off", every request runs alone, first come first served.

    A packed pass that fails is undone (each cache put back) and its requests run again one
    by one, so only the request at fault fails. Once a request is answered the scheduler
    holds nothing of it: a dropped generation's cache is freed.

    Args:
        lm: the model every request runs on.
        batching: "exact" (each visitor's numbers bit for bit its lone ones), "fast" (within
            ~1e-4 of them) or "off" (every pass alone).
        max_batch: most decode steps in one packed pass.
    """

    def __init__(self, lm: LoadedModel, *, batching: str = "exact", max_batch: int = DEFAULT_MAX_BATCH) -> None:
        if batching not in BATCHING:
            raise SettingsError("batching", batching, f"one of {', '.join(BATCHING)}")
        if not is_whole(max_batch) or max_batch < 1:
            raise SettingsError("max_batch", max_batch, "a whole number >= 1")
        self.lm = lm
        self.max_batch = max_batch
        # exact batching packs only where its passes are proven to keep each row's lone digits
        can_pack = (batching == "fast" or (batching == "exact" and scripted_passes_apply(lm))) and \
            packed_twin(lm, batching == "exact") is not None
        self.batching = batching if can_pack else "off"
        # compiled and probed now, not in a visitor's first pass
        scripted = can_pack and scripted_plan(lm, batching == "exact") is not None
        if can_pack:
            scripted_prefill(lm)
        lone_pass_decision(lm)  # a visitor alone: the fast lone pass probed now, at the worker's thread count
        self._threads = torch.get_num_threads()  # the worker's passes use what a visitor's would
        if not scripted and sys.getswitchinterval() > SWITCH_INTERVAL_S:  # the process's setting: see SWITCH_INTERVAL_S
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._queue: deque[_Request] = deque()
        self._ready = threading.Condition()
        self._closed = False
        self._passes: deque[_Pass] = deque(maxlen=RECENT_PASSES)
        self._seen: dict[int, float] = {}  # id(cache) -> last served; ids only, never the caches
        self._returns: deque[float] = deque(maxlen=RETURNS_KEPT)  # seconds from a visitor's pass to its next step
        self._totals = [0, 0]  # passes, tokens
        self._worker = threading.Thread(target=self._work, name="forward-scheduler", daemon=True)
        self._worker.start()
        _open.add(self)

    # ---- what generations call ------------------------------------------------------------

    def forward(self, token_ids: list[int], cache: DynamicCache) -> torch.Tensor:
        """Wait for this pass's turn and return its next-token logits `[vocab]`; `cache` grows
        by `len(token_ids)`. If the pass fails, the cache is as it was and the error is raised.
        If the wait is interrupted, the request is withdrawn (or finished) before this returns,
        so the caller owns its cache again."""
        return self._answer(self._enqueue(token_ids, cache))

    def submit(self, token_ids: list[int], cache: DynamicCache) -> Future:
        """Queue this pass and return at once: the future's result is what `forward` returns.
        `cache` is the worker's until the future is done; `cancel(cache)` withdraws it."""
        return self._enqueue(token_ids, cache).future

    def call(self, job: Callable[[], T]) -> T:
        """Run `job` (a pass of the model outside any visitor's generation: a lab's experiment)
        on the worker, in a round of its own after the visitors' passes already waiting, and
        return what it returns (or raise what it raised). So its passes queue with everyone's
        instead of fighting them for the cores, and each visitor waits at most one such pass
        more. `job` must not touch a visitor's cache."""
        return self._answer(self._enqueue([], None, job))

    def _answer(self, request: _Request) -> Any:
        """Wait for `request`'s result; if the wait is interrupted, withdraw it (or let it finish)
        before raising, so the caller owns what it handed over again."""
        try:
            return request.future.result()
        except BaseException:
            self._withdraw(request)
            raise

    def _enqueue(self, token_ids: list[int], cache: DynamicCache | None,
                 job: Callable[[], Any] | None = None) -> _Request:
        request = _Request(list(token_ids), cache, Future(), job)
        with self._ready:
            if self._closed:
                raise SchedulerClosed("The forward-pass scheduler has been closed.")
            if request.is_decode and (served := self._seen.get(id(cache))) is not None:
                self._returns.append(time.perf_counter() - served)
            self._queue.append(request)
            self._ready.notify()
        return request

    def cancel(self, cache: DynamicCache) -> int:
        """Withdraw every queued pass on `cache` (a visitor who left); returns how many."""
        with self._ready:
            mine = [r for r in self._queue if r.cache is cache]
            for request in mine:
                self._queue.remove(request)
                request.future.cancel()
        return len(mine)

    def stats(self) -> SchedulerStats:
        """A snapshot of the queue and the latest passes."""
        now = time.perf_counter()
        with self._ready:
            passes = tuple(self._passes)
            visitors = sum(1 for last in self._seen.values() if now - last <= STATS_WINDOW_S)
            waiting = len(self._queue)
            total_passes, total_tokens = self._totals
        recent = [p for p in passes if now - p.finished <= STATS_WINDOW_S]
        return SchedulerStats(
            visitors=visitors, waiting=waiting, passes=total_passes, tokens=total_tokens,
            recent_batches=tuple(p.requests for p in passes),
            tokens_per_s=sum(p.requests for p in recent) / STATS_WINDOW_S, window_s=STATS_WINDOW_S,
            batching=self.batching, max_batch=self.max_batch)

    def close(self) -> None:
        """Stop the worker after the pass it is running; queued requests fail with SchedulerClosed.
        Every scheduler still open is closed when the process exits (`_close_open`)."""
        with self._ready:
            self._closed = True
            for request in self._queue:
                request.future.set_exception(SchedulerClosed("The forward-pass scheduler was closed."))
            self._queue.clear()
            self._ready.notify()
        if threading.current_thread() is not self._worker:
            self._worker.join()

    # ---- the worker ---------------------------------------------------------------------------

    def _work(self) -> None:
        torch.set_num_threads(self._threads)
        while True:
            with self._ready:
                while not self._queue and not self._closed:
                    self._ready.wait()
                self._gather()
                if self._closed:
                    return
            self._run_round(*self._take_round())  # no local keeps a request between rounds

    def _gather(self) -> None:
        """Give the visitors who stepped in the last second up to GATHER_S to come back (each
        samples its token on the one sampler thread, one after another) so they share the next
        pass rather than splitting into several smaller ones, unless the pass is worth running
        now (`worth_running_now`). Called holding the lock."""
        now = time.perf_counter()
        expected = min(self.max_batch, sum(1 for last in self._seen.values() if now - last <= 1.0))
        returns = sorted(self._returns)
        typical_return_s = returns[len(returns) // 2] if returns else 0.0
        if self.batching == "off" or worth_running_now(sum(r.is_decode for r in self._queue), expected,
                                                       typical_return_s):
            return
        deadline = now + GATHER_S
        while not self._closed and sum(r.is_decode for r in self._queue) < expected:
            left = deadline - time.perf_counter()
            if left <= 0:
                return
            self._ready.wait(left)

    def _take_round(self) -> tuple[list[_Request], list[_Request], list[_Request]]:
        """This round's decode steps, prefills and job (each oldest first), out of the queue."""
        with self._ready:
            if self.batching != "off":
                decodes = [r for r in self._queue if r.is_decode][:self.max_batch]
                prefills = self._prefills_within_budget()
                jobs = [r for r in self._queue if r.job is not None][:1]
            else:  # one request a round, the oldest
                oldest = self._queue[0]
                decodes, prefills, jobs = ([oldest] if oldest.is_decode else [], [oldest] if oldest.is_prefill else [],
                                           [oldest] if oldest.job is not None else [])
            for request in (*decodes, *prefills, *jobs):
                self._queue.remove(request)
                request.future.set_running_or_notify_cancel()
            return decodes, prefills, jobs

    def _prefills_within_budget(self) -> list[_Request]:
        chosen, budget = [], PREFILL_TOKENS
        for request in self._queue:
            if request.is_prefill and (not chosen or len(request.token_ids) <= budget):
                chosen.append(request)
                budget -= len(request.token_ids)
                if budget <= 0:
                    break
        return chosen

    def _run_round(self, decodes: list[_Request], prefills: list[_Request], jobs: list[_Request]) -> None:
        if len(decodes) > 1:
            self._run_packed(decodes)
        elif decodes:
            self._run_alone(decodes[0])
        fresh = [r for r in prefills if self.batching != "off" and cache_length(r.cache) == 0]
        if fresh:
            self._run_prefills(fresh)
        for request in prefills:
            if request not in fresh:
                self._run_alone(request)
        for request in jobs:
            self._run_job(request)

    def _run_packed(self, requests: list[_Request]) -> None:
        try:
            logits = forward_packed(self.lm, [r.token_ids[0] for r in requests], [r.cache for r in requests],
                                    exact=self.batching == "exact")
        except Exception:  # the caches are back as they were: find the request at fault alone
            for request in requests:
                self._run_alone(request)
            return
        self._note_pass(requests)  # before any answer: a visitor who reads the stats sees its pass
        for request, row in zip(requests, logits, strict=True):
            request.future.set_result(row.clone())  # [vocab], its own storage

    def _run_prefills(self, requests: list[_Request]) -> None:
        """New visitors' prompts, read together (each its lone prefill's numbers)."""
        try:
            logits = forward_prefills(self.lm, [r.token_ids for r in requests], [r.cache for r in requests])
        except Exception:  # the caches are back as they were: find the request at fault alone
            for request in requests:
                self._run_alone(request)
            return
        self._note_pass(requests)
        for request, row in zip(requests, logits, strict=True):
            request.future.set_result(row)

    def _run_alone(self, request: _Request) -> None:
        try:
            logits = forward_one(self.lm, request.token_ids, request.cache)
        except Exception as exc:
            request.future.set_exception(exc)
            return
        self._note_pass([request])
        request.future.set_result(logits)

    def _run_job(self, request: _Request) -> None:
        try:
            result = request.job()
        except Exception as exc:
            request.future.set_exception(exc)
            return
        request.future.set_result(result)

    def _note_pass(self, requests: list[_Request]) -> None:
        now = time.perf_counter()
        with self._ready:
            self._passes.append(_Pass(now, len(requests)))
            self._totals[0] += 1
            self._totals[1] += len(requests)
            for request in requests:
                self._seen[id(request.cache)] = now
            for key in [k for k, last in self._seen.items() if now - last > STATS_WINDOW_S]:
                del self._seen[key]

    def _withdraw(self, request: _Request) -> None:
        """Take an unanswered request back: out of the queue, or wait for its pass to end."""
        with self._ready:
            if request in self._queue:
                self._queue.remove(request)
                request.future.cancel()
                return
        if not request.future.done():  # its pass is under way: the cache is the worker's until it ends
            wait([request.future])
