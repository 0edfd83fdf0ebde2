"""A long prompt's first Step, in words: what it will cost before it starts (an estimate from
this server's measured prefill speed) and how far it has got while it runs."""

from __future__ import annotations

from engine import PromptReading
from engine.speed import PrefillCost


def duration(seconds: float) -> str:
    """'45 s', '2 min 10 s'."""
    whole = max(1, round(seconds))
    minutes, rest = divmod(whole, 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def long_prompt_warning(tokens: int, cost: PrefillCost) -> str:
    """Said before the first Step of a long prompt: what the pass reads, about how long it takes
    here, and what that figure rests on."""
    (short, long), (short_ms, long_ms) = cost.lengths, cost.measured_ms
    return (f"This prompt is {tokens:,} tokens. The first Step reads all of them in one forward pass: about "
            f"{duration(cost.estimate_s(tokens))} on this server (measured here: {short:,} tokens in "
            f"{short_ms / 1e3:.2f} s, {long:,} in {long_ms / 1e3:.2f} s; each token also attends to every one "
            "before it, so the time grows faster than the length; longer while other visitors step). "
            "The pass has started; Step shows how far it has got.")


def reading_progress(reading: PromptReading, cost: PrefillCost) -> tuple[float, str]:
    """The progress bar's fill (0 to 0.99 until the pass is done: the time is an estimate) and its label."""
    expected = cost.estimate_s(reading.tokens)
    if reading.done:
        return 1.0, f"Read {reading.tokens:,} prompt tokens in {duration(reading.elapsed_s)}."
    share = min(reading.elapsed_s / expected, 0.99) if expected > 0 else 0.0
    over = " (longer than estimated)" if reading.elapsed_s > expected else ""
    return share, (f"Reading the {reading.tokens:,}-token prompt in one forward pass: {duration(reading.elapsed_s)} "
                   f"of about {duration(expected)}{over}.")
