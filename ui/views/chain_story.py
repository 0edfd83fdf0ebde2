"""The Breaking the chain page's words about its lanes: the latest round told step by step, what
a verify pass costs, and the race's table. Pure: strings (markdown, or HTML where the name says
so) made from the engine's records and the figures ui/domain/breaking_the_chain.py computed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine import SpeculativeGeneration
from engine.speculative import RaceRow, RoundRecord
from engine.speed import PrefillDecode
from ui.domain.breaking_the_chain import CostFigures
from ui.views.breaking_the_chain import (
    SAME_WITHIN,
    counted,
    kv_html,
    method_note,
    no_guess_reason,
    positions_html,
    rejection_html,
    rounds_table_html,
    speed_verdict,
    verify_cost_text,
    verify_path_text,
)
from ui.views.draft_pictures import draft_picture_html
from ui.views.format import pct, plain, quoted

COPYING_METHODS = ("prompt-lookup", "lookahead")  # their guesses are copied from the context


@dataclass(frozen=True)
class RoundStory:
    """The latest round, top to bottom: markdown, a caption, and HTML where the name says so."""

    heading: str
    draft: str
    draft_note: str | None  # how the method guessed (a caption)
    picture_html: str | None  # the draft's own picture of this round's guesses
    verify: str
    positions_html: str
    rejection_html: str | None
    stop_cut: str | None  # a stop condition fired inside the round
    kv: str
    kv_html: str
    rounds_html: str  # every round, a table


def round_story(spec: SpeculativeGeneration) -> RoundStory | None:
    """The latest round of `spec` in words (None before the first)."""
    if not spec.rounds:
        return None
    record, texts = spec.rounds[-1], spec.lm.texts
    added = counted(len(record.emitted), "token")
    note, picture = None, None
    if record.drafted:
        guessed = plain(" ".join(quoted(p.text) for p in record.drafted))  # copied from the visitor's prompt
        # a greedy trained draft is deterministic too, but it scores its guesses: only these copy
        copied = "copied from the context: " if record.method in COPYING_METHODS else ""
        source = (f"{copied}a deterministic guess, so q = 1 for each guessed token"
                  if record.deterministic_draft else "the draft model's own distribution q at each position")
        heading = (f"### Round {record.index}: {counted(len(record.drafted), 'guess', 'guesses')}, "
                   f"{record.accepted} kept, {added} added, one forward pass")
        draft = f"**1 · Draft** ({record.method}, {record.timing.draft_ms:.1f} ms): {guessed} — {source}."
        note = method_note(record, spec.draft, texts)
        shown = getattr(spec.draft, "last_picture", None)
        if shown is not None and shown.guesses == tuple(p.token_id for p in record.drafted):
            picture = draft_picture_html(shown, record, texts)
    else:
        heading = f"### Round {record.index}: no guess, a plain decode step ({added}, one forward pass)"
        draft = (f"**1 · Draft** ({record.method}): no guess this round: {no_guess_reason(record, spec.draft)}. "
                 "So the round is a plain decode step.")
    rejected = rejection_html(record, texts)
    return RoundStory(heading, draft, note, picture, _verify_words(record), positions_html(record),
                      f"<div>{rejected}</div>" if rejected else None, _stop_cut_words(record.cut_by_stop),
                      _kv_words(record), kv_html(record), rounds_table_html(spec.rounds))


def _verify_words(record: RoundRecord) -> str:
    returned = (f"{counted(len(record.positions), 'distribution')}, one per guessed position plus one after the "
                "last" if record.drafted else "1 distribution, the one after the context, as a plain decode step does")
    greedy_note = (" Greedy turns the target's p into a one-hot on its argmax, so the cards show the **raw p**, the "
                   "model's softmax before the sampler, from this same verify pass; ★ marks the argmax."
                   if record.sampler.greedy else "")
    return (f"**2 · Verify**: one forward pass read {counted(record.fed_tokens, 'token')} in "
            f"{record.timing.verify_ms:.1f} ms and returned {returned}.{greedy_note} "
            f"**3 · {'Accept / reject**, left to right' if record.drafted else 'Pick**'}:")


def _stop_cut_words(cut: int) -> str | None:
    if not cut:
        return None
    return (f"A stop condition fired inside this round: {counted(cut, 'decided token')} "
            f"{'was' if cut == 1 else 'were'} dropped, exactly where plain decoding stops.")


def _kv_words(record: RoundRecord) -> str:
    cropped = record.kv.cropped
    cropped_words = ("none was cropped" if cropped == 0 else
                     f"{cropped} {'was' if cropped == 1 else 'were'} cropped (rejected guesses, or tokens past a stop)")
    return (f"**4 · KV cache**: the verify pass wrote {counted(record.kv.written, 'position')}; {cropped_words}; "
            f"the newest token is read next round. Bookkeeping took {record.timing.bookkeeping_ms:.1f} ms.")


# ---- what checking k guesses costs -------------------------------------------------------------

BANDWIDTH = ("A decode step at batch 1 is bound by memory bandwidth: it reads every weight of the model to make one "
             "token. The verify pass reads each weight once too, and uses it for all k + 1 positions at once, a "
             "thin matrix product instead of a matrix–vector one. Where reading the weights is nearly all the "
             "cost (a GPU at batch 1), the pass costs little more than one step and buys up to k + 1 tokens; on a "
             "CPU the extra positions' arithmetic takes time too.")


@dataclass(frozen=True)
class CostSummary:
    """The cost section's paragraphs (markdown; the verify path is a caption), "" / None for
    what the lanes cannot say yet."""

    why: str
    verify_path: str
    time_per_token: str
    round_yield: str | None


def cost_summary(figures: CostFigures, verify_fast: bool, verify_reason: str) -> CostSummary:
    why = BANDWIDTH
    if (cost := figures.verify) is not None:
        why += " " + verify_cost_text(cost.verify_ms, cost.decode_ms, cost.mean_fed)
    return CostSummary(why, verify_path_text(verify_fast, verify_reason), _time_words(figures),
                       _yield_words(figures))


def _time_words(figures: CostFigures) -> str:
    """Wall time per token so far in each lane, and which is faster, said plainly."""
    if (times := figures.time_per_token) is None:
        return ""
    spec_ms, plain_ms = times.speculative_ms, times.plain_ms
    verdict = speed_verdict(spec_ms, plain_ms)
    if times.drafted_by_model and spec_ms > plain_ms and abs(plain_ms / spec_ms - 1) > SAME_WITHIN:  # "slower"
        verdict += (": the draft model is a copy of the same small model, so its k passes cost about as much "
                    "as the passes they save")
    return (f"**Time per token so far** (after the prompt): speculative {spec_ms:.1f} ms, plain {plain_ms:.1f} ms: "
            f"{verdict}. (Measured on a shared machine: noisy.)")


def _yield_words(figures: CostFigures) -> str | None:
    if (got := figures.round_yield) is None:
        return None
    return (f"**Expected tokens per round.** If each guess survives with probability α, independently, a round "
            f"adds 1 + α + … + α^k = (1 − α^(k+1)) / (1 − α) tokens. With the measured α = {got.alpha:.2f} and "
            f"k = {got.k}: **{got.expected:.2f}** expected; measured over the {counted(got.rounds, 'round')} that "
            f"guessed k tokens: **{got.measured:.2f}**. (Guesses are not independent in real text: a copied passage "
            "is kept in long runs, then a whole round fails.)")


def measured_words(measured: PrefillDecode) -> str:
    """The KV cache & speed page's measurement, taken on this page."""
    return (f"Measured now: {measured.prompt_tokens} tokens in one pass took **{measured.prefill_ms:.1f} ms** "
            f"({measured.prefill_ms_per_token:.2f} ms per token); one token per pass took "
            f"**{measured.decode_ms:.1f} ms**. Many positions per pass are far cheaper per token: this is "
            "what verification exploits.")


# ---- the race ------------------------------------------------------------------------------------


def race_table(rows: Sequence[RaceRow], running: str | None = None) -> list[dict[str, object]]:
    """The race's rows as the page's table, each speed-up against plain decoding (the first row);
    `running`: the run under way, shown as a row of its own. The checks first, so that a 1,280-px
    screen shows them beside the method."""
    base = rows[0].ms_per_token if rows else None
    table: list[dict[str, object]] = [
        {"method": row.label, "k": "–" if row.k is None else str(row.k), "same text": "✓" if row.same_text else "✗",
         "ms / token": round(row.ms_per_token, 1), "speed-up": f"{base / row.ms_per_token:.2f}×",
         "tokens / pass": round(row.tokens_per_pass, 2),
         "kept": "–" if row.acceptance is None else pct(row.acceptance, 0),
         "kept by position": " · ".join(pct(a, 0) for a in row.by_position) or "–", "passes": row.passes}
        for row in rows]
    if running is not None:
        table.append({"method": running, "k": "", "same text": "running…", "ms / token": None, "speed-up": "",
                      "tokens / pass": None, "kept": "", "kept by position": "", "passes": None})
    return table


def race_verdict(rows: Sequence[RaceRow]) -> str:
    """Which method won here and why, and why each slower one was slower, in the race's own
    figures: every sentence follows what was just measured."""
    plain_row, entrants = rows[0], rows[1:]
    if wrong := [row.label for row in entrants if not row.same_text]:
        return f"Not plain decoding's text: {', '.join(wrong)}. Speculative decoding must not change a token: a bug."
    if not entrants:
        return "No method could run on this model."
    best = min(entrants, key=lambda row: row.ms_per_token)
    said = [f"**{best.label}** (k = {best.k}) was fastest here: {best.ms_per_token:.1f} ms a token against plain "
            f"decoding's {plain_row.ms_per_token:.1f}, {_kept_words(best)}."
            if best.ms_per_token < plain_row.ms_per_token else
            f"No method beat plain decoding here ({plain_row.ms_per_token:.1f} ms a token)."]
    slower = [row for row in entrants if row.ms_per_token > plain_row.ms_per_token]
    if slower:
        said.append("Slower than plain decoding:\n" + "\n".join(
            f"- {row.label} ({plain_row.ms_per_token / row.ms_per_token:.2f}× its speed): "
            + ("its guesses were seldom kept" if row.tokens_per_pass < SELDOM_KEPT else
               "its guesses were kept, but making them cost more than the passes saved")
            + f" ({_kept_words(row)})." for row in slower))
    return "\n\n".join(said)


SELDOM_KEPT = 1.2  # tokens a pass below which a method's passes hardly made more than plain decoding's


def _kept_words(row: RaceRow) -> str:
    kept = "no guesses" if row.acceptance is None else f"{pct(row.acceptance, 0)} of its guesses kept"
    return f"{row.tokens_per_pass:.2f} tokens a pass, {kept}"


def race_cost_text(runs: int, tokens: int, last: Sequence[tuple[str, float]], plain_ms: float | None) -> str:
    """What a race will cost, said before it starts: the last race on this server where there is
    one, else a floor from the visitor's own plain lane."""
    work = f"{runs} runs of {tokens} new tokens, one after another on this server"
    if last:
        total, (slowest, longest) = sum(s for _, s in last), max(last, key=lambda pair: pair[1])
        return (f"{work}: about {total:.0f} s, what the last race here took (the longest run: {slowest}, "
                f"{longest:.0f} s). It runs in the background, each row shown as it comes.")
    if plain_ms is not None:
        return (f"{work}: at least {runs * tokens * plain_ms / 1e3:.0f} s (plain decoding takes {plain_ms:.0f} ms a "
                "token here, in your plain lane); a method whose guesses cost a pass of their own takes longer. "
                "It runs in the background, each row shown as it comes.")
    return f"{work}. It runs in the background, each row shown as it comes."
