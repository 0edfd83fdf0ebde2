"""The Lesson's content that is not drawing: its presets, its stages, and the scoring of
the predict-then-reveal exercise. No Streamlit here.

Every preset samples greedily (the lesson starts it with temperature 0 whatever its file says),
so the real model gives the same tokens on every run and each preset reliably makes its
termination condition fire.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine import Candidate, Generation, LoadedModel, SamplerSettings, StepRecord
from engine.serving import ForwardScheduler
from ui.session.presets import LESSON_PRESETS_FILE, Preset, load_presets
from ui.views.format import visible

GREEDY = SamplerSettings(temperature=0.0)
CANDIDATES = 6  # choices offered in the prediction exercise


# assets/lesson_presets.json: each preset names the finish reason it makes fire ("fires") and,
# as "about", what the student should look out for
PRESETS: tuple[Preset, ...] = load_presets(LESSON_PRESETS_FILE)

STAGES: tuple[str, ...] = (
    "Prompt → tokens",
    "Forward pass → logits",
    "Inside the pass → each layer's guess",
    "Softmax → probabilities",
    "Sampling → one token",
    "Append → context and KV cache",
    "Check → stop or go round again",
)

PREDICT_PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "Once upon a time, there was a",
    "The best way to learn to program is to",
    "Water boils at a temperature of",
)


def start(lm: LoadedModel, preset: Preset, scheduler: ForwardScheduler | None = None) -> Generation:
    """A fresh greedy generation for the preset (no forward pass yet); its passes go through
    the server's `scheduler` when given."""
    return Generation(lm, preset.prompt, chat=preset.chat, sampler=GREEDY, stop=preset.stop, scheduler=scheduler)


def candidates(step: StepRecord, count: int = CANDIDATES) -> list[Candidate]:
    """The `count` most probable tokens, in alphabetical order so their order gives nothing away."""
    return sorted(step.distribution.top[:count], key=lambda c: (visible(c.text).strip().lower(), c.token_id))


@dataclass(frozen=True)
class Guess:
    """One round of the exercise: the student's choice against the model's pick."""

    step_index: int
    guess_id: int
    guess_text: str
    guess_prob: float  # raw probability the model gave the student's choice
    model_id: int
    model_text: str
    model_prob: float  # raw probability of the model's (greedy) pick

    @property
    def matched(self) -> bool:
        return self.guess_id == self.model_id

    @property
    def gave_up(self) -> float:
        """Probability the student's choice had less than the model's pick."""
        return self.model_prob - self.guess_prob


def score(step: StepRecord, guess_id: int) -> Guess:
    """Score a guess made among `candidates(step)` against the step's pick."""
    by_id = {c.token_id: c for c in step.distribution.top}
    if guess_id not in by_id:
        raise ValueError(f"guess_id {guess_id} is not among this step's candidates.")
    guess = by_id[guess_id]
    return Guess(step.index, guess_id, guess.text, guess.prob, step.token_id, step.token.text, step.prob)


@dataclass(frozen=True)
class Tally:
    """The exercise's score so far."""

    rounds: int
    matches: int
    gave_up_total: float

    @property
    def match_rate(self) -> float:
        return self.matches / self.rounds if self.rounds else 0.0

    @property
    def gave_up_mean(self) -> float:
        return self.gave_up_total / self.rounds if self.rounds else 0.0


def tally(guesses: Sequence[Guess]) -> Tally:
    """How often the student matched the model, and the probability they gave up in all."""
    return Tally(len(guesses), sum(g.matched for g in guesses), sum(g.gave_up for g in guesses))
