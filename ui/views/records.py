"""HTML views of engine records: the sampler's decision, termination, sequence probability.

Pure functions from engine records to HTML strings, so pages stay thin and tests can read
what a student sees without a browser.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from engine import (
    Candidate,
    Decision,
    Distribution,
    KVSnapshot,
    LoadedModel,
    StageRecord,
    StepRecord,
    Termination,
    TokenTexts,
    first_match,
)
from ui.views.charts import FINAL_COLOUR, RAW_COLOUR
from ui.views.format import esc, logp, nbytes, pct, prob, quoted

PANEL_CSS = """
<style>
.tbt-table{border-collapse:collapse;width:100%;font-size:.9rem}
.tbt-table th{text-align:left;font-weight:600;border-bottom:2px solid var(--tbt-rule,#dee2e6);padding:3px 6px}
.tbt-table td{border-bottom:1px solid var(--tbt-rule,#dee2e6);padding:3px 6px;vertical-align:top}
.tbt-table td.num{text-align:right;font-variant-numeric:tabular-nums}
.tbt-off td{color:var(--tbt-muted,#5f5b57)}
.tbt-fired td{background:#fff3bf;color:#212529;font-weight:600}
.tbt-note{color:var(--tbt-muted,#5f5b57);font-size:.85rem}
.tbt-heading{font-size:1.5rem;font-weight:600;line-height:1.2;margin:0;padding:.5rem 0 .6rem 0}
.tbt-heading:not(:first-child){margin-top:1rem}
.tbt-caption{font-size:.875rem;line-height:1.6;opacity:.7;margin:0 0 .75rem 0}
.st-key-sampler_controls h3{font-size:1.5rem}
.tbt-pick{font-size:1.15rem;margin:.2rem 0 .4rem 0}
.tbt-pick b{background:#fff3bf;color:#212529;padding:0 4px;border-radius:4px;font-family:ui-monospace,monospace}
.tbt-cdf{position:relative;height:30px;border:1px solid #bbb;border-radius:4px;
 overflow:visible;margin:20px 0 22px 0;font-size:.75rem}
.tbt-seg{position:absolute;top:0;bottom:0;overflow:hidden;white-space:nowrap;text-overflow:clip;
 border-right:1px solid #fff;color:#fff;padding:6px 3px 0 3px;box-sizing:border-box}
.tbt-seg-pick{outline:3px solid #111;outline-offset:-3px;z-index:1}
.tbt-seg-tail{color:#212529;padding-left:8px;background:repeating-linear-gradient(45deg,#ced4da 0 4px,#e9ecef 4px 8px)}
.tbt-u{position:absolute;top:-18px;bottom:-4px;border-left:2px solid currentColor}
.tbt-u span{position:absolute;top:-2px;left:3px;white-space:nowrap;font-weight:600}
.tbt-u-left span{left:auto;right:5px}
.tbt-scale{position:absolute;bottom:-18px;color:var(--tbt-muted,#5f5b57)}
.tbt-text{white-space:pre-wrap;font-size:1.05rem;line-height:1.5;border-left:4px solid #ccc;
 padding:4px 10px;margin-top:6px}
.tbt-text-prompt{color:var(--tbt-muted,#5f5b57)}
.tbt-text mark{background:#ffd43b;color:#212529}
.tbt-text s{color:var(--tbt-muted,#5f5b57)}
.tbt-badge{display:inline-block;background:#fff3bf;color:#212529;border:1px solid #f08c00;border-radius:10px;
 padding:0 8px;font-size:.85rem;margin-left:6px}
.tbt-formula{font-family:ui-monospace,monospace;font-size:.95rem;line-height:1.7}
</style>
"""

# Presentation mode's one-line panels (their type is sized from the viewport: ui/widgets/presentation.py).
LINE_CSS = """<style>
.tbt-title{font-weight:700;font-size:1.05rem;margin-bottom:.25rem}
.tbt-line{font-size:1.1rem;line-height:1.4}
.tbt-line b{background:#fff3bf;color:#212529;padding:0 .2em;border-radius:4px;font-family:ui-monospace,monospace}
.tbt-line-stop{background:#fff3bf;color:#212529;border-left:.3rem solid #f08c00;padding:.1rem .5rem;font-weight:700}
</style>"""

FINISH_LABELS = {
    "eos": "the model emitted its end-of-sequence token",
    "stop_sequence": "a stop sequence appeared in the text",
    "max_tokens": "the max-new-tokens limit was reached",
    "context_window": "the context window is full",
}
CDF_SEGMENTS = 10  # leaders drawn as their own band on the strip: every record holds the final top 10


def _row(cells: Sequence[str], css: str = "", numeric: Sequence[int] = ()) -> str:
    tds = "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(cells))
    return f'<tr class="{css}">{tds}</tr>'


def _table(headers: Sequence[str], rows: Sequence[str]) -> str:
    head = "".join(f"<th>{h}</th>" for h in headers)
    return f'<table class="tbt-table"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def eos_names(lm: LoadedModel) -> str:
    """The model's end-of-sequence token(s), as text."""
    return " ".join(lm.texts.piece(i).text for i in lm.eos_ids)


def token_name(texts: TokenTexts, token_id: int) -> str:
    """Any token's visible text, quoted, read from the model's own vocabulary (a pick far down
    the list is not among the distribution's recorded leaders)."""
    return quoted(texts.piece(token_id).text)


# ---- sampler decision -----------------------------------------------------------------------


def heading_html(title: str, caption: str) -> str:
    """A panel's title and caption (HTML) inside a larger HTML element. The title is a level-3
    heading, under the page's title (level 2) with no level skipped, sized as Streamlit's level 4."""
    return f'<h3 class="tbt-heading">{esc(title)}</h3><p class="tbt-caption">{caption}</p>'


def stages_html(decision: Decision) -> str:
    """The sampler chain, stage by stage in the order applied."""
    rows = []
    for number, stage in enumerate(decision.stages, start=1):
        if not stage.active:
            rows.append(_row([str(number), esc(stage.label), f"{stage.kept:,}", "–", esc(stage.note)],
                             "tbt-off", numeric=(2,)))
        elif stage.top_prob_before is not None:  # a reshape: nothing removed, the distribution moved
            rows.append(_row([str(number), esc(stage.label), f"{stage.kept:,}", "–", reshape_text(stage)],
                             numeric=(2,)))
        else:
            rows.append(_row([str(number), esc(stage.label), f"{stage.kept:,}", f"{stage.removed:,}",
                              f"{pct(stage.removed_mass)} of the mass removed"], numeric=(2, 3)))
    return _table(["#", "stage", "tokens left", "removed", "what it did"], rows)


def reshape_text(stage: StageRecord) -> str:
    """How a reshaping stage moved the distribution: the top token's probability and the entropy,
    entering and leaving it."""
    return (f"top token {pct(stage.top_prob_before)} → {pct(stage.top_prob_after)}; entropy "
            f"{stage.entropy_before_bits:.2f} → {stage.entropy_after_bits:.2f} bits")


def _cdf_order(top: Sequence[Candidate]) -> list[Candidate]:
    """Candidates in the order the draw lays them out: final probability, highest first."""
    return sorted((c for c in top if c.final_prob > 0), key=lambda c: (-c.final_prob, c.token_id))


@dataclass(frozen=True)
class Band:
    """One stretch of the cumulative strip: a token's band, or many tokens summed."""

    start: float  # where it begins on [0, 1)
    width: float
    text: str  # the token, or how many tokens
    kind: str  # "token", "pick" (the sampler's pick) or "tail" (tokens summed into one band)
    prob: float  # its final probability


def cdf_bands(decision: Decision, distribution: Distribution) -> list[Band]:
    """The strip's bands end to end over [0, 1), as the draw lays the tokens out: each of the
    final distribution's leaders its own band, the sampler's pick its own band at the draw's
    [cdf_low, cdf_high) wherever it ranks, and every other token summed into a tail band that
    says how many tokens it holds. The bands fill the strip: u always lands in one."""
    draw = decision.draw
    leaders = _cdf_order(distribution.top)[:CDF_SEGMENTS]
    picked = decision.sampler_token_id
    bands, edge = [], 0.0
    for candidate in leaders:
        kind = "pick" if candidate.token_id == picked else "token"
        bands.append(Band(edge, candidate.final_prob, quoted(candidate.text), kind, candidate.final_prob))
        edge += candidate.final_prob
    rest = decision.final_kept - len(leaders)  # tokens of the final distribution not drawn as leaders
    if draw is not None and all(c.token_id != picked for c in leaders):
        pick = next((c for c in distribution.top if c.token_id == picked), None)
        text = quoted(pick.text) if pick is not None else "the pick"
        between = draw.rank - 1 - len(leaders)
        if between > 0:
            bands.append(Band(edge, max(0.0, draw.cdf_low - edge), _tail_text(between), "tail",
                              max(0.0, draw.cdf_low - edge)))
        bands.append(Band(draw.cdf_low, draw.cdf_high - draw.cdf_low, text, "pick", draw.cdf_high - draw.cdf_low))
        edge, rest = draw.cdf_high, rest - between - 1
    if rest > 0:
        bands.append(Band(edge, max(0.0, 1.0 - edge), _tail_text(rest), "tail", max(0.0, 1.0 - edge)))
    return bands


def _tail_text(count: int) -> str:
    return f"{count:,} other token{'s' if count != 1 else ''}"


def cdf_strip_html(decision: Decision, distribution: Distribution) -> str:
    """The cumulative final distribution as bands on [0, 1) with the random number u marked."""
    draw = decision.draw
    if draw is None:
        return ""
    # past the middle the label goes on the line's left, so it never runs off the strip's right edge
    side = " tbt-u-left" if draw.u is not None and draw.u > 0.5 else ""
    marker = "" if draw.u is None else (f'<div class="tbt-u{side}" style="left:{100 * draw.u:.3f}%">'
                                        f"<span>u = {draw.u:.4f}</span></div>")
    segments = []
    for band in cdf_bands(decision, distribution):
        colour = {"pick": FINAL_COLOUR, "token": RAW_COLOUR}.get(band.kind)
        style = f"left:{100 * band.start:.3f}%;width:{max(100 * band.width, 0.6 if band.kind == 'pick' else 0):.3f}%"
        style += f";background:{colour}" if colour else ""
        label = esc(band.text) if band.width > (0.2 if band.kind == "tail" else 0.06) else ""
        title = f"{band.text}: final p {pct(band.prob)}" + (" (the pick)" if band.kind == "pick" else "")
        segments.append(f'<div class="tbt-seg tbt-seg-{band.kind}" style="{style}" title="{esc(title)}">'
                        f"{label}</div>")
    return (f'<div class="tbt-cdf" role="img" aria-label="{esc(_strip_words(decision, distribution))}">'
            f'{"".join(segments)}{marker}'
            '<span class="tbt-scale" style="left:0">0</span><span class="tbt-scale" style="right:0">1</span>'
            "</div>")


def _strip_words(decision: Decision, distribution: Distribution) -> str:
    """The strip in words, for a screen reader."""
    draw = decision.draw
    pick = next((c for c in distribution.top if c.token_id == decision.sampler_token_id), None)
    where = f"u = {draw.u:.4f} falls in" if draw.u is not None else "the draw picked"
    return (f"Cumulative final distribution from 0 to 1: {where} the band of "
            f"{quoted(pick.text) if pick is not None else 'the pick'}, "
            f"rank {draw.rank:,}, from {draw.cdf_low:.4f} to {draw.cdf_high:.4f}.")


def decision_html(decision: Decision, distribution: Distribution, texts: TokenTexts) -> str:
    """How the pick was made: greedy argmax, a random draw on the CDF, or forced."""
    sampler_pick = token_name(texts, decision.sampler_token_id)
    if decision.greedy:
        how = (f"Greedy (temperature 0): the argmax is taken, no random number is drawn. "
               f"The sampler picks <b>{esc(sampler_pick)}</b>.")
    elif decision.draw is not None and decision.draw.u is not None:
        draw = decision.draw
        how = (f"A uniform random number <b>u = {draw.u:.6f}</b> from this generation's seeded generator. "
               f"Lined up by final probability, the tokens fill [0, 1); u falls in "
               f"[{draw.cdf_low:.6f}, {draw.cdf_high:.6f}), the band of rank {draw.rank}: "
               f"<b>{esc(sampler_pick)}</b>.")
    else:  # torch.multinomial's method: no single u, but the pick still owns one band
        draw = decision.draw
        band = f" It owns the band [{draw.cdf_low:.6f}, {draw.cdf_high:.6f}), rank {draw.rank}." if draw else ""
        how = (f"Drawn as torch.multinomial draws (one random waiting time per token; the shortest "
               f"relative to its probability wins): <b>{esc(sampler_pick)}</b>.{band}")
    forced = ""
    if decision.forced:
        forced = (f'<div class="tbt-pick">Forced by you: <b>{esc(token_name(texts, decision.token_id))}</b>'
                  f" (final p {pct(decision.final_prob)}); the sampler's own pick is shown below.</div>")
    return (forced + f'<div>{how}</div>' + cdf_strip_html(decision, distribution)
            + f'<div class="tbt-note">{_tokens(decision.final_kept)} can be drawn · final entropy '
              f"{decision.final_entropy_bits:.2f} bits</div>")


def decision_line_html(decision: Decision, texts: TokenTexts) -> str:
    """How the pick was made, in one line (presentation mode: read from the back of the room)."""
    pick = f"<b>{esc(token_name(texts, decision.token_id))}</b> (final p {pct(decision.final_prob)})"
    draw = decision.draw
    if decision.forced:
        how = f"Forced by you (the sampler picked {esc(token_name(texts, decision.sampler_token_id))})"
    elif decision.greedy or draw is None:
        how = "Greedy (temperature 0): the most probable token"
    elif draw.u is not None:
        how = f"Random draw: u = {draw.u:.4f} falls in the band of rank {draw.rank}"
    else:
        how = f"Random draw (multinomial): rank {draw.rank}"
    return f'<div class="tbt-line tbt-decision">{how} → {pick}</div>'


# ---- termination ----------------------------------------------------------------------------


def _stop_state(termination: Termination) -> list[str]:
    rows = []
    fired = first_match(termination.stops)
    for state in termination.stops:
        if state.matched:
            status = f"matched at character {state.position}"
        elif state.partial:
            status = (f"text ends with {state.partial} of {len(state.sequence)} characters: "
                      f"{esc(quoted(state.sequence[:state.partial]))}")
        else:
            status = "no partial match"
        css = "tbt-fired" if termination.finish_reason == "stop_sequence" and state == fired else ""
        rows.append(_row([f"stop sequence {esc(quoted(state.sequence))}", status, "fires on a match"], css))
    if not rows:
        rows.append(_row(["stop sequences", "none set", "—"], "tbt-off"))
    return rows


def termination_html(termination: Termination, eos_names: str) -> str:
    """Every termination condition's state after a step; the one that fired highlighted."""
    reason = termination.finish_reason
    picked = "picked" if termination.eos_picked else "not picked"
    eos_status = f"raw p(EOS) = {pct(termination.eos_prob, 2)}; {picked}"
    if termination.ignore_eos:
        eos_status += " (ignored: ignore EOS is on)"
    rows = [_row([f"end of sequence {esc(eos_names)}", eos_status, "fires when picked"],
                  "tbt-fired" if reason == "eos" else "")]
    rows += _stop_state(termination)
    rows.append(_row(["max new tokens", f"{termination.new_tokens} used", f"{termination.max_new_tokens}"],
                     "tbt-fired" if reason == "max_tokens" else "", numeric=(2,)))
    rows.append(_row(["context window", f"{termination.context_tokens:,} tokens (prompt + new)",
                      f"{termination.context_window:,}"], "tbt-fired" if reason == "context_window" else "",
                     numeric=(2,)))
    verdict = (f"<b>Stopped:</b> {FINISH_LABELS[reason]}." if reason
               else "No condition fired: Step goes on.")
    return _table(["condition", "this step", "limit"], rows) + f'<div class="tbt-pick">{verdict}</div>'


def termination_line_html(termination: Termination, eos_names: str) -> str:
    """Every condition's state in one line, or the one that fired (presentation mode)."""
    reason = termination.finish_reason
    if reason:
        return f'<div class="tbt-line tbt-check tbt-line-stop">⏹ Stopped: {FINISH_LABELS[reason]}.</div>'
    eos = f"{esc(eos_names)} p {pct(termination.eos_prob, 2)}" + (" (ignored)" if termination.ignore_eos else "")
    stops = [f"{esc(quoted(s.sequence))} {s.partial}/{len(s.sequence)} chars" for s in termination.stops]
    parts = [eos, f"{termination.new_tokens} of {termination.max_new_tokens} new tokens",
             "stop sequences: " + (", ".join(stops) or "none")]
    return f'<div class="tbt-line tbt-check">▶ No stop yet, go on: {" · ".join(parts)}</div>'


def decoded_text_html(prompt_text: str, output_text: str, stops: tuple, finish_reason: str | None,
                      eos_names: str) -> str:
    """The prompt (grey) and the output; a stop sequence highlighted and what follows it struck
    out (it is not returned); a badge saying what ended generation."""
    match = first_match(stops)
    if match is None:
        output = esc(output_text)
    else:
        end = match.position + len(match.sequence)
        output = (esc(output_text[:match.position]) + f"<mark>{esc(output_text[match.position:end])}</mark>"
                  + f"<s>{esc(output_text[end:])}</s>")
    badge = ""
    if finish_reason == "eos":
        badge = f'<span class="tbt-badge">⏹ {esc(eos_names)} (end of sequence)</span>'
    elif finish_reason:
        badge = f'<span class="tbt-badge">⏹ {FINISH_LABELS[finish_reason]}</span>'
    return f'<div class="tbt-text"><span class="tbt-text-prompt">{esc(prompt_text)}</span>{output}{badge}</div>'


# ---- sequence probability -------------------------------------------------------------------


@dataclass(frozen=True)
class SequenceStats:
    """log P of every generated token and of the whole sequence, given the prompt."""

    log_probs: tuple[float, ...]  # natural log, per step
    cumulative: tuple[float, ...]
    perplexity: float  # exp(-mean log p); inf when a token had probability 0

    @property
    def total(self) -> float:
        return self.cumulative[-1] if self.cumulative else 0.0


def sequence_stats(steps: Sequence[StepRecord], basis: str = "raw") -> SequenceStats:
    """Per-token and cumulative log-probabilities from the step records.

    basis "raw": the model's softmax probability of each token; "final": its probability in
    the distribution it was drawn from (1 under greedy; 0 for a forced token the sampler had
    filtered out).
    """
    values = [step.prob if basis == "raw" else step.final_prob for step in steps]
    logs = tuple(math.log(p) if p > 0 else -math.inf for p in values)
    cumulative, total = [], 0.0
    for value in logs:
        total += value
        cumulative.append(total)
    perplexity = math.exp(-total / len(logs)) if logs and math.isfinite(total) else (
        math.inf if logs else 1.0)
    return SequenceStats(logs, tuple(cumulative), perplexity)


def factorisation_html(steps: Sequence[StepRecord], stats: SequenceStats, basis: str, last: int = 4) -> str:
    """P(t1..tN | prompt) = Π P(ti | t<i), written out with the real numbers of the last few
    tokens (earlier ones folded into one factor)."""
    if not steps:
        return ""
    n = len(steps)
    shown = list(range(max(0, n - last), n))
    head_terms, head_values = [], []
    if shown[0] > 0:
        k = shown[0]
        head_terms.append(_sequence_term(k))
        head_values.append(_p_text(math.exp(stats.cumulative[k - 1])))
    terms = head_terms + [f"P({esc(quoted(steps[i].token.text))} | t<sub>&lt;{i + 1}</sub>)" for i in shown]
    values = head_values + [_p_text(steps[i].prob if basis == "raw" else steps[i].final_prob) for i in shown]
    return (f'<div class="tbt-formula">{_sequence_term(n, given=" | prompt")} = {" × ".join(terms)}<br>'
            f"= {' × '.join(values)}<br>= {_p_text(math.exp(stats.total))}"
            f" &nbsp; (log P = {logp(stats.total)})</div>")


def _sequence_term(count: int, given: str = "") -> str:
    """P(t1…tk) for the first `count` tokens; one token is P(t1), never P(t1…t1)."""
    tokens = "t<sub>1</sub>" if count == 1 else f"t<sub>1</sub>…t<sub>{count}</sub>"
    return f"P({tokens}{given})"


def _tokens(count: int) -> str:
    return f"{count:,} token" + ("" if count == 1 else "s")


def _p_text(p: float) -> str:
    return prob(p) if p >= 1e-4 or p == 0 else f"{p:.3e}"


def sequence_table_html(steps: Sequence[StepRecord], stats: SequenceStats, last: int = 8) -> str:
    """The last few tokens with their probability, log-probability and running total."""
    rows = []
    start = max(0, len(steps) - last)
    for i in range(start, len(steps)):
        value = math.exp(stats.log_probs[i]) if math.isfinite(stats.log_probs[i]) else 0.0
        rows.append(_row([str(steps[i].index), esc(quoted(steps[i].token.text)), _p_text(value),
                          logp(stats.log_probs[i]), logp(stats.cumulative[i])], numeric=(0, 2, 3, 4)))
    return _table(["step", "token", "P(token | before)", "log P", "cumulative log P"], rows)


# ---- KV cache -------------------------------------------------------------------------------


def kv_check_html(kv: KVSnapshot) -> str:
    """The cache's measured size beside the formula, and its per-layer tensor shapes."""
    verdict = "✓ equal" if kv.bytes == kv.formula_bytes else "✗ different"
    shapes = {shape for shape in kv.layer_shapes}
    if len(shapes) == 1:
        (k_shape, v_shape), = shapes
        layers = (f"{kv.layers} layers, each K {tuple(k_shape)} and V {tuple(v_shape)} "
                  "(batch, KV heads, positions, head dim)")
    else:
        layers = "; ".join(f"layer {i}: K {k} V {v}" for i, (k, v) in enumerate(kv.layer_shapes))
    return (f'<div class="tbt-formula">measured from the tensors: <b>{kv.bytes:,} bytes</b> ({nbytes(kv.bytes)})<br>'
            f"formula: {esc(kv.formula)} = <b>{kv.formula_bytes:,} bytes</b> &nbsp; {verdict}</div>"
            f'<div class="tbt-note">{kv.positions:,} positions · dtype {esc(kv.dtype)} · {esc(layers)}</div>')
