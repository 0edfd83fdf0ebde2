"""Class soak: a whole lesson in one room, its server killed and started again half-way.

    .venv/bin/python -m bench.class_soak [--students 60] [--steps 400] [--store sqlite|postgres|both] [--gap 0.5]

For each store (the SQLite file in a temporary folder, or a PostgreSQL server the benchmark starts
itself with Debian's initdb: bench/postgres.py) a fresh `streamlit run app.py` is driven with the
headless protocol client (bench/streamlit_client.py). Each student is its browser, as in
bench/class_bench.py (the follow fragment's timer, the follow endpoint's long poll and the trigger
it sends), with a cookie of its own, as a browser has, by which the app knows it again. The
presenter opens /class, starts a class, and in the Stop settings sets Max new tokens past --steps
and Ignore EOS; the students open the student link and each types a name. Then, --steps times:
every student guesses the next token the ways the page offers (a word typed, or one of the
candidate chips once they come; one guess in CHANGE_SHARE is then changed for another chip), and
the presenter presses Step once every student's page has confirmed their guess ("Your guess: ...")
and --gap seconds have passed since the last Step.

Half-way (after the guesses for step --steps/2) the server is killed (SIGKILL) and started again
on the same port and database. The database itself is read then (classroom's own store, as the
server reads it): the room, its tokens and every guess sent so far must be there. Every page
reconnects by itself as the frontend does (the health check retried, then the address bar's page
rerun with the same cookie); each student's page must show the room's steps, their guess and the
same score as before the kill. The presenter's page must come back as the presenter's (its Step
button); where it does not, the presenter reopens the presenter link, as docs/class.md tells them.

Measured, per store:
  errors: error boxes and exceptions the pages drew, runs that failed, protocol failures, pages
      that did not come back, students' scores that differ from the store's, and phantom guesses
      (a page showing "Your guess" for a token before its student guessed it);
  missed / unconfirmed: a student not showing a step within FOLLOW_TIMEOUT_S of the Step, or
      whose guess their page did not confirm within SETTLE_TIMEOUT_S;
  lost guesses: each student's last guess for every token, read back from the store at the end
      (and at the kill): missing, or another text or chip than the one sent;
  RSS: the server's resident memory every RSS_EVERY_S, for each of its two processes: its value
      once the process has served WARM_UP_SHARE of the steps (at least MIN_WARM_UP), the most after
      that, and the growth (goal: within 50 MB);
  restart: from the kill to the new process answering its health check, and to every page back;
  wall time.

Every loop is bounded in count and time. Results go to bench/results/class_soak.json, with the
CPU's name and the load average (figures taken while other work runs on the machine are inflated).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import secrets
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from websockets.exceptions import WebSocketException

from bench.appserver import free_port, served_app_process
from bench.class_bench import (
    FOLLOW_TIMEOUT_S,
    GUESS_FIELD,
    GUESSES,
    OPEN_TIMEOUT_S,
    PAGE,
    START,
    STEP,
    Student,
    http_get,
    rooms_for,
    steps_in,
)
from bench.determinism_bench import cpu_name
from bench.load_bench import percentile, rss_mb
from bench.streamlit_client import RunResult, Visitor, VisitorError, rerun_message
from classroom.hall import context_key
from classroom.store import RoomStore
from classroom.store_pg import PostgresRoomStore
from ui.controllers.class_room import link_warning
from ui.session.keys import CLASS
from ui.session.keys import STEP as STEP_KEYS
from ui.views.format import plain, quoted

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PICK_FIELD = CLASS.guess_pick  # + the slot, as GUESS_FIELD (ui/controllers/class_room.py guess_keys)
MAX_TOKENS = CLASS.presenter + STEP_KEYS.max_new_tokens
IGNORE_EOS = CLASS.presenter + STEP_KEYS.ignore_eos
GAP_S = 0.5
GUESS_AFTER_S = (0.1, 0.6)  # a student reads the reveal (or the chips), then guesses
CHIP_SHARE = 0.5  # of guesses made by picking a candidate chip (the others are typed)
CHANGE_SHARE = 0.1  # of guesses changed once before the reveal
CHIPS_WAIT_S = 3.0  # a student who meant to pick a chip types instead if none came by then
SETTLE_TIMEOUT_S = 20.0  # every page confirms its guess within this, or it counts as unconfirmed
RECONNECT_TIMEOUT_S = 240.0  # the new process starts (the model loads) and the room is rebuilt
RSS_EVERY_S = 1.0
WARM_UP_SHARE, MIN_WARM_UP = 0.1, 5  # of each process's steps
GROWTH_GOAL_MB = 50.0
YOUR_GUESS = "Your guess:"
YOUR_SCORE = re.compile(r"Your score: <b>(\d+) of (\d+)</b>")
TOKENS_SHOWN = re.compile(r"\*\*(\d+)\*\* tokens? generated")  # the presenter's button row
PRESENTER_LINK = re.compile(r"[?&]key=([A-Za-z0-9_-]+)")


def browser_cookie() -> str:
    """A browser's Cookie header with Streamlit's XSRF cookie (a plain token): the app knows the
    browser by it across reloads and server restarts (ui/server/class_room.py `browser_key`)."""
    return f"_streamlit_xsrf={secrets.token_hex(16)}"


async def healthy(base_url: str) -> bool:
    host, port = base_url.split("//", 1)[1].split(":")
    try:
        status, _ = await http_get(host, int(port), "/_stcore/health", 2.0)
    except (OSError, TimeoutError, ValueError):
        return False
    return status == 200


async def come_back(visitor: Visitor, button_keys: tuple[str, ...], deadline: float) -> RunResult | None:
    """What the frontend does when its connection drops: wait 0.25-0.5 s, ask the server's health
    check again after 0.1, 0.2, 0.4 ... 4 s (jittered), then connect again and rerun the page.
    None when the server did not come back by `deadline` (time.perf_counter)."""
    base_url = visitor.url.split("?", 1)[0].removesuffix(f"/{visitor.page_name}")
    await asyncio.sleep(random.uniform(0.25, 0.5))
    for attempt in range(1, 1000):
        if time.perf_counter() > deadline:
            return None
        if await healthy(base_url):
            with contextlib.suppress(OSError, TimeoutError, WebSocketException, VisitorError):
                return await visitor.reconnect(button_keys)
        await asyncio.sleep(min(4.0, 0.1 * 2 ** (attempt - 1)) * random.uniform(0.7, 1.0))
    return None


@dataclass
class SentGuess:
    """A guess as the student's page sent it: typed text, or a candidate chip's label."""

    step: int  # the tokens shown when it was made: a guess for token step + 1
    chip: bool
    value: str
    sent_at: float = float("inf")  # time.perf_counter when it left; inf while queued
    confirmed: bool = False  # a run that began after it showed it as "Your guess: ..."

    def shown_in(self, texts: tuple[str, ...]) -> bool:
        """Whether a page's texts show this guess as the student's: a chip's label as is, a typed
        word as its first token, which this client cannot tell (so a typed guess is only ever a
        student's first for a token)."""
        shown = [text for text in texts if text.startswith(YOUR_GUESS)]
        return any(f"**{plain(self.value)}**" in text for text in shown) if self.chip else bool(shown)


class SoakStudent(Student):
    """A follower (class_bench's Student: the timer, the long poll) that guesses every step the
    ways the page offers, notes what its page confirmed and scored, and reconnects by itself when
    the server goes away."""

    def __init__(self, visitor: Visitor, name: str, push: bool = True) -> None:
        super().__init__(visitor, push)
        self.name = name
        self.run_errors: list[str] = []
        self.steps_shown = -1
        # each keyed by the tokens shown when the page drew its guess controls: a guess is for the next
        self.slots: dict[int, str] = {}  # -> the slot the guess controls were last drawn under
        self.chip_labels: dict[int, tuple[str, ...]] = {}  # -> the candidate chips, once drawn
        self.guesses: dict[int, SentGuess] = {}  # -> the latest guess sent
        self.planned: set[int] = set()  # decided how to guess
        self.wants_chip: set[int] = set()  # waiting for the chips, to pick one
        self.changed: set[int] = set()  # changed its guess (once at most)
        self.waiting = 0  # guesses scheduled or queued, not sent yet
        self.score: tuple[int, int] | None = None  # (right, guessed), as their page last showed it
        self.shown_guess = ""  # "Your guess: ..." as their page last showed it
        self.phantoms: list[int] = []  # steps whose next token the page showed a guess for before this student sent one
        self.closed = asyncio.Event()
        self.lost_at: float | None = None  # when the connection last dropped
        self.back: RunResult | None = None  # the first run after coming back
        self.back_at = float("nan")  # when it ended (time.perf_counter)
        self.reconnect_failed = False

    # ---- what the page shows --------------------------------------------------------------

    def on_run(self, result: RunResult) -> None:
        self.run_errors += result.errors
        if self.drawn() >= self.asked:
            self.landed.set()
        steps = steps_in(self.visitor, result)
        self.saw(steps)
        if steps is None:
            return
        self.steps_shown = steps
        if found := next((YOUR_SCORE.search(text) for text in result.texts if YOUR_SCORE.search(text)), None):
            self.score = (int(found.group(1)), int(found.group(2)))
        self.shown_guess = next((text for text in result.texts if text.startswith(YOUR_GUESS)), self.shown_guess)
        field_keys = [key for key in result.drawn if key.startswith(GUESS_FIELD)]
        if not field_keys:
            return
        slot = self.slots[steps] = field_keys[-1].removeprefix(GUESS_FIELD)
        if PICK_FIELD + slot in result.drawn:  # a slot's key is used again later: only chips drawn now are this step's
            self.chip_labels[steps] = self.visitor.widgets[PICK_FIELD + slot].options
        sent = self.guesses.get(steps)
        if sent is None and any(text.startswith(YOUR_GUESS) for text in result.texts) and steps not in self.phantoms:
            self.phantoms.append(steps)
        if sent is not None and not sent.confirmed and sent.sent_at < result.began and sent.shown_in(result.texts):
            sent.confirmed = True
            if steps not in self.changed and random.random() < CHANGE_SHARE:  # a second thought: another chip
                self.changed.add(steps)
                self.later(random.uniform(*GUESS_AFTER_S), lambda: self.guess(steps, True, change=True))
        if steps not in self.planned:
            self.planned.add(steps)
            if random.random() < CHIP_SHARE:
                self.wants_chip.add(steps)
                asyncio.get_running_loop().call_later(CHIPS_WAIT_S, self.no_chips, steps)
            else:
                self.later(random.uniform(*GUESS_AFTER_S), lambda: self.guess(steps, False))
        if steps in self.wants_chip and self.chip_labels.get(steps):  # the candidates came (a moment after the reveal)
            self.wants_chip.discard(steps)
            self.later(random.uniform(*GUESS_AFTER_S), lambda: self.guess(steps, True))

    def no_chips(self, steps: int) -> None:
        """No candidates came in time: type a word instead."""
        if steps in self.wants_chip:
            self.wants_chip.discard(steps)
            self.guess(steps, False)

    def later(self, seconds: float, then: Callable[[], None]) -> None:
        self.waiting += 1

        def due() -> None:
            self.waiting -= 1
            then()
        asyncio.get_running_loop().call_later(seconds, due)

    def guess(self, steps: int, chip: bool, change: bool = False) -> None:
        """Send a guess for the token after `steps` (a chip when one is there and `chip`, else a
        word typed; a `change` is another chip, or none), unless the page has moved on since."""
        if self.steps_shown != steps or steps not in self.slots or self.closed.is_set():
            return
        slot, chips, previous = self.slots[steps], self.chip_labels.get(steps, ()), self.guesses.get(steps)
        others = [c for c in chips if previous is None or c != previous.value]
        if chip and others:
            label = random.choice(others)
            sent, msg = SentGuess(steps, True, label), self.visitor.value_message(PICK_FIELD + slot, [label])
        elif not change:
            word = random.choice(GUESSES)
            sent, msg = SentGuess(steps, False, word), self.visitor.text_message(GUESS_FIELD + slot, word)
        else:
            return
        self.guesses[steps] = sent
        self.waiting += 1
        self.to_send.put_nowait((msg, sent))

    def settled(self, steps: int) -> bool:
        """This page has confirmed its guess for the token after `steps`, and means to send no other."""
        sent = self.guesses.get(steps)
        return sent is not None and sent.confirmed and not self.waiting and steps not in self.wants_chip

    # ---- the connection -----------------------------------------------------------------------

    async def follow(self, until: asyncio.Event) -> None:
        host = self.visitor.url.split("//", 1)[1].split(":", 1)[0]
        polling = asyncio.create_task(self.poll(host)) if self.push else None
        try:
            while not until.is_set():
                await self.session(until)
                if until.is_set():
                    break
                self.lost_at = time.perf_counter()
                while not self.to_send.empty():  # what the page sent to a dead server is gone with it
                    item = self.to_send.get_nowait()
                    self.waiting -= isinstance(item, tuple)
                back = await come_back(self.visitor, (), self.lost_at + RECONNECT_TIMEOUT_S)
                if back is None:
                    self.reconnect_failed = True
                    break
                [(self.fragment, self.interval)] = self.visitor.auto_reruns.items()
                self.asked = -1  # a restarted server: the element asks its new address afresh (ui/widgets/follow.py)
                self.back, self.back_at = back, time.perf_counter()
                self.closed.clear()
                self.on_run(back)
        finally:
            if polling is not None:
                polling.cancel()

    async def session(self, until: asyncio.Event) -> None:
        """Listen, play the fragment's timer and send what the page sends, until `until` or the
        connection drops (then `closed` is set)."""
        stop = asyncio.Event()
        listening = asyncio.create_task(self.listen(stop))
        next_tick = time.perf_counter() + random.uniform(0, self.interval)  # browsers' timers are not in step
        while not until.is_set() and not self.closed.is_set():
            try:
                item = await asyncio.wait_for(self.to_send.get(), min(0.25, max(0.0, next_tick - time.perf_counter())))
            except TimeoutError:
                if time.perf_counter() < next_tick:
                    continue
                item, next_tick = self.visitor.auto_rerun_message(self.fragment), next_tick + self.interval
            msg, sent = item if isinstance(item, tuple) else (item, None)
            try:
                await self.visitor.send(msg)
            except WebSocketException:
                self.closed.set()
            if sent is not None:
                self.waiting -= 1
                sent.sent_at = time.perf_counter() if not self.closed.is_set() else sent.sent_at
        stop.set()
        await listening

    async def listen(self, stop: asyncio.Event) -> None:
        try:
            await self.visitor.listen(self.on_run, stop)
        except (WebSocketException, VisitorError):
            self.closed.set()


@dataclass
class Lesson:
    """The room as the store holds it: its tokens, and every guess (with the student's name)."""

    prompt_ids: list[int]
    tokens: list[int]
    guesses: list  # classroom.store.GuessRow

    def context_after(self, steps: int) -> str:
        """The context the guesses for the token after `steps` are stored under."""
        return context_key([*self.prompt_ids, *self.tokens[:steps]])

    def contexts(self) -> list[str]:
        """The context each revealed step's guesses are stored under (classroom.hall.step_contexts)."""
        return [self.context_after(i) for i in range(len(self.tokens))]


def read_lesson(rooms: str, code: str) -> Lesson:
    """The room `code` read back from the database with the project's own store (a SQLite path or a
    PostgreSQL URL), as a server would read it."""
    store = PostgresRoomStore(rooms) if rooms.startswith("postgresql:") else RoomStore(rooms)
    try:
        row = store.room(code)
        if row is None:
            return Lesson([], [], [])
        trace = json.loads(row.trace)
        return Lesson(trace["prompt_token_ids"], [step["token_id"] for step in trace["steps"]], store.guesses(code))
    finally:
        store.close()


def lost_guesses(students: list[SoakStudent], lesson: Lesson, up_to: int) -> list[str]:
    """Every guess a page sent (its last for each token) for the tokens after 0..up_to steps that
    the store does not hold as sent (by the student's name and the context)."""
    stored = {(row.name, row.context): row for row in lesson.guesses}
    lost = []
    for student in students:
        for sent in student.guesses.values():
            if sent.sent_at == float("inf") or sent.step > up_to:
                continue
            row = stored.get((student.name, lesson.context_after(sent.step)))
            if row is None:
                lost.append(f"{student.name} step {sent.step}: {sent.value!r} is not in the store")
            elif (quoted(row.text) if sent.chip else row.text) != sent.value:
                lost.append(f"{student.name} step {sent.step}: {sent.value!r} stored as {row.text!r}")
    return lost


def stored_scores(lesson: Lesson) -> dict[str, tuple[int, int]]:
    """Each student's (right, guessed) over the revealed steps, from the store's guesses and tokens."""
    step_of = {context: i for i, context in enumerate(lesson.contexts())}
    scores: dict[str, tuple[int, int]] = {}
    for row in lesson.guesses:
        if (i := step_of.get(row.context)) is not None:
            right, guessed = scores.get(row.name, (0, 0))
            scores[row.name] = (right + (row.token_id == lesson.tokens[i]), guessed + 1)
    return scores


@dataclass
class Server:
    """The app's server process of the moment (the second after the restart), and its memory."""

    port: int
    env: dict[str, str]
    logs: Path  # where each process's output goes
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    url: str = ""
    pid: int = 0
    process_index: int = -1
    rss: list[tuple[int, int, float]] = field(default_factory=list)  # (process, steps done, MB)

    def start(self) -> None:
        self.process_index += 1
        self.stack = contextlib.ExitStack()
        log = self.logs / f"class_soak_server_{self.process_index}.log"
        self.url, self.pid = self.stack.enter_context(served_app_process(log, env=self.env, port=self.port))

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        self.stack.close()  # reaps it

    async def sample(self, steps_done: Callable[[], int], until: asyncio.Event) -> None:
        while not until.is_set():
            with contextlib.suppress(OSError, RuntimeError):  # between the kill and the new process
                self.rss.append((self.process_index, steps_done(), rss_mb(self.pid)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(until.wait(), RSS_EVERY_S)


def memory(samples: list[tuple[int, int, float]], process: int, first_step: int, last_step: int) -> dict:
    """One process's memory: its value once warm (WARM_UP_SHARE of its steps served), the most after, the growth."""
    warm = first_step + max(MIN_WARM_UP, round(WARM_UP_SHARE * (last_step - first_step)))
    after = [mb for p, steps, mb in samples if p == process and steps >= warm]
    if not after:
        return {"warm_up_step": warm, "warm_mb": None, "max_mb": None, "growth_mb": None, "end_mb": None}
    return {"warm_up_step": warm, "warm_mb": after[0], "max_mb": max(after), "growth_mb": max(after) - after[0],
            "end_mb": after[-1]}


def memory_trace(samples: list[tuple[int, int, float]], steps: int, points: int = 20) -> list[tuple[int, int, float]]:
    """(process, steps done, MB): the first sample at each of `points` marks through the lesson."""
    every, trace = max(1, steps // points), []
    for process, done, mb in samples:
        if not trace or (process, done // every) != (trace[-1][0], trace[-1][1] // every):
            trace.append((process, done, round(mb, 1)))
    return trace


async def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.perf_counter() + timeout_s
    while not condition():
        if time.perf_counter() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def open_presenter(url: str, steps: int, cookie: str) -> tuple[Visitor, str, str]:
    """The presenter opens /class, starts a class and sets the Stop settings for a lesson of `steps`
    tokens; returns the page, the room's code and its secret (read from the Presenter link)."""
    presenter = await Visitor.open(url, "", timeout=OPEN_TIMEOUT_S, button_keys=(START,), page_name=PAGE,
                                   cookie=cookie)
    await presenter.click(START)
    shown = await presenter.rerun(rerun_message(presenter.query_string, presenter.page_script_hash, url=presenter.url,
                                                page_name=PAGE), (STEP,))
    code = presenter.query_string.removeprefix("room=")
    secret = next(found.group(1) for text in shown.texts if (found := PRESENTER_LINK.search(text)))
    await presenter.rerun(presenter.value_message(MAX_TOKENS, steps + 1), (STEP,))  # a guess after the last step too
    await presenter.rerun(presenter.value_message(IGNORE_EOS, True), (STEP,))
    return presenter, code, secret


async def open_students(url: str, code: str, count: int) -> list[SoakStudent]:
    visitors = await asyncio.gather(*(Visitor.open(url, f"room={code}", timeout=OPEN_TIMEOUT_S, page_name=PAGE,
                                                   cookie=browser_cookie()) for _ in range(count)))
    students = [SoakStudent(visitor, f"s{i + 1:02d}") for i, visitor in enumerate(visitors)]
    await asyncio.gather(*(s.visitor.type_text(CLASS.name, s.name) for s in students))
    return students


@dataclass
class Troubles:
    """What went wrong over the lesson."""

    missed: int = 0
    unconfirmed: int = 0
    protocol: list[str] = field(default_factory=list)
    samples: list[str] = field(default_factory=list)  # a few of the missed and unconfirmed
    triggers_at_kill: int = 0  # the follow element's triggers (the endpoint's answers) before the kill

    def step_done(self, students: list[SoakStudent], steps: int, seen: bool, settled: bool) -> None:
        late = [] if seen else [s for s in students if steps not in s.seen_at]
        unsettled = [] if settled else [s for s in students if not s.settled(steps)]
        self.missed += len(late)
        self.unconfirmed += len(unsettled)
        self.samples += [f"{s.name} did not show step {steps}" for s in late]
        self.samples += [f"{s.name} after step {steps}: sent {s.guesses.get(steps)}, "
                         f"waiting {s.waiting}, page shows {s.shown_guess[:60]!r}" for s in unsettled]
        del self.samples[8:]


async def restart(server: Server, rooms: str, code: str, secret: str, presenter: Visitor,
                  students: list[SoakStudent], steps: int, tally: Troubles) -> tuple[Visitor, dict]:
    """Kill the server, check the database holds the lesson, start it again, and wait for every
    page to come back by itself. Returns the presenter's page (reopened by its link if it did not
    come back as the presenter's) and what was found."""
    scores_before = {s.name: s.score for s in students}
    tally.triggers_at_kill = sum(s.triggers for s in students)
    before = await asyncio.to_thread(read_lesson, rooms, code)
    killed = time.perf_counter()
    server.kill()
    after = await asyncio.to_thread(read_lesson, rooms, code)
    presenter_back = asyncio.create_task(come_back(presenter, (STEP,), killed + RECONNECT_TIMEOUT_S))
    await asyncio.to_thread(server.start)
    started = time.perf_counter()
    back = await presenter_back
    presenter_itself = back is not None and STEP in presenter.buttons
    came_back_as = None if back is None else "presenter" if presenter_itself else "student" if any(
        key.startswith(GUESS_FIELD) for key in back.drawn) else "lobby"
    if back is not None and not presenter_itself:  # the presenter link, as docs/class.md says after a restart
        with contextlib.suppress(WebSocketException):
            await presenter.close()
        presenter = await Visitor.open(server.url, f"room={code}&key={secret}", timeout=OPEN_TIMEOUT_S,
                                       button_keys=(STEP,), page_name=PAGE, cookie=presenter.cookie)
    if back is None:
        tally.protocol.append("the presenter's page did not reconnect")
    presenter_steps = next((int(found.group(1)) for text in (back.texts if back else ())
                            if (found := TOKENS_SHOWN.search(text))), None)
    all_back = await wait_until(lambda: all(s.back is not None or s.reconnect_failed for s in students),
                                RECONNECT_TIMEOUT_S)
    pages_back = max((s.back_at for s in students if s.back is not None), default=float("nan"))
    not_back = [s.name for s in students if s.back is None]
    wrong = [s.name for s in students if s.back is not None and (
        steps_in(s.visitor, s.back) != steps
        or not any(YOUR_GUESS in text for text in s.back.texts) or s.score != scores_before[s.name])]
    tally.protocol += [f"{name}'s page did not come back" for name in not_back]
    tally.protocol += [f"{name}'s page came back without its steps, guess or score" for name in wrong]
    return presenter, {
        "at_step": steps, "all_back": all_back and not not_back,
        "stored_steps_before_kill": len(before.tokens), "stored_steps_after_kill": len(after.tokens),
        "tokens_kept": after.tokens == before.tokens and len(after.tokens) == steps,
        "guesses_in_store_after_kill": len(after.guesses),
        "lost_guesses_at_kill": lost_guesses(students, after, steps),
        "presenter_back_by_itself": presenter_itself, "presenter_page_came_back_as": came_back_as,
        "presenter_steps_shown": presenter_steps,
        "students_not_back": not_back, "students_back_wrong": wrong,
        "server_start_s": started - killed, "pages_back_s": pages_back - killed,
        "first_page_back_s": min((s.back_at for s in students if s.back is not None), default=float("nan")) - killed,
    }


async def lesson(server: Server, rooms: str, count: int, steps: int, gap_s: float, store: str = "") -> dict:
    wall = time.perf_counter()
    presenter, code, secret = await open_presenter(server.url, steps, browser_cookie())
    students = await open_students(server.url, code, count)
    done, tally, restarted = asyncio.Event(), Troubles(), {}
    followers = [asyncio.create_task(s.follow(done)) for s in students]
    step_count = 0
    sampler = asyncio.create_task(server.sample(lambda: step_count, done))
    kill_at, last_step, periods, clicks = steps // 2, time.perf_counter(), ([], []), []
    try:
        for k in range(steps + 1):
            settled = await wait_until(lambda k=k: all(s.settled(k) for s in students), SETTLE_TIMEOUT_S)
            tally.step_done(students, k, True, settled)
            if k == kill_at:
                presenter, restarted = await restart(server, rooms, code, secret, presenter, students, k, tally)
            if k == steps:
                break
            await asyncio.sleep(max(0.0, gap_s - (time.perf_counter() - last_step)))
            if k != kill_at and k:
                periods[k > kill_at].append(time.perf_counter() - last_step)  # each process's
            last_step = time.perf_counter()
            clicks.append((await presenter.click(STEP)).seconds)
            step_count = k + 1
            if step_count % max(1, steps // 8) == 0:  # a long run says how far it is
                print(f"{store} step {step_count}/{steps} after {time.perf_counter() - wall:.0f} s: server RSS "
                      f"{server.rss[-1][2] if server.rss else 0:.0f} MB", flush=True)
            seen = await wait_until(lambda k=k: all(k + 1 in s.seen_at for s in students), FOLLOW_TIMEOUT_S)
            tally.step_done(students, k + 1, seen, True)
    except (VisitorError, WebSocketException, OSError) as exc:
        tally.protocol.append(f"the lesson stopped at step {step_count}: {exc}")
    wall = time.perf_counter() - wall
    done.set()
    await asyncio.gather(*followers, sampler)
    for visitor in [presenter, *(s.visitor for s in students)]:
        with contextlib.suppress(WebSocketException):
            await visitor.close()
    final = await asyncio.to_thread(read_lesson, rooms, code)
    stored = stored_scores(final)
    score_mismatch = [f"{s.name}: page {s.score}, store {stored.get(s.name, (0, 0))}" for s in students
                      if (s.score or (0, 0)) != stored.get(s.name, (0, 0))]
    lost = lost_guesses(students, final, steps)
    # the invite's warning that a loopback address makes links for the students' own devices: the bench's own address
    expected = plain(link_warning(server.url))
    run_errors = [e for e in [*(e for s in students for e in s.run_errors), *presenter.errors] if e != expected]
    sent = [g for s in students for g in s.guesses.values()]
    phantoms = [f"{s.name}'s page showed a guess for the token after step {k} before they made one"
                for s in students for k in s.phantoms]
    first, second = memory(server.rss, 0, 0, kill_at), memory(server.rss, 1, kill_at, step_count)
    growth = [m["growth_mb"] for m in (first, second) if m["growth_mb"] is not None]
    return {
        "students": count, "steps": step_count, "steps_asked": steps, "gap_s": gap_s,
        "errors": len(run_errors) + len(tally.protocol) + len(score_mismatch) + len(phantoms),
        "error_samples": sorted({e[:200] for e in run_errors + tally.protocol + score_mismatch + phantoms})[:8],
        "phantom_guesses": len(phantoms),
        "missed": tally.missed, "unconfirmed": tally.unconfirmed, "late_samples": tally.samples,
        "guesses_confirmed": sum(g.confirmed for g in sent), "guesses_by_chip": sum(g.chip for g in sent),
        "guesses_stored": len(final.guesses), "lost_guesses": len(lost), "lost_samples": lost[:8],
        "score_mismatches": score_mismatch[:8], "stored_tokens": len(final.tokens),
        "follow_poll_failures": sum(s.errors for s in students),
        "follow_triggers": [tally.triggers_at_kill, sum(s.triggers for s in students) - tally.triggers_at_kill],
        "rss_first_process": first, "rss_second_process": second,
        "rss_growth_mb": max(growth) if growth else None, "rss_samples": len(server.rss),
        "rss_trace": memory_trace(server.rss, steps),
        "step_period_p50_s": [percentile(half, 50) for half in periods],  # Step to Step, each process
        "step_period_p95_s": [percentile(half, 95) for half in periods],
        "presenter_step_p50_s": percentile(clicks, 50), "presenter_step_p95_s": percentile(clicks, 95),
        "restart": restarted, "wall_s": wall,
    }


def soak(store: str, count: int, steps: int, gap_s: float, logs: Path = RESULTS) -> dict:
    """One lesson on `store` ("sqlite" or "postgres"): its figures (see the module's docstring)."""
    with rooms_for(store) as (rooms, env):
        server = Server(free_port(), env | {"TBT_FOLLOW_PORT": str(free_port())}, logs)
        server.start()
        try:
            return {"store": store} | asyncio.run(lesson(server, rooms, count, steps, gap_s, store))
        finally:
            server.stack.close()


def row(r: dict) -> str:
    first, second, restarted = r["rss_first_process"], r["rss_second_process"], r["restart"]
    rss = " / ".join(f"{m['warm_mb']:.0f}-{m['max_mb']:.0f} (+{m['growth_mb']:.0f})" if m["warm_mb"] else "-"
                     for m in (first, second))
    start, back = restarted.get("server_start_s", float("nan")), restarted.get("pages_back_s", float("nan"))
    return (f"{r['store']:>8} {r['students']:>8} {r['steps']:>5} {r['errors']:>6} {r['missed']:>6} "
            f"{r['unconfirmed']:>6} {r['lost_guesses']:>5} {rss:>30} {start:>7.1f} {back:>7.1f} "
            f"{'yes' if restarted.get('presenter_back_by_itself') else 'no':>9} {r['wall_s']:>7.0f}")


def check_gap(text: str) -> float:
    try:
        gap = float(text)
    except ValueError:
        gap = -1.0
    if not 0 <= gap <= 30:
        raise argparse.ArgumentTypeError(f"--gap: seconds from 0 to 30 between Steps, not {text!r}")
    return gap


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, choices=range(1, 101), default=60, metavar="1-100")
    parser.add_argument("--steps", type=int, choices=range(2, 2001), default=400, metavar="2-2000")
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--gap", type=check_gap, default=GAP_S, help="least seconds between Steps (0-30)")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    results = [soak(store, args.students, args.steps, args.gap)
               for store in (("sqlite", "postgres") if args.store == "both" else (args.store,))]
    load_after = os.getloadavg()
    print(f"{'store':>8} {'students':>8} {'steps':>5} {'errors':>6} {'missed':>6} {'unconf':>6} {'lost':>5} "
          f"{'RSS MB warm-max (+growth) x2':>30} {'start s':>7} {'back s':>7} {'presenter':>9} {'wall s':>7}")
    for result in results:
        print(row(result))
    print(f"load average before/after: {load_before[0]:.2f} / {load_after[0]:.2f} on {os.cpu_count()} CPUs "
          f"({cpu_name()}); restart at step {args.steps // 2}; goal: RSS growth within {GROWTH_GOAL_MB:g} MB, "
          "no error, no lost guess")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "class_soak.json").write_text(json.dumps(
        {"args": vars(args), "cpu": cpu_name(), "cpus": os.cpu_count(),
         "load_average_1min": [load_before[0], load_after[0]], "results": results}, indent=1))


if __name__ == "__main__":
    main()
