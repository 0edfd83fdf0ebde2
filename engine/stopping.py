"""Termination: the four conditions a real server checks after every token.

Stop sequences follow the OpenAI API and vLLM: they are matched on the decoded text, so a
match may span several tokens or end inside one; the returned text ends just before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.settings import StopSettings

FINISH_REASONS = ("eos", "stop_sequence", "max_tokens", "context_window")


@dataclass(frozen=True)
class StopSequenceState:
    """Where one stop sequence stands against the output text."""

    sequence: str
    matched: bool
    position: int | None  # index in the output text where the match starts
    partial: int  # characters of the sequence the text ends with, while not yet matched


@dataclass(frozen=True)
class Termination:
    """Every termination condition's state after one step, and which fired (if any)."""

    eos_ids: tuple[int, ...]
    eos_prob: float  # raw probability the model gave all end tokens at this step
    eos_picked: bool
    ignore_eos: bool
    stops: tuple[StopSequenceState, ...]
    new_tokens: int
    max_new_tokens: int
    context_tokens: int  # prompt + generated
    context_window: int
    finish_reason: str | None  # one of FINISH_REASONS, or None to go on


def partial_match_length(text: str, sequence: str) -> int:
    """Length of the longest proper prefix of `sequence` that `text` ends with."""
    for length in range(min(len(sequence) - 1, len(text)), 0, -1):
        if text.endswith(sequence[:length]):
            return length
    return 0


# what a decoded text ends with while a character's bytes are still coming: a byte-level token
# can carry part of one (SmolLM2 writes "パ" in two), and the part decodes as U+FFFD
INCOMPLETE = "\ufffd"


def stop_sequence_states(text: str, sequences: tuple[str, ...]) -> tuple[StopSequenceState, ...]:
    """Each stop sequence's first occurrence in the text, or how much of it the text ends with.
    A tail of U+FFFD is held back until the next token completes it, as vLLM's incremental
    detokenizer holds it back (and transformers' stop strings, matched on tokens' bytes, never
    see it): otherwise a stop sequence with U+FFFD in it would fire inside a character."""
    text = text.rstrip(INCOMPLETE)
    states = []
    for sequence in sequences:
        position = text.find(sequence)
        if position >= 0:
            states.append(StopSequenceState(sequence, True, position, 0))
        else:
            states.append(StopSequenceState(sequence, False, None, partial_match_length(text, sequence)))
    return tuple(states)


def first_match(states: tuple[StopSequenceState, ...]) -> StopSequenceState | None:
    """The match that starts earliest in the text; on a tie, the one listed first."""
    matched = [s for s in states if s.matched]
    return min(matched, key=lambda s: s.position) if matched else None


def finish_reason(*, eos_picked: bool, ignore_eos: bool, stops: tuple[StopSequenceState, ...],
                  new_tokens: int, max_new_tokens: int, context_tokens: int,
                  context_window: int) -> str | None:
    """Which condition ends generation now, checked in the order vLLM checks them."""
    if eos_picked and not ignore_eos:
        return "eos"
    if first_match(stops) is not None:
        return "stop_sequence"
    if new_tokens >= max_new_tokens:
        return "max_tokens"
    if context_tokens >= context_window:
        return "context_window"
    return None


def returned_text(text: str, stops: tuple[StopSequenceState, ...]) -> str:
    """The completion as an API returns it: cut just before the first stop sequence."""
    match = first_match(stops)
    return text if match is None else text[:match.position]


def termination_after(generated: Sequence[int], text: str, *, eos_ids: tuple[int, ...], eos_prob: float,
                      stop: StopSettings, prompt_tokens: int, context_window: int) -> Termination:
    """Every condition's state once `generated` (whose decoded text is `text`) is out."""
    stops = stop_sequence_states(text, stop.stop_sequences)
    state = dict(eos_picked=bool(generated) and generated[-1] in eos_ids, ignore_eos=stop.ignore_eos,
                 stops=stops, new_tokens=len(generated), max_new_tokens=stop.max_new_tokens,
                 context_tokens=prompt_tokens + len(generated), context_window=context_window)
    return Termination(eos_ids=eos_ids, eos_prob=eos_prob, finish_reason=finish_reason(**state), **state)


ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def unescape(text: str) -> str:
    """Read `\\n`, `\\t` and `\\\\` in a typed stop sequence as a newline, a tab and a backslash;
    every other character, a lone backslash included (`C:\\Users`), stays as typed."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in ESCAPES:
            out.append(ESCAPES[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def escape(text: str) -> str:
    """The inverse of `unescape`: a stop sequence as it is typed on one line."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")
