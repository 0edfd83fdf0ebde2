"""Speculative decoding: several tokens per forward pass of the model, the same output.

Three parts, each in its own file: drafting (`drafting.py`: who guesses the next k tokens),
the accept / reject rule on frozen logits (`rule.py`), and the generation that runs a round
around them (`generation.py`); `trace.py` saves and replays it.
"""

from engine.speculative.drafting import (
    DRAFT_METHODS,
    Draft,
    DraftMethod,
    DraftModel,
    PromptLookup,
    draft_for,
    self_draft,
)
from engine.speculative.generation import KVChange, PositionView, Rejection, RoundRecord, SpeculativeGeneration
from engine.speculative.rule import K_MAX, K_MIN, Check, Verdict, check_k, expected_tokens_per_round, judge
from engine.speculative.trace import (
    SpeculativeReplay,
    replay_speculative,
    save_speculative_trace,
    speculative_to_trace,
)

__all__ = [
    "DRAFT_METHODS", "K_MAX", "K_MIN", "Check", "Draft", "DraftMethod", "DraftModel", "KVChange", "PositionView",
    "PromptLookup", "Rejection", "RoundRecord", "SpeculativeGeneration", "SpeculativeReplay", "Verdict", "check_k",
    "draft_for", "expected_tokens_per_round", "judge", "replay_speculative", "save_speculative_trace", "self_draft",
    "speculative_to_trace",
]
