"""Room memory: what one class room's own work costs the server's memory, Step by Step, without
Streamlit or any student's session.

    .venv/bin/python -m bench.room_memory [--steps 400] [--part all|step|peek|guesses|publish]

A ClassHall on a fresh SQLite file in a temporary folder and the real bundled model; one room
(temperature 0.8, EOS ignored) with one student. Every Step does the room's part of a lesson:
`step` only the generation's step; `peek` the peek and one guess too; `guesses` the step and
the read of every step's guesses that each new snapshot makes; `publish` the step, the publish
(trace saved, snapshot made) and the student view built; `all` everything. The process's resident
memory (VmRSS) is printed every 50 steps: what a part adds over `step` is that part's own growth.
The bench for the whole server, with its sessions, is bench/class_soak.py.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from bench.load_bench import rss_mb
from classroom import ClassHall, ClassLimits, RoomStore
from engine import Generation, SamplerSettings, StopSettings, load_model
from ui.views.class_room import follow_html

PARTS = ("all", "step", "peek", "guesses", "publish")
EVERY = 50
STUDENT = "cookie:student"


def lesson(steps: int, part: str) -> list[tuple[int, float]]:
    """The room's memory every EVERY steps: (step, MB)."""
    lm = load_model()
    with tempfile.TemporaryDirectory() as folder:
        hall = ClassHall(RoomStore(Path(folder) / "rooms.sqlite3"), lm, ClassLimits())
        generation = Generation(lm, "Write a story about a lighthouse keeper.", seed=1,
                                sampler=SamplerSettings(temperature=0.8),
                                stop=StopSettings(max_new_tokens=steps + 1, ignore_eos=True))
        room, _ = hall.start(generation)
        hall.join(room, STUDENT, "Ada")
        trace = []
        for step in range(1, steps + 1):
            if part in ("all", "peek"):
                hall.peek(room)
                if room.snapshot.candidates:
                    hall.guess(room, STUDENT, token_id=room.snapshot.candidates[0].token_id)
            room.generation.step()
            if part == "guesses":
                hall.step_guesses(room.code, room.generation)
            if part in ("all", "publish"):
                hall.publish(room, room.generation)
                follow_html(room.snapshot)
            if step % EVERY == 0:
                trace.append((step, rss_mb(os.getpid())))
                print(f"{part} step {step}: RSS {trace[-1][1]:.0f} MB", flush=True)
        hall.store.close()
    return trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, choices=range(EVERY, 2001), default=400, metavar=f"{EVERY}-2000")
    parser.add_argument("--part", choices=PARTS, default="all")
    args = parser.parse_args()
    trace = lesson(args.steps, args.part)
    print(f"{args.part}: {trace[0][1]:.0f} MB at step {trace[0][0]} -> {trace[-1][1]:.0f} MB at step "
          f"{trace[-1][0]} ({trace[-1][1] - trace[0][1]:+.0f} MB)")


if __name__ == "__main__":
    main()
