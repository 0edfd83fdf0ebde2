"""Class benchmark: one presenter steps a room while N students follow it and guess.

    .venv/bin/python -m bench.class_bench [--students 10,30,60] [--steps 8] [--idle 10] [--busy] [--timer-only]
                                          [--two-servers]

For each student count N the benchmark starts a fresh `streamlit run app.py` (its own rooms
database in a temporary folder, its follow endpoint on a free port), and drives it with the
headless protocol client of bench/load_bench.py (bench/streamlit_client.py). Each follower is its
browser: it plays the follow fragment's timer, and it does what the follow element's script does
(ui/widgets/follow.py): long-polls the follow endpoint with the version its fragment last drew, and
when the room passes it, shows the view the answer carries and sends the element's trigger, which
reruns the fragment (--timer-only: the timer alone, as a page that cannot reach the endpoint).
The presenter opens /class and presses Start a class; N students open the student link. Then:

  idle: the students follow for --idle seconds while no one steps; the server's CPU time over
      that window (from /proc), less that of the presenter's page alone over as long before the
      students came, over N, is the CPU one idle follower costs (in % of one core);
  steps: the presenter presses Step --steps times, 3 s apart; after each reveal every student
      types a guess 0.3-2 s later. Presenter Step: from sending the click to its run's script_finished.
      Follow delay: from sending the click (the room publishes the step during that run) to the first
      answer of the endpoint or the end of the first run a follower receives (whichever comes
      first) that shows the new token count, pooled over students and steps. Rerun delay: to the
      first fragment run that draws it (the student's own guess field and score, the reveal).
      --busy: one spinning process per CPU runs through the steps (a shared machine);
  RSS/student: the server's resident memory with the students in, less before they came, over N.

--two-servers: the rooms live in a PostgreSQL server the bench starts (Debian's initdb, as the tests
do), the presenter's page is on one `streamlit run` and the students' on another, so every step
reaches the students' server by the database's notification (classroom/store_pg.py).

Every loop is bounded in count and time. Results go to bench/results/class_bench.json; the load
average is printed with them (figures taken while other work runs on the machine are inflated).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from websockets.exceptions import WebSocketException

from bench.appserver import free_port, served_app_process
from bench.load_bench import parse_visitors, percentile, rss_mb
from bench.postgres import fresh_database, postgres_server
from bench.streamlit_client import Visitor, rerun_message

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PAGE = "class"
START, STEP = "cls_start", "cls_p_st_step"
GUESS_FIELD = "cls_guess_text_"
STEPS_SHOWN = re.compile(r'class="tbt-class-status" data-steps="(\d+)"')
OPEN_TIMEOUT_S = 180.0
LOCAL_LINK = "This page was opened as 127"  # ui/controllers/class_room.py link_warning, markdown-escaped
FOLLOW_TIMEOUT_S = 15.0  # a student not showing a step this long after it counts as a failure
STEP_GAP_S = 3.0
GUESS_AFTER_S = (0.3, 2.0)  # a student reads the reveal, then guesses the next token, before the next Step
GUESSES = ("the", "a", "Paris", "it", ",", "and")
SIGNAL, MOVED = "tbt_follow_view", "moved"  # the follow element and its trigger's event (ui/widgets/follow.py)
POLL_TIMEOUT_S = 35.0  # longer than the endpoint holds a request (classroom/follow.py)
LANDING_S = 5.0  # after a trigger, the script waits this long at most for the fragment to draw it


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def steps_in(visitor: Visitor, result) -> int | None:
    """The tokens a student's page shows after `result`: in the run's texts, or in the view the
    follow element was drawn with (ui/widgets/follow.py)."""
    element = visitor.components.get(SIGNAL)
    view = element.data.get("view", "") if element is not None and isinstance(element.data, dict) else ""
    return shown_steps((*result.texts, view))


@contextlib.contextmanager
def rooms_for(store: str) -> Iterator[tuple[str, dict[str, str]]]:
    """The rooms' database for `store` ("sqlite": a file in a temporary folder; "postgres": a fresh
    database on a PostgreSQL server started for it): (where it is, the app server's environment)."""
    if store == "postgres":
        with postgres_server() as admin:
            url = fresh_database(admin)
            yield url, {"TBT_ROOMS_URL": url}
        return
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "class.sqlite3")
        yield path, {"TBT_CLASS_DB": path}


def presenter_errors(presenter: Visitor) -> list[str]:
    """The presenter's errors, less the warning every run gives a page opened as 127.0.0.1 (the
    bench's address): students' phones could not open such a link, this bench's students can."""
    return [e for e in presenter.errors if not e.startswith(LOCAL_LINK)]


def shown_steps(texts: tuple[str, ...]) -> int | None:
    for text in texts:
        if found := STEPS_SHOWN.search(text):
            return int(found.group(1))
    return None


async def server_cpu_share(pid: int, seconds: float) -> float:
    """The server's CPU time over the next `seconds`, as a share of one core."""
    cpu, wall = cpu_seconds(pid), time.perf_counter()
    await asyncio.sleep(seconds)
    return (cpu_seconds(pid) - cpu) / (time.perf_counter() - wall)


async def http_get(host: str, port: int, path: str, timeout: float) -> tuple[int, bytes]:
    """One GET as a browser's fetch sends it: the status and the body."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    if len(fields := head.split()) < 2:  # the server went away mid-request: a browser's fetch rejects
        raise ConnectionError("the follow endpoint closed the connection without an answer")
    return int(fields[1]), body


class Student:
    """One follower, as its browser: plays the fragment's timer, long-polls the follow endpoint
    as the follow element's script does, reads every run the server sends, notes when each step
    first shows, and guesses once per step."""

    def __init__(self, visitor: Visitor, push: bool = True) -> None:
        self.visitor, self.push = visitor, push
        self.asked = -1  # the latest version this page's trigger asked for
        self.triggers = 0
        self.landed = asyncio.Event()  # the fragment drew what the trigger asked for
        self.seen_at: dict[int, float] = {}  # steps -> when the page first showed them
        self.ran_at: dict[int, float] = {}  # steps -> when a fragment run first drew them (guess field, reveal)
        self.errors = 0
        self.guessed: set[int] = set()
        self.to_send: asyncio.Queue = asyncio.Queue()
        [(self.fragment, self.interval)] = visitor.auto_reruns.items()

    def saw(self, steps: int | None) -> None:
        """The page shows `steps` tokens now: note when it first did."""
        if steps is not None and steps not in self.seen_at:
            self.seen_at[steps] = time.perf_counter()

    def on_run(self, result) -> None:
        self.errors += len(result.errors)
        if self.drawn() >= self.asked:
            self.landed.set()
        steps = steps_in(self.visitor, result)
        self.saw(steps)
        if steps is not None:
            self.ran_at.setdefault(steps, time.perf_counter())
        # this run's field: the page uses a few keys in turn
        fields = [key for key in result.drawn if key.startswith(GUESS_FIELD)]
        if steps and steps not in self.guessed and fields:
            self.guessed.add(steps)
            message = self.visitor.text_message(fields[-1], random.choice(GUESSES))
            asyncio.get_running_loop().call_later(random.uniform(*GUESS_AFTER_S), self.to_send.put_nowait, message)

    def drawn(self) -> int:
        """The room version the follow fragment last drew (the element's data)."""
        return self.visitor.components[SIGNAL].data["version"]

    async def poll(self, host: str) -> None:
        """The follow element's script: ask for the version after the one drawn (or asked for);
        when the room passed it, send the trigger and wait for the fragment to draw it; back off
        2, 4 ... 60 s on failures."""
        failures = 0
        while True:
            data = self.visitor.components[SIGNAL].data
            try:
                status, body = await http_get(host, data["port"], f"{data['path']}&after="
                                              f"{max(self.drawn(), self.asked)}", POLL_TIMEOUT_S)
                if status != 200:
                    raise OSError(f"the follow endpoint answered {status}")
                answer = json.loads(body)
                version = answer["version"]
            except (OSError, ValueError, KeyError, TimeoutError):
                failures += 1
                self.errors += 1
                await asyncio.sleep(min(60.0, 2.0 ** failures))
                continue
            failures = 0
            if version > max(self.drawn(), self.asked):
                self.saw(shown_steps((answer.get("view", ""),)))  # the element shows it as the answer lands
                self.asked = version
                self.triggers += 1
                self.landed.clear()
                self.to_send.put_nowait(self.visitor.trigger_message(SIGNAL, MOVED, version))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.landed.wait(), LANDING_S)

    async def follow(self, until: asyncio.Event) -> None:
        listening = asyncio.create_task(self.visitor.listen(self.on_run, until))
        host = self.visitor.url.split("//", 1)[1].split(":", 1)[0]
        polling = asyncio.create_task(self.poll(host)) if self.push else None
        next_tick = time.perf_counter() + random.uniform(0, self.interval)  # browsers' timers are not in step
        while not until.is_set():
            try:
                msg = await asyncio.wait_for(self.to_send.get(), max(0.0, next_tick - time.perf_counter()))
            except TimeoutError:
                msg, next_tick = self.visitor.auto_rerun_message(self.fragment), next_tick + self.interval
            try:
                await self.visitor.send(msg)
            except WebSocketException:
                self.errors += 1
                break
        if polling is not None:
            polling.cancel()
        await listening


class BusyCores:
    """While open (and `on`), one process spinning on each CPU: another program's work on the machine."""

    def __init__(self, on: bool) -> None:
        self.on, self.spinners = on, []

    def __enter__(self) -> BusyCores:
        if self.on:
            self.spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                             for _ in range(os.cpu_count() or 1)]
        return self

    def __exit__(self, *_) -> None:
        for spinner in self.spinners:
            spinner.kill()
            spinner.wait()


async def class_round(url: str, pid: int, count: int, steps: int, idle_s: float, busy: bool = False,
                      push: bool = True, presenter_url: str | None = None) -> dict:
    """One class: the presenter on `presenter_url` (default `url`), the students on `url`, whose
    server `pid` is the one measured."""
    presenter = await Visitor.open(presenter_url or url, "", timeout=OPEN_TIMEOUT_S, button_keys=(START,),
                                   page_name=PAGE)
    await presenter.click(START)
    await presenter.rerun(rerun_message(presenter.query_string, presenter.page_script_hash, url=presenter.url,
                                        page_name=PAGE), (STEP,))
    code = presenter.query_string.removeprefix("room=")
    rss_before = rss_mb(pid)
    baseline = await server_cpu_share(pid, idle_s)  # the presenter's page alone
    visitors = await asyncio.gather(*(Visitor.open(url, f"room={code}", timeout=OPEN_TIMEOUT_S, page_name=PAGE)
                                      for _ in range(count)))
    students = [Student(visitor, push) for visitor in visitors]
    done = asyncio.Event()
    followers = [asyncio.create_task(student.follow(done)) for student in students]
    await asyncio.sleep(2.0)  # every follower's timer running
    wall_start, client_start = time.perf_counter(), time.process_time()
    idle_cpu = await server_cpu_share(pid, idle_s)
    idle_client = (time.process_time() - client_start) / (time.perf_counter() - wall_start)
    rss_after = rss_mb(pid)
    step_seconds, delays, reruns, missed = [], [], [], 0
    steps_cpu = cpu_seconds(pid)
    with BusyCores(busy):
        for k in range(1, steps + 1):
            started = time.perf_counter()
            result = await presenter.click(STEP)
            step_seconds.append(result.seconds)
            deadline = started + FOLLOW_TIMEOUT_S
            while time.perf_counter() < deadline and not all(k in s.ran_at for s in students):
                await asyncio.sleep(0.02)
            delays += [s.seen_at[k] - started for s in students if k in s.seen_at]
            reruns += [s.ran_at[k] - started for s in students if k in s.ran_at]
            missed += sum(k not in s.seen_at or k not in s.ran_at for s in students)
            await asyncio.sleep(max(0.0, STEP_GAP_S - (time.perf_counter() - started)))
    steps_cpu = cpu_seconds(pid) - steps_cpu
    done.set()
    await asyncio.gather(*followers)
    for visitor in [presenter, *visitors]:
        await visitor.close()
    return {
        "students": count, "steps": steps,
        "presenter_step_p50_s": percentile(step_seconds, 50), "presenter_step_p95_s": percentile(step_seconds, 95),
        "follow_p50_s": percentile(delays, 50), "follow_p95_s": percentile(delays, 95), "follow_max_s": max(delays),
        "rerun_p50_s": percentile(reruns, 50), "rerun_p95_s": percentile(reruns, 95),
        "missed": missed, "errors": sum(s.errors for s in students) + len(presenter_errors(presenter)),
        "error_samples": sorted({e[:200] for e in [*presenter_errors(presenter), *(e for v in visitors
                                                                                   for e in v.errors)]})[:5],
        "idle_server_cpu_share": idle_cpu, "presenter_alone_cpu_share": baseline,
        "idle_cpu_per_follower_share": (idle_cpu - baseline) / count,
        "idle_client_cpu_share": idle_client,
        "rss_per_student_mb": (rss_after - rss_before) / count,
        "follow_interval_s": students[0].interval,
        "busy": busy, "push": push, "two_servers": presenter_url not in (None, url),
        "triggers": sum(s.triggers for s in students),
        "server_cpu_per_step_s": steps_cpu / steps,  # the step, its reveal and peek, the follows, the guesses
    }


def row(r: dict) -> str:
    return (f"{r['students']:>8} {r['presenter_step_p50_s']:>8.2f} {r['presenter_step_p95_s']:>8.2f} "
            f"{r['follow_p50_s']:>8.2f} {r['follow_p95_s']:>8.2f} {r['follow_max_s']:>8.2f} "
            f"{100 * r['idle_cpu_per_follower_share']:>9.2f}% {100 * r['idle_server_cpu_share']:>8.0f}% "
            f"{r['rss_per_student_mb']:>8.2f} {r['missed']:>6} {r['errors']:>6} "
            f"{100 * r['idle_client_cpu_share']:>7.0f}% {r['rerun_p50_s']:>8.2f} {r['rerun_p95_s']:>8.2f}")


def parse_students(text: str) -> tuple[int, ...]:
    """Counts from 1 to 100, as load_bench reads its visitors."""
    try:
        return parse_visitors(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("--visitors", "--students")) from exc


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=parse_students, default=(10, 30, 60))
    parser.add_argument("--steps", type=int, choices=range(1, 65), default=8, metavar="1-64")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle following measured (1-120)")
    parser.add_argument("--busy", action="store_true", help="a spinning process per CPU through the steps")
    parser.add_argument("--timer-only", action="store_true",
                        help="students follow with the fragment's timer alone (the endpoint out of reach)")
    parser.add_argument("--two-servers", action="store_true",
                        help="rooms in a PostgreSQL server the bench starts; the presenter on one app process, "
                             "the students on another")
    args = parser.parse_args(argv)
    if not 1 <= args.idle <= 120:
        parser.error("--idle: seconds from 1 to 120")
    load_before = os.getloadavg()
    results = []
    for count in args.students:
        with contextlib.ExitStack() as stack:
            _, rooms = stack.enter_context(rooms_for("postgres" if args.two_servers else "sqlite"))
            url, pid = stack.enter_context(served_app_process(
                RESULTS / "class_bench_server.log", env=rooms | {"TBT_FOLLOW_PORT": str(free_port())}))
            presenter_url = url
            if args.two_servers:
                presenter_url, _ = stack.enter_context(served_app_process(
                    RESULTS / "class_bench_presenter.log", env=rooms | {"TBT_FOLLOW_PORT": str(free_port())}))
            results.append(asyncio.run(class_round(url, pid, count, args.steps, args.idle, args.busy,
                                                   not args.timer_only, presenter_url)))
    load_after = os.getloadavg()
    print(f"{'students':>8} {'step p50':>8} {'step p95':>8} {'follow50':>8} {'follow95':>8} {'followmx':>8} "
          f"{'idle/flw':>10} {'idle srv':>9} {'RSS MB/s':>8} {'missed':>6} {'errors':>6} {'client':>8} "
          f"{'rerun50':>8} {'rerun95':>8}")
    for result in results:
        print(row(result))
    print(f"load average before/after: {load_before[0]:.2f} / {load_after[0]:.2f} on {os.cpu_count()} CPUs "
          f"(timer {results[0]['follow_interval_s']:g} s; {'timer only' if args.timer_only else 'endpoint + timer'}"
          f"{'; both cores busy through the steps' if args.busy else ''}"
          f"{'; presenter and students on two servers, rooms in PostgreSQL' if args.two_servers else ''}"
          f"; triggers {results[-1]['triggers']})")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "class_bench.json").write_text(json.dumps({"results": results, "load_average_1min":
                                                          [load_before[0], load_after[0]]}, indent=1))


if __name__ == "__main__":
    main()
