"""The Class page's HTML: what every student sees of a room, the class's guesses, the reveal,
the lesson's score, and the QR code of the student link. Built from the room's plain records;
every text a student typed (a guess, a name) is escaped, so none of it can become HTML or
Markdown on anyone's screen.

A student's view of one room version is the same for every student, so it is built once per
version (`follow_html`) and sent as written: 60 followers cost one build per Step, not 60. Each
room keeps its newest KEPT_VERSIONS views: a view holds the whole context, so keeping every
version of a long lesson grew the server by megabytes a minute (docs/class.md, the soak), while
the version before the newest is still being drawn by the pages that were running when a peek
made the next one.
"""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import qrcode
import qrcode.image.svg

from classroom import LessonScore, Snapshot, Tally
from classroom.hall import Reveal
from classroom.quiz import PhaseResult
from classroom.tally import HUMAN_SOURCE, HUMAN_TOP1, BoardRow, LessonSummary, OwnScore
from engine import stop_sequence_states
from ui.views.bars import Bar, BarRow, bars_html, distribution_bars_html
from ui.views.charts import RAW_COLOUR
from ui.views.chips import context_html, prompt_chips
from ui.views.format import esc, pct, quoted, sr_only
from ui.views.records import LINE_CSS, decoded_text_html

CLASS_COLOUR = "#2b8a3e"  # the class's guesses: green beside the model's blue
KEPT_VIEWS = 64  # rooms whose student views are kept built (above ClassLimits.max_rooms)
KEPT_VERSIONS = 2  # per room: the newest, and the one before it
BOARD_ROWS = 8  # the board's latest steps shown (the download has every one)
CLASS_CSS = """<style>
.st-key-cls_qr [data-testid="stElementToolbar"]{top:0}  /* its full-screen button on the image, not the header */
.tbt-class-status{font-size:1rem;margin:.2rem 0 .5rem 0}
.tbt-class-reveal{margin:.6rem 0;padding:.5rem .7rem;border-radius:.5rem;border:1px solid rgba(128,128,128,.4)}
.tbt-class-reveal table{border-collapse:collapse;margin-top:.3rem;font-size:.9rem}
.tbt-class-reveal td,.tbt-class-reveal th{padding:.1rem .6rem .1rem 0;text-align:left}
.tbt-class-reveal td.num{text-align:right;font-variant-numeric:tabular-nums}
.tbt-class-names{opacity:.85;font-size:.85rem}
.tbt-class-board{border-collapse:collapse;margin:.3rem 0 .6rem 0;font-size:.9rem}
.tbt-class-board caption{text-align:left;font-weight:600;padding-bottom:.2rem}
.tbt-class-board td,.tbt-class-board th{padding:.1rem .7rem .1rem 0;text-align:left}
.tbt-class-board td.num{text-align:right;font-variant-numeric:tabular-nums}
.tbt-class-code{font-size:2.6rem;font-weight:700;letter-spacing:.25rem;font-family:ui-monospace,Menlo,Consolas,monospace}
.tbt-chips{overflow-wrap:anywhere}
</style>"""

_views: OrderedDict[str, dict[int, tuple[str, str]]] = OrderedDict()  # code -> {version: view}
_views_lock = threading.Lock()


def status_html(snapshot: Snapshot) -> str:
    """The Step page's count line: N tokens generated · prompt M tokens (· finished: why)."""
    count = len(snapshot.steps)
    text = (f"<b>{count}</b> token{'s' if count != 1 else ''} generated · prompt {len(snapshot.prompt_pieces)} "
            "tokens")
    if snapshot.finish_reason:
        text += f" · <b>finished: {esc(snapshot.finish_reason.replace('_', ' '))}</b>"
    if snapshot.steps:  # what a screen reader says of a new step (ui/widgets/follow.py announces this line)
        text += sr_only(f". The newest token: {quoted(snapshot.steps[-1].token.text)}.")
    return f'<div class="tbt-class-status" data-steps="{count}">{text}</div>'


def follow_html(snapshot: Snapshot) -> tuple[str, str]:
    """Everything a student sees of one room version, built once per version: what goes above
    the guess controls (the room's state, the context with its colour key, the text so far), and
    what goes below them (the last reveal, the score), so a phone shows the guess first."""
    with _views_lock:
        if (kept := _views.get(snapshot.code, {}).get(snapshot.version)) is not None:
            _views.move_to_end(snapshot.code)
            return kept
    above = (CLASS_CSS + LINE_CSS + status_html(snapshot)
             + context_html(prompt_chips(snapshot.prompt_pieces), snapshot.steps, legend=bool(snapshot.steps))
             + decoded_text_html(snapshot.prompt_text, snapshot.output_text,
                                 stop_sequence_states(snapshot.output_text, snapshot.stop_sequences),
                                 snapshot.finish_reason, snapshot.eos_text)
             + ("" if snapshot.finished else "<h4>What will the model write next?</h4>"))
    below = (reveal_html(snapshot) if snapshot.reveal else "") + lesson_html(snapshot.lesson, snapshot.board)
    below = CLASS_CSS + below if below else ""
    body = (above, below)
    with _views_lock:
        room = _views.setdefault(snapshot.code, {})
        room[snapshot.version] = body
        for version in sorted(room)[:-KEPT_VERSIONS]:  # a late build of an old version is not kept
            del room[version]
        _views.move_to_end(snapshot.code)
        while len(_views) > KEPT_VIEWS:
            _views.popitem(last=False)
    return body


def reveal_html(snapshot: Snapshot) -> str:
    """The latest step revealed: the distribution with the pick, and how the class guessed."""
    reveal, record = snapshot.reveal, snapshot.steps[-1]
    return ('<div class="tbt-class-reveal">'
            + f'<div class="tbt-title">Step {reveal.index} revealed: the model wrote {esc(quoted(reveal.pick.text))} '
              f"(raw probability {pct(reveal.pick_prob)})</div>"
            + guessed_line(reveal) + _class_beside_model(reveal.tally)
            + '<div class="tbt-title">The model\'s distribution, its pick marked</div>'
            + distribution_bars_html(record.distribution, record.token_id) + "</div>")


def _class_beside_model(result: Tally) -> str:
    """The reveal's class guesses beside the model's probability for each: counts only, never who
    (the names are the presenter's alone, off the projector)."""
    if not result.total:
        return ""
    return ('<div class="tbt-title">What the class guessed, beside the model\'s probability for each token</div>'
            + class_guesses_html(result))


def guessed_line(reveal: Reveal) -> str:
    total = reveal.tally.total
    if not total:
        return "<div>No one guessed this step.</div>"
    right = reveal.tally.right(reveal.pick.token_id)
    return f"<div><b>{right} of {total}</b> guess{'es' if total != 1 else ''} named it.</div>"


def guesses_table(result: Tally, pick_id: int | None) -> str:
    """Each guessed token: how many, the model's probability for it, and who (names as text)."""
    if not result.counts:
        return ""
    rows = "".join(
        f"<tr><td>{'▶ ' if c.token_id == pick_id else ''}{esc(quoted(c.text))}</td><td class='num'>{c.count}</td>"
        f"<td class='num'>{'' if c.model_prob is None else esc(pct(c.model_prob))}</td>"
        f"<td class='tbt-class-names'>{esc(', '.join(c.names))}</td></tr>"
        for c in result.counts)
    return ("<table><tr><th>guessed token</th><th>guesses</th><th>model's probability</th><th>who</th></tr>"
            f"{rows}</table>")


def waiting_html(result: Tally) -> str:
    """What the projector shows while the class guesses: how many guesses are in, nothing of
    what they are, who made them, or what the model expects."""
    count = f"{result.total} guess{'es' if result.total != 1 else ''}"
    return (f'<div class="tbt-class-waiting"><b>{count}</b> in for the next token. What the class guessed, who '
            "guessed what and the model's answer stay hidden until the reveal.</div>")


def class_guesses_html(result: Tally) -> str:
    """The presenter's chart: each guessed token's share of the class, beside the model's
    probability for it (hidden from the students until the reveal)."""
    if not result.total:
        return "<div>No guesses yet.</div>"
    rows = [BarRow(quoted(c.text), (Bar(c.count / result.total, f"{c.count} of {result.total}", CLASS_COLOUR),
                                    *(() if c.model_prob is None else (Bar(c.model_prob, pct(c.model_prob),
                                                                           RAW_COLOUR),))))
            for c in result.counts[:10]]
    return bars_html(rows, ((CLASS_COLOUR, "the class's guesses"), (RAW_COLOUR, "the model's probability")))


def lesson_html(score: LessonScore, rows: Sequence[BoardRow] = ()) -> str:
    """The lesson's running board: the class against the model so far, the published figure for
    people, and each revealed token (the newest first) with how many named it."""
    if not score.steps:
        return ""
    head = (f'<div class="tbt-class-status">Over {score.steps} step{"s" if score.steps != 1 else ""} guessed: '
            f"the class named the next token in <b>{pct(score.class_accuracy)}</b> of {score.guesses} guesses; "
            f"the model gave the tokens it wrote <b>{pct(score.model_mean_prob)}</b> on average. People in a "
            f"published study named it about <b>{pct(HUMAN_TOP1, 0)}</b> of the time "
            f'<span class="tbt-class-names">({esc(HUMAN_SOURCE.split(":")[0])})</span>.</div>')
    shown = [row for row in reversed(rows) if row.guesses][:BOARD_ROWS]
    if not shown:
        return head
    body = "".join(f"<tr><td class='num'>{row.index}</td><td>{esc(quoted(row.text))}</td>"
                   f"<td class='num'>{esc(pct(row.model_prob))}</td><td class='num'>{row.right} of {row.guesses}</td>"
                   "</tr>" for row in shown)
    return (head + '<table class="tbt-class-board"><caption>The lesson so far, the newest step first</caption>'
            "<tr><th>step</th><th>the model wrote</th><th>its probability</th><th>the class named it</th></tr>"
            f"{body}</table>")


def own_score_html(score: OwnScore | None) -> str:
    """A student's own record, for their screen alone."""
    if score is None:
        return ""
    return (f'<div class="tbt-class-status">Your score: <b>{score.right} of {score.guessed}</b> of your guesses named '
            f"the token the model wrote ({pct(score.right / score.guessed, 0)}; only you see this).</div>")


def summary_html(summary: LessonSummary, phases: Mapping[str, PhaseResult]) -> str:
    """The end of the lesson, for the presenter: the scores, the hardest and easiest tokens, and
    the quiz before and after."""
    score = summary.score
    parts = [f'<div class="tbt-class-status"><b>{summary.tokens}</b> tokens generated; <b>{score.guesses}</b> '
             f"guesses from <b>{summary.students}</b> student{'s' if summary.students != 1 else ''}. The class named "
             f"<b>{pct(score.class_accuracy)}</b> right (people in the published study: about "
             f"{pct(HUMAN_TOP1, 0)}); the model gave its own tokens <b>{pct(score.model_mean_prob)}</b> on "
             "average.</div>"]
    for title, rows in (("Hardest for the class", summary.hardest), ("Easiest for the class", summary.easiest)):
        if rows:
            parts.append(f"<div><b>{title}:</b> " + "; ".join(
                f"step {r.index} {esc(quoted(r.text))}: {r.right} of {r.guesses} (the model: {esc(pct(r.model_prob))})"
                for r in rows) + "</div>")
    if phases:
        parts.append("<div><b>The quiz:</b> " + "; ".join(
            f"{name}, {result.students} student{'s' if result.students != 1 else ''}: "
            f"{'—' if result.overall is None else pct(result.overall, 0)} right"
            for name, result in phases.items()) + "</div>")
    return CLASS_CSS + "".join(parts)


def qr_svg(url: str) -> str:
    """The QR code of `url` as SVG text (dark modules on white, readable in either theme)."""
    image = qrcode.make(url, image_factory=qrcode.image.svg.SvgPathImage, box_size=12, border=3)
    out = io.BytesIO()
    image.save(out)
    svg = out.getvalue().decode()
    return svg.replace("<svg ", '<svg style="background:#fff" ', 1)
