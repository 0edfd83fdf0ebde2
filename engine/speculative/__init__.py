"""Speculative decoding: several tokens per forward pass of the model, the same output.

Three parts, each in its own file: drafting (`drafting.py`: who guesses the next k tokens),
the accept / reject rule on frozen logits (`rule.py`), and the generation that runs a round
around them (`generation.py`); `trace.py` saves and replays it, and `race.py` races every
method against plain decoding on one prompt.
"""

from engine.forward import verify_pass_decision  # which pass a round's verify pass takes here, and why
from engine.speculative.drafting import (
    Draft,
    DraftMethod,
    DraftModel,
    DraftPicture,
    Leader,
    PromptLookup,
    RoundOutcome,
    self_draft,
)
from engine.speculative.early_exit import EarlyExit, ExitChoice, best_exit, layer_agreement
from engine.speculative.generation import KVChange, PositionView, Rejection, RoundRecord, SpeculativeGeneration
from engine.speculative.heads import GO_ON, MedusaHeads, MtpDraft, TrainedDraft, load_trained
from engine.speculative.lookahead import Lookahead, LookaheadGuess
from engine.speculative.methods import DRAFT_METHODS, chosen_exit, draft_for
from engine.speculative.race import (
    Entrant,
    RaceJob,
    RaceResult,
    RaceRow,
    Skipped,
    last_race_times,
    run_race,
    start_race,
)
from engine.speculative.rule import K_MAX, K_MIN, Check, Verdict, check_k, expected_tokens_per_round, judge
from engine.speculative.trace import (
    SpeculativeReplay,
    replay_speculative,
    save_speculative_trace,
    speculative_to_trace,
)

__all__ = [
    "DRAFT_METHODS",
    "GO_ON",
    "K_MAX",
    "K_MIN",
    "Check",
    "Draft",
    "DraftMethod",
    "DraftModel",
    "DraftPicture",
    "EarlyExit",
    "Entrant",
    "ExitChoice",
    "KVChange",
    "Leader",
    "Lookahead",
    "LookaheadGuess",
    "MedusaHeads",
    "MtpDraft",
    "PositionView",
    "PromptLookup",
    "RaceJob",
    "RaceResult",
    "RaceRow",
    "Rejection",
    "RoundOutcome",
    "RoundRecord",
    "Skipped",
    "SpeculativeGeneration",
    "SpeculativeReplay",
    "TrainedDraft",
    "Verdict",
    "best_exit",
    "check_k",
    "chosen_exit",
    "draft_for",
    "expected_tokens_per_round",
    "judge",
    "last_race_times",
    "layer_agreement",
    "load_trained",
    "replay_speculative",
    "run_race",
    "save_speculative_trace",
    "self_draft",
    "speculative_to_trace",
    "start_race",
    "verify_pass_decision",
]
