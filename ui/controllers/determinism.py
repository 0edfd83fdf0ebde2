"""Same prompt, different answers: what the page's controls do, as plain functions over the
visitor's state (st.session_state on the page, a dict in tests; keys: ui/session/keys.py's
DETERMINISM).

The experiment itself is the engine's (engine/serving/determinism.py): the visitor's prompt
decoded alone, then beside random company in packed passes, with this server's exact products and
with the ordinary batched ones. Here it becomes a measurement on the server's board
(ui/server/measurement_board.py): one experiment or speed measurement at a time on the server, the
same settings measured once for everyone (a class pressing Run together waits for one run), and
every pass queued through the server's scheduler with the visitors' own (`run_pass`), so a class
stepping meanwhile waits one pass more at most and keeps its digits. Caps keep each visitor's
experiment to seconds. No Streamlit here.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from engine import LoadedModel, PromptError, SamplerSettings, SettingsError, build_prompt
from engine.serving import DeterminismResult, PassRunner, Progress, at_once, repeated_experiment
from ui.server.measurement_board import MeasurementBoard
from ui.session.keys import DETERMINISM as DET

State = MutableMapping[str, Any]

# Each cap keeps one experiment to seconds on two CPU cores: 16 runs x 2 modes x 48 tokens of
# 8-row packed passes is about a minute there, the most one visitor can ask of the shared queue.
RUNS = (1, 16)
TOKENS = (4, 48)
BATCH = (2, 8)
TEMPERATURE = (0.0, 1.5)  # 0: greedy
SEED = (0, 2**31 - 1)
PROMPT_TOKENS = 256  # the longest prompt an experiment reads


@dataclass(frozen=True)
class Experiment:
    """What the visitor asked for: a prompt, how many runs of how many tokens, the largest batch
    its company makes, greedy (temperature 0) or sampled, and the seed of the company and draws."""

    prompt: str
    runs: int = 8
    tokens: int = 24
    batch: int = 8
    temperature: float = 0.0
    seed: int = 0

    @property
    def sampler(self) -> SamplerSettings | None:
        return SamplerSettings(temperature=self.temperature) if self.temperature > 0 else None


DEFAULT = Experiment("The three most important inventions of the twentieth century were")


@dataclass(frozen=True)
class Published:
    """The published experiment this lab is set beside."""

    source: str
    url: str
    model: str
    runs: int
    distinct: int  # completions at temperature 0 with the ordinary kernels
    first_divergence: int  # the token where they first differed
    invariant_distinct: int  # completions with batch-invariant kernels


PUBLISHED = Published(
    source="Horace He and Thinking Machines Lab, “Defeating Nondeterminism in LLM Inference” (September 2025)",
    url="https://thinkingmachines.ai/blog/defeating-nondeterminism-in-llm-inference/",
    model="Qwen3-235B-A22B-Instruct-2507 on vLLM", runs=1000, distinct=80, first_divergence=103,
    invariant_distinct=1)


def init_defaults(state: State) -> None:
    """The form's fields start at the default experiment (a visitor's own values are kept)."""
    for key, value in ((DET.prompt, DEFAULT.prompt), (DET.runs, DEFAULT.runs), (DET.tokens, DEFAULT.tokens),
                       (DET.batch, DEFAULT.batch), (DET.temperature, DEFAULT.temperature), (DET.seed, DEFAULT.seed)):
        state.setdefault(key, value)


def experiment_from(state: State) -> Experiment:
    """The experiment the form's fields describe."""
    return Experiment(str(state.get(DET.prompt, DEFAULT.prompt)), int(state.get(DET.runs, DEFAULT.runs)),
                      int(state.get(DET.tokens, DEFAULT.tokens)), int(state.get(DET.batch, DEFAULT.batch)),
                      float(state.get(DET.temperature, DEFAULT.temperature)), int(state.get(DET.seed, DEFAULT.seed)))


def problem(lm: LoadedModel, experiment: Experiment) -> str | None:
    """What is wrong with the experiment, in words that say what is allowed; None when it can run."""
    for name, value, (low, high) in (("Runs", experiment.runs, RUNS), ("Tokens", experiment.tokens, TOKENS),
                                     ("Largest batch", experiment.batch, BATCH),
                                     ("Temperature", experiment.temperature, TEMPERATURE),
                                     ("Seed", experiment.seed, SEED)):
        if not low <= value <= high:
            return f"{name} is {value:g}: it must be from {low:g} to {high:g}."
    if not experiment.prompt.strip():
        return "The prompt is empty: type the text the model should go on from."
    try:
        length = len(build_prompt(lm, experiment.prompt, chat=False).ids)
    except PromptError as exc:
        return str(exc)
    if length < 2:
        return "The prompt is one token: type at least two tokens (a word or two) for the model to go on from."
    if length > PROMPT_TOKENS:
        return (f"The prompt is {length:,} tokens: this lab reads at most {PROMPT_TOKENS} "
                "(shorten it; your text is kept).")
    return None


def run(state: State, lm: LoadedModel, board: MeasurementBoard, *, run_pass: PassRunner = at_once,
        progress: Progress | None = None, waiting: Callable[[str], AbstractContextManager] | None = None,
        served: Callable[[], int] = lambda: 0) -> bool:
    """Run the form's experiment (or take its result from the board, when anyone on this server
    ran the same one) and keep it for the visitor. On a problem, say it and keep the last result
    and every field as the visitor left it. Returns whether a result was kept."""
    experiment = experiment_from(state)
    if (why := problem(lm, experiment)) is not None:
        state[DET.error] = why
        return False
    key = ("determinism", lm.name, str(lm.device), experiment)

    def measure() -> DeterminismResult:
        return repeated_experiment(lm, experiment.prompt, experiment.runs, experiment.tokens, experiment.batch,
                                   experiment.seed, sampler=experiment.sampler, run=run_pass, progress=progress)

    try:
        if waiting is None or board.kept(key) is not None:
            result = board.get(key, measure, served).value
        else:
            doing = "Waiting for another visitor's measurement, then running" if board.busy else "Running"
            with waiting(f"{doing} {experiment.runs} runs in each mode, {experiment.tokens} tokens each…"):
                result = board.get(key, measure, served).value
    except (SettingsError, PromptError) as exc:
        state[DET.error] = str(exc)
        return False
    state[DET.result] = (experiment, result)
    state[DET.shown_run] = 0
    state.pop(DET.error, None)
    return True


def latest(state: State) -> tuple[Experiment, DeterminismResult] | None:
    """The visitor's latest experiment and its result, or None before the first Run."""
    return state.get(DET.result)


def shown_run(state: State, result: DeterminismResult) -> int:
    """Which run in company the step-by-step section shows (the first, unless the visitor chose)."""
    index = int(state.get(DET.shown_run, 0) or 0)
    return index if 0 <= index < result.runs else 0
