"""HTML views of speculative rounds: the lanes' tokens, one round's guesses and checks, the
k + 1 distributions of the verify pass, the rejection, the KV cache written then cropped.

Pure functions from engine records to HTML strings (tests read them without a browser).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from engine import RoundRecord, SpeculativeGeneration, TokenPiece, TokenTexts
from engine.speculative import Check, PositionView
from ui.views.charts import FINAL_COLOUR, RAW_COLOUR
from ui.views.chips import CHIP_CSS, chip_window
from ui.views.format import esc, pct, pct_cell, quoted, sr_only, visible

TOKEN_HEAD = '<th class="tok"><span class="bc-sr">token</span></th>'  # a header a screen reader reads, unseen
KIND_COLOURS = {"accepted": "#b2f2bb", "replaced": "#ffc078", "bonus": "#d0bfff", "plain": "#dee2e6"}
# A rejected guess: a light magenta, which a red-green colour-blind eye still tells from the kept
# guess's green (a pink did not: tests/ui/test_colour_vision.py); it is struck through and marked ✗ too
REJECTED_COLOUR = "#f3d9fa"
# Not colour alone: a replacement's chip has a dashed frame, a bonus token's a double one, in the
# lane and in its legend; a screen reader hears the kind after each chip
KIND_BORDERS = {"accepted": "", "replaced": "2px dashed #a34a00", "bonus": "3px double #5f3dc4", "plain": ""}
KIND_WORDS = {"accepted": "guess kept", "replaced": "target's token after a rejected guess",
              "bonus": "bonus token (every guess kept)", "plain": "plain decode step (no guess)"}
DRAFT_COLOUR = RAW_COLOUR  # q: the draft's distribution
TARGET_COLOUR = FINAL_COLOUR  # p: the target's final distribution
ROWS_PER_POSITION = 6
T = TypeVar("T")


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """A count with its noun in the right number: 1 token, 2 tokens, 1 guess, 3 guesses."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


def round_kinds(record: RoundRecord) -> tuple[str, ...]:
    """How each token of the round came: the engine's kinds (a round with no guess makes its one
    token as a plain decode step, "plain")."""
    return record.emitted_kinds

CHAIN_CSS = """
<style>
.bc-round{display:inline;border-bottom:3px solid #868e96;padding-bottom:2px;margin-right:2px}
.bc-guesses{display:flex;flex-wrap:wrap;gap:8px;align-items:stretch;margin:4px 0}
.bc-pos{border:1px solid var(--tbt-rule,#dee2e6);border-radius:6px;padding:4px 6px;min-width:0;flex:1 1 220px;
 max-width:420px;font-size:.8rem}
.bc-pos h4{margin:0 0 2px 0;padding:0;font-size:.85rem;font-weight:600;line-height:1.3;overflow-wrap:anywhere}
.bc-pos.bc-no{border-style:dashed;color:var(--tbt-muted,#5f5b57)}  /* never checked: dashed, still legible */
.bc-ok{color:var(--tbt-ok,#2b7a3b);font-weight:700}.bc-bad{color:var(--tbt-bad,#b02525);font-weight:700}
.bc-bonus{color:var(--tbt-bonus,#6741d9);font-weight:700}
.bc-plain{font-weight:700}
.bc-bar{display:block;height:5px;border-radius:2px;margin-top:1px}
.bc-dist{width:100%;border-collapse:collapse;table-layout:fixed}
.bc-dist th{padding:1px 3px;font-weight:400;text-align:right;vertical-align:bottom;line-height:1.1}
.bc-dist td{padding:1px 3px}
.bc-dist .num{width:4.3em;text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
.bc-dist td.tok{font-family:ui-monospace,monospace;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.bc-dist tr.bc-guess td{background:#fff3bf;color:#212529}
.bc-kv{display:flex;flex-wrap:wrap;gap:2px;margin:6px 0}
.bc-cell{width:14px;height:18px;border-radius:2px;background:#ced4da}
.bc-cell.bc-new{background:#74c0fc}.bc-cell.bc-cut{background:#ffa8a8;background-image:repeating-linear-gradient(
 45deg,transparent 0 3px,#fff 3px 5px)}
.bc-legend{font-size:.8rem;opacity:.8;display:flex;gap:12px;flex-wrap:wrap;margin-top:4px}
.bc-sw{display:inline-block;width:14px;height:12px;border-radius:2px;vertical-align:middle;margin-right:3px}
.bc-flat .bc-round{display:contents}
.bc-flat .bc-r0 .tbt-chip{box-shadow:0 3px 0 #495057}.bc-flat .bc-r1 .tbt-chip{box-shadow:0 3px 0 #adb5bd}
.bc-line{border:1px solid var(--tbt-rule,#dee2e6);border-radius:6px;padding:.3rem .6rem}
.bc-line-title{font-weight:700;font-size:1.05rem;margin-bottom:.2rem}
.bc-line-chips{gap:.3rem .25rem}
.bc-mark{font-family:system-ui,sans-serif;margin-right:.5rem;color:var(--tbt-muted,#5f5b57)}
.bc-rejected{text-decoration:line-through;text-decoration-color:#c92a2a}
.bc-skip{outline:2px dotted #868e96;outline-offset:1px}  /* not used: dotted, its text at full contrast */
.bc-sr{position:absolute;width:1px;height:1px;overflow:hidden;clip-path:inset(50%);white-space:nowrap}
.bc-arrow{font-family:system-ui,sans-serif;margin:0 .4rem 0 .2rem;font-weight:700}
</style>
"""


def token_chip(piece: TokenPiece, background: str, title: str, css: str = "", border: str = "") -> str:
    text = esc(piece.text) if piece.special else esc(visible(piece.text))
    frame = f"border:{border};" if border else ""
    # dark text on every light chip colour, in the dark theme too
    return (f'<span class="tbt-chip{" tbt-special" if piece.special else ""}{css}" '
            f'style="{frame}background:{background};color:#212529" '
            f'title="{esc(title)}">{text}</span>')


def _kind_chip(piece: TokenPiece, kind: str, title: str, css: str = "") -> str:
    """A token of the lane as its kind draws it (colour and frame), its kind in words for a screen
    reader (only where it is not a kept guess: the common case goes unsaid)."""
    spoken = "" if kind == "accepted" else sr_only(f"({KIND_WORDS[kind]})")
    return token_chip(piece, KIND_COLOURS[kind], title, css, KIND_BORDERS[kind]) + spoken


def speculative_chips_html(prompt_html: str, generation: SpeculativeGeneration, window_lines: int | None = None
                           ) -> str:
    """The speculative lane's context: prompt chips, then each round's tokens underlined as a
    group and coloured by how they came (guess kept, replacement, bonus). With `window_lines`
    (presentation mode) the chips sit in a window that many rows high showing the newest."""
    groups = []
    for record in generation.rounds:
        chips = "".join(
            _kind_chip(piece, kind, f"round {record.index} · {KIND_WORDS[kind]} · id {piece.token_id}")
            for piece, kind in zip(record.emitted, round_kinds(record), strict=True))
        groups.append(f'<span class="bc-round bc-r{record.index % 2}" title="round {record.index}: one forward pass">'
                      f"{chips}</span>")
    legend = "".join(f'<span><span class="bc-sw" style="background:{c}'
                     f'{";border:" + KIND_BORDERS[k] if KIND_BORDERS[k] else ""}"></span>{KIND_WORDS[k]}</span>'
                     for k, c in KIND_COLOURS.items())
    # in a window every chip is a row item of its own (rows of one height, so none shows cut); each
    # chip then carries its round's underline, alternating in shade from round to round
    flat = "" if window_lines is None else " bc-flat"
    chips = (f'<div class="tbt-chips{flat}" data-rounds="{len(generation.rounds)}">{prompt_html}{"".join(groups)}'
             "</div>")
    return (CHIP_CSS + CHAIN_CSS + (chips if window_lines is None else chip_window(chips, window_lines))
            + f'<div class="bc-legend">{legend}<span>underline: one round = one forward pass</span></div>')


def guess_chip(piece: TokenPiece, check: Check | None) -> str:
    """A drafted token marked by the check: ✓ kept, ✗ rejected, or – never checked."""
    if check is None:
        return token_chip(piece, "#e9ecef", "not checked: an earlier guess was rejected", " bc-skip") + (
            '<span class="bc-mark">–</span>')
    if check.accepted:
        return token_chip(piece, KIND_COLOURS["accepted"], "guess kept") + '<span class="bc-mark bc-ok">✓</span>'
    return (token_chip(piece, REJECTED_COLOUR, "guess rejected", " bc-rejected")
            + '<span class="bc-mark bc-bad">✗</span>')


def round_line_html(record: RoundRecord) -> str:
    """One round on one line, for presentation mode: the guesses marked ✓ / ✗, then the token
    the target adds itself, and what the one forward pass bought."""
    checks = {c.index: c for c in record.checks}
    guesses = "".join(guess_chip(piece, checks.get(i)) for i, piece in enumerate(record.drafted))
    own = record.rejection.token if record.rejection is not None else record.bonus
    kind = "replaced" if record.rejection is not None else "bonus"
    if record.drafted:
        kept = len(record.emitted) > record.accepted  # not when a stop fired before it
        label = ("replaces ✗" if kind == "replaced" else "bonus") + ("" if kept else ", dropped at the stop")
        chip = "" if own is None else _kind_chip(own, kind, KIND_WORDS[kind], "" if kept else " bc-skip")
        target = f'<span class="bc-arrow">→</span>{chip}<span class="bc-mark">{label}</span>' if chip else ""
    else:
        target = ('<span class="bc-mark">a plain step:</span>'
                  + "".join(_kind_chip(p, k, KIND_WORDS[k])
                            for p, k in zip(record.emitted, round_kinds(record), strict=True)))
    guessed = (f"{record.accepted} of {counted(len(record.drafted), 'guess', 'guesses')} kept" if record.drafted
               else "no guess")
    summary = (f"Round {record.index}: {guessed} · 1 forward pass → {counted(len(record.emitted), 'token')}"
               + (f" ({record.cut_by_stop} dropped at a stop)" if record.cut_by_stop else ""))
    return (CHIP_CSS + CHAIN_CSS + f'<div class="bc-line" data-round="{record.index}" '
            f'data-accepted="{record.accepted}" data-drafted="{len(record.drafted)}">'
            f'<div class="bc-line-title">{esc(summary)}</div>'
            f'<div class="tbt-chips bc-line-chips">{guesses}{target}</div></div>')


def _bar(value: float, colour: str) -> str:
    """A bar under a number, as wide as the probability is of its cell."""
    return f'<span class="bc-bar" style="width:{max(2.0, 100 * value):.0f}%;background:{colour}"></span>'


def _number(value: float, colour: str) -> str:
    return f'<td class="num">{pct_cell(value)}{_bar(value, colour)}</td>'


def _verdict(check: Check | None, view: PositionView, greedy: bool, plain_step: bool) -> str:
    """The headline of one verified position: what was guessed and what the rule said."""
    if plain_step:
        return ('<span class="bc-plain">no guess</span>: the model makes its next token from this distribution, '
                "as a plain decode step does")
    if view.drafted_id is None:
        return ('<span class="bc-bonus">bonus position</span>: every guess was kept, so this distribution '
                "gives one more token" if view.reached else "bonus position: not reached (a guess was rejected)")
    if check is None:
        return "not checked: an earlier guess was rejected"
    if greedy:
        rule = "the target's argmax ★" if check.accepted else "the target's argmax ★ is another token"
    else:
        rule = f"u = {check.u:.3f} {'<' if check.accepted else '≥'} min(1, p/q) = {check.accept_prob:.3f}"
    mark = '<span class="bc-ok">✓ kept</span>' if check.accepted else '<span class="bc-bad">✗ rejected</span>'
    return f"{mark} · {esc(rule)}"


def _shown(rows: Sequence[T], drafted_id: int | None, token_id: Callable[[T], int]) -> list[T]:
    """The leading rows, and the guess's row wherever it ranks."""
    return list(rows[:ROWS_PER_POSITION]) + [r for r in rows[ROWS_PER_POSITION:] if token_id(r) == drafted_id]


def _final_table(view: PositionView, greedy: bool) -> tuple[str, float]:
    """The target's p (after the sampler) beside the draft's q, and the residual on a rejected
    position; no q column where the draft guessed nothing. With the mass of the tokens not shown."""
    with_q = view.drafted_id is not None
    residual = any(r.residual is not None for r in view.top)
    shown = _shown(view.top, view.drafted_id, lambda r: r.token_id)
    rows = []
    for row in shown:
        star = " ★" if greedy and row.token_id == view.top[0].token_id else ""  # the pick: p after greedy is 1
        cells = f'<td class="tok" title="{esc(quoted(row.text))}">{esc(quoted(row.text))}{star}</td>'
        cells += (_number(row.q, DRAFT_COLOUR) if with_q else "") + _number(row.p, TARGET_COLOUR)
        if residual:
            cells += f'<td class="num">{pct_cell(row.residual or 0.0)}</td>'
        rows.append(f'<tr class="{"bc-guess" if row.token_id == view.drafted_id else ""}">{cells}</tr>')
    p_head = "p after greedy" if greedy else "p target"
    head = (f'<tr>{TOKEN_HEAD}' + ('<th class="num">q draft</th>' if with_q else "")
            + f'<th class="num">{p_head}</th>' + ('<th class="num">residual</th>' if residual else "") + "</tr>")
    hidden = sum(r.p for r in view.top if r not in shown)
    return f'<table class="bc-dist">{head}{"".join(rows)}</table>', view.others_p + hidden


def _raw_table(view: PositionView) -> tuple[str, float]:
    """Greedy: the model's own softmax at this position, from the verify pass itself (the
    sampler's p is a one-hot there), the greedy pick starred, the guess highlighted (the guess
    always has its row). With the raw mass of the tokens not shown."""
    pick = view.top[0].token_id  # p after greedy: 1 on the pick, sorted first
    by_raw = sorted(view.top, key=lambda r: (-(r.p_raw or 0.0), r.token_id))
    shown = _shown(by_raw, view.drafted_id, lambda r: r.token_id)
    rows = []
    for row in shown:
        star = " ★" if row.token_id == pick else ""
        rows.append(f'<tr class="{"bc-guess" if row.token_id == view.drafted_id else ""}">'
                    f'<td class="tok" title="{esc(quoted(row.text))}">{esc(quoted(row.text))}{star}</td>'
                    f"{_number(row.p_raw or 0.0, TARGET_COLOUR)}</tr>")
    head = (f'<tr>{TOKEN_HEAD}<th class="num" title="the model\'s softmax, before the sampler">raw p</th>'
            "</tr>")
    hidden = sum(r.p_raw or 0.0 for r in view.top if r not in shown)
    return f'<table class="bc-dist">{head}{"".join(rows)}</table>', (view.others_p_raw or 0.0) + hidden


def position_html(view: PositionView, check: Check | None, greedy: bool, number: int, plain_step: bool = False
                  ) -> str:
    """One position of the verify pass: the guess, what the rule said, and a table of the
    leading tokens: sampling shows the target's p beside the draft's q (and the residual on the
    rejected position), the numbers the rule used; greedy shows the model's raw softmax from the
    same pass (the sampler's p is a one-hot there). `plain_step`: the round had no guess, so this
    one distribution makes an ordinary decode step."""
    if plain_step:
        title = "the next token"
    elif view.drafted_id is not None:
        title = f"guess {esc(quoted(next(r.text for r in view.top if r.token_id == view.drafted_id)))}"
    else:
        title = "after the last guess"
    raw = greedy and view.others_p_raw is not None  # a record from a trace written before raw p was kept has none
    table, others = _raw_table(view) if raw else _final_table(view, greedy)
    return (f'<div class="bc-pos{"" if view.reached else " bc-no"}" data-position="{view.position}">'
            f"<h4>{number}. position {view.position}: {title}</h4>"
            f"<div>{_verdict(check, view, greedy, plain_step)}</div>{table}"
            f'<div class="tbt-note">other tokens: {"raw p" if raw else "p"} '
            f"{pct(others)}</div></div>")


def positions_html(record: RoundRecord) -> str:
    """Every distribution the one verify pass returned, left to right."""
    checks = {c.index: c for c in record.checks}
    cards = [position_html(view, checks.get(i), record.sampler.greedy, i + 1, not record.drafted)
             for i, view in enumerate(record.positions)]
    return CHAIN_CSS + f'<div class="bc-guesses">{"".join(cards)}</div>'


def rejection_html(record: RoundRecord, texts: TokenTexts) -> str:
    """What replaced the first rejected guess, and why that keeps the output exact."""
    rejection = record.rejection
    if rejection is None:
        if record.bonus is None:
            return ""
        if not record.drafted:
            return (f"No guess, so nothing to check: the pass's one distribution gives the next token, "
                    f"<b>{esc(quoted(record.bonus.text))}</b>, exactly as a plain decode step does.")
        bonus = (f"Every guess was kept, so the last distribution of the same pass gives a <b>bonus token</b>: "
                 f"<b>{esc(quoted(record.bonus.text))}</b>.")
        if record.cut_by_stop:
            return bonus + " It is not kept: a stop condition fired before it."
        return bonus + f" This round added {counted(len(record.emitted), 'token')} for one forward pass."
    guess = texts.piece(record.checks[rejection.index].token_id)
    if record.sampler.greedy:
        why = (f"Greedy: the guess {esc(quoted(guess.text))} is not the target's argmax, so the argmax "
               f"<b>{esc(quoted(rejection.token.text))}</b> takes its place: exactly the token plain decoding makes.")
    else:
        draw = rejection.draw
        why = (f"u = {rejection.u:.4f} was not below min(1, p/q) = {rejection.accept_prob:.4f}, so the guess "
               f"{esc(quoted(guess.text))} is rejected. The replacement is drawn from the <b>residual</b> "
               f"max(0, p − q), renormalised (it held {pct(rejection.residual_mass)} of p's mass before "
               f"renormalising): the probability the target wanted for tokens the draft under-proposed. "
               f"Drawn with u = {draw.u:.4f}: <b>{esc(quoted(rejection.token.text))}</b>."
               if draw and draw.u is not None else "")
    dropped = len(record.drafted) - rejection.index - 1
    return (f"{why} The {dropped} guess{'es' if dropped != 1 else ''} after it {'were' if dropped != 1 else 'was'} "
            "never checked: they followed a token that is not in the text." if dropped else why)


def kv_html(record: RoundRecord) -> str:
    """The target's cache through the round: held before, written by the verify pass, cropped."""
    kv = record.kv
    shown_before = min(kv.before, 24)  # the old positions are all alike: show the last few
    cells = ['<span class="bc-cell" title="held before this round"></span>'] * shown_before
    for offset in range(kv.written):
        position = kv.before + offset
        cut = position >= kv.after
        cells.append(f'<span class="bc-cell {"bc-cut" if cut else "bc-new"}" title="position {position}: '
                     f'{"written, then cropped" if cut else "written and kept"}"></span>')
    more = f"… {kv.before - shown_before:,} earlier positions, then " if kv.before > shown_before else ""
    return (CHAIN_CSS + f'<div class="tbt-note">{more}the last {shown_before} held before the round:</div>'
            f'<div class="bc-kv" data-written="{kv.written}" data-cropped="{kv.cropped}">{"".join(cells)}</div>'
            f'<div class="bc-legend"><span><span class="bc-sw" style="background:#ced4da"></span>held before '
            f'({kv.before:,})</span><span><span class="bc-sw" style="background:#74c0fc"></span>written by the '
            f'verify pass and kept</span><span><span class="bc-sw" style="background:#ffa8a8"></span>written, then '
            f"cropped ({kv.cropped})</span><span>now {kv.after:,} positions · "
            f"{kv.snapshot.bytes / 2**20:.2f} MiB measured from the tensors</span></div>")


def rounds_table_html(rounds: Sequence[RoundRecord], last: int = 12) -> str:
    """The latest rounds: guesses, kept, tokens added, and where the time went."""
    head = ("<tr><th>round</th><th>guessed</th><th>kept</th><th>tokens added</th><th>draft ms</th>"
            "<th>verify ms</th><th>bookkeeping ms</th></tr>")
    rows = "".join(
        f"<tr><td>{r.index}</td><td>{len(r.drafted)}</td><td>{r.accepted}</td><td>{len(r.emitted)}</td>"
        f'<td class="num">{r.timing.draft_ms:.1f}</td><td class="num">{r.timing.verify_ms:.1f}</td>'
        f'<td class="num">{r.timing.bookkeeping_ms:.1f}</td></tr>' for r in list(rounds)[-last:][::-1])
    return f'<table class="tbt-table">{head}{rows}</table>'


# ---- the round and the cost, in words that fit the record and the measured figures ----------

SAME_WITHIN = 0.05  # two timings closer than this read as "about the same": shared-machine noise


def _go_on_text(draft: object) -> str:
    """A trained draft's rule for guessing again, where it has one."""
    go_on = getattr(draft, "go_on", None)
    if not isinstance(go_on, float) or go_on <= 0:
        return ""
    return (f" It guesses again only after a guess it gave at least {pct(go_on, 0)}, so a round may guess "
            "fewer than k: an unsure guess is seldom kept.")


def no_guess_reason(record: RoundRecord, draft: object) -> str:
    """Why a round proposed nothing: no room before the stop, or (prompt lookup, read from the
    `draft` in use) no earlier place in the context matched its last tokens."""
    if record.k == 0:
        return ("there was no room for a guess: only one more token fits before the stop (max new tokens, or the "
                "context window)")
    longest, shortest = getattr(draft, "max_ngram", None), getattr(draft, "min_ngram", None)
    if getattr(draft, "name", None) != record.method or not isinstance(longest, int) or not isinstance(shortest, int):
        return "the draft proposed nothing"
    first, *rest = range(longest, shortest - 1, -1)
    failing = f" (failing that, its last {' or '.join(map(str, rest))})" if rest else ""
    return (f"prompt lookup copies what followed an earlier occurrence of the context's last {first} tokens"
            f"{failing}, and the context holds none")


def times_a_step(ratio: float) -> str:
    """A verify pass's time as a multiple of one decode step, in words that fit the figure."""
    if abs(ratio - 1) <= SAME_WITHIN:
        return "about as long as one decode step"
    return f"about {ratio:.1f}× as long as one decode step"


def verify_cost_text(verify_ms: float, decode_ms: float, mean_fed: float) -> str:
    """The page's own measurement: a verify pass against a plain decode step."""
    ratio = verify_ms / decode_ms
    against = (f"less than the {mean_fed:.1f} steps it stands in for" if ratio < mean_fed else
               f"no less than the {mean_fed:.1f} steps it stands in for: here the extra positions are not free")
    return (f"Measured on this page: a verify pass over {mean_fed:.1f} tokens took **{verify_ms:.1f} ms** on "
            f"average and a plain decode step **{decode_ms:.1f} ms**, so a verify pass took "
            f"**{times_a_step(ratio)}**: {against}. (Timings on a shared machine are noisy.)")


def verify_path_text(fast: bool, reason: str) -> str:
    """Which pass this server's verify passes take (engine.forward.verify_pass_decision), in words."""
    if fast:
        return ("On this server a verify pass gives each of its rows the digits of the decode step that would read "
                "it (probed equal to one-token steps, bit for bit), so every kept token is plain decoding's to the "
                "last bit.")
    return (f"On this server a verify pass is transformers' multi-token pass ({reason}): each row equals its decode "
            "step's logits to float rounding, far below any greedy margin.")


def speed_verdict(spec_ms: float, plain_ms: float) -> str:
    """Which lane makes tokens faster, per token, in words that fit the figures."""
    if abs(plain_ms / spec_ms - 1) <= SAME_WITHIN:
        return "speculative decoding is **about as fast as** plain decoding here"
    if spec_ms < plain_ms:
        return f"speculative decoding is **{plain_ms / spec_ms:.2f}× faster** here"
    return f"speculative decoding is **{spec_ms / plain_ms:.2f}× slower** here"


def method_note(record: RoundRecord, draft: object, texts: TokenTexts) -> str | None:
    """What this method's round looked like from inside, in words: for lookahead where its guess
    came from (the text, the passes' n-gram pool, the Jacobi window), for early exit which layer
    drafted and what the measured agreement promised. None for the other methods."""
    if getattr(draft, "name", None) != record.method:
        return None
    guess = getattr(draft, "last_guess", None)
    if record.method == "lookahead" and guess is not None and record.drafted:
        where = {"text": "the text itself (what followed the context's last two tokens before)",
                 "pool": "the n-gram pool (a run of tokens an earlier verify pass predicted after this token)",
                 "jacobi": "the Jacobi window (the last pass's own predictions past its rejected guess)"}
        window = " ".join(quoted(texts.piece(t).text) for t in guess.window)
        return (f"Lookahead guessed from {where.get(guess.source, guess.source)}. The pool holds "
                f"{counted(guess.pool_size, 'n-gram')}" + (f"; the window held {window}" if window else "") + ".")
    if record.method == "medusa-heads" and record.drafted:
        return (f"Parallel decoding heads: all {counted(len(record.drafted), 'guess', 'guesses')} came from ONE hidden "
                "state, the model's last one after the previous token: head i guessed the token i + 1 places ahead, "
                "each through the model's own LM head (its 8,192 most frequent rows)." + _go_on_text(draft))
    if record.method == "mtp" and record.drafted:
        return ("Multi-token prediction: one small trained block took the model's last hidden state and the newest "
                "token's embedding and guessed the next token, then fed its own guess back for the one after: "
                "the guesses are sequential, each from the one before." + _go_on_text(draft))
    layer = getattr(draft, "exit_layer", None)
    if record.method.startswith("early-exit-") and isinstance(layer, int):
        return (f"Early exit: each guess came from the first {layer} layers, then the model's final norm and LM head "
                "(the logit lens at that layer, used as a draft), with a KV cache of their own. Every draft token "
                "still reads the whole LM head, so it costs most of a step.")
    return None
