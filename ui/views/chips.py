"""Token chips: the context as the model sees it, one box per token.

Prompt tokens are grey; generated tokens are coloured by the raw probability the model gave
them (the model's own confidence, before any sampler reshaping); the newest has a ring, 4 px
outside it (a row keeps 4 px each side, so the ring is not cut at a scrolled window's edge when
the newest chip starts a line). Special tokens (dashed) and partial UTF-8 bytes (dotted) stay
visible, and whitespace is drawn (␣ ↵ ⇥). Hovering a chip shows its id, position and probabilities; a screen reader
reads each generated chip's probability after it (the shading in words).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

from engine import StepRecord, TokenPiece
from ui.views.format import esc, pct, quoted, sr_only, visible

# Light to dark blue: a sequential scale that reads on a projector and for colour-blind eyes.
_SCALE = ("#eef4fb", "#c6dbef", "#9ecae1", "#6baed6", "#2171b5", "#08519c")  # white on the 5th: 5.1:1
ALTERNATIVES_SHOWN = 3

CHIP_CSS = """
<style>
.tbt-chips{display:flex;flex-wrap:wrap;gap:0 3px;align-items:center;font-family:ui-monospace,
 SFMono-Regular,Menlo,Consolas,monospace;font-size:1rem;line-height:1.5;padding:0 4px}
.tbt-fold{flex-basis:100%;margin:.1rem 0}.tbt-fold[open]{display:flex;flex-wrap:wrap;gap:0 3px}
.tbt-fold summary{flex-basis:100%;cursor:pointer;font-family:sans-serif;font-size:.9rem}
.tbt-chip{border:1px solid #c9ced6;border-radius:5px;padding:0 5px;margin:2px 0;white-space:pre;cursor:default}
.tbt-prompt{background:#f1f2f4;color:#4a4f57}
.tbt-special{border-style:dashed;border-color:#8a6d00;color:#6b5400;background:#fff7d6}
.tbt-bytes{border-style:dotted;border-color:#8a3ab9}
.tbt-forced{box-shadow:inset 0 -3px 0 #d9480f}
.tbt-newest{outline:3px solid #f08c00;outline-offset:1px}
.tbt-ws{opacity:.55}
.tbt-br{flex-basis:100%;height:0}
.tbt-legend{display:flex;gap:10px;align-items:center;font-size:.8rem;color:var(--tbt-muted,#5f5b57);margin-top:6px;flex-wrap:wrap}
.tbt-swatch{display:inline-block;width:22px;height:12px;border-radius:3px;vertical-align:middle}
</style>
"""


def probability_colours(p: float) -> tuple[str, str]:
    """Background and text colour for a chip whose token had probability p."""
    index = min(int(p * len(_SCALE)), len(_SCALE) - 1)
    return _SCALE[index], ("#ffffff" if index >= 4 else "#102a43")


def _label(text: str) -> str:
    """Chip text as HTML: visible whitespace dimmed, a line break after a newline."""
    parts = []
    for ch in text:
        shown = visible(ch)
        parts.append(f'<span class="tbt-ws">{shown}</span>' if shown != ch else esc(ch))
    return "".join(parts) or '<span class="tbt-ws">∅</span>'


def _piece_classes(piece: TokenPiece) -> list[str]:
    classes = ["tbt-chip"]
    if piece.special:
        classes.append("tbt-special")
    if piece.partial_bytes:
        classes.append("tbt-bytes")
    return classes


def _chip(piece: TokenPiece, classes: list[str], title: str, style: str = "") -> str:
    chip = (f'<span class="{" ".join(classes)}" style="{style}" title="{esc(title)}">'
            f"{esc(piece.text) if piece.special else _label(piece.text)}</span>")
    return chip + ('<span class="tbt-br"></span>' if "\n" in piece.text and not piece.special else "")


# A long prompt's chips fold: thousands of chips made a page tens of thousands of pixels tall, and
# the prompt's start and end are what a reader follows (the end joins the generated tokens)
FOLD_OVER, KEEP_HEAD, KEEP_TAIL = 400, 40, 160


def _prompt_chip(position: int, piece: TokenPiece) -> str:
    return _chip(piece, [*_piece_classes(piece), "tbt-prompt"],
                 f"prompt token · position {position} · id {piece.token_id}" + (" · special token" if piece.special
                                                                                else ""))


def prompt_chips(pieces: Sequence[TokenPiece]) -> str:
    """HTML chips for the prompt tokens (positions 0..n-1); past FOLD_OVER tokens the middle is
    folded into a disclosure that opens on a click, the start and the end shown."""
    chips = [_prompt_chip(position, piece) for position, piece in enumerate(pieces)]
    if len(chips) <= FOLD_OVER:
        return "".join(chips)
    middle = chips[KEEP_HEAD:-KEEP_TAIL]
    folded = (f'<details class="tbt-fold"><summary>… {len(middle):,} more prompt tokens (positions {KEEP_HEAD:,} to '
              f"{len(chips) - KEEP_TAIL - 1:,}): show them</summary>{''.join(middle)}</details>")
    return "".join(chips[:KEEP_HEAD]) + folded + "".join(chips[-KEEP_TAIL:])


def step_tooltip(step: StepRecord) -> str:
    """What a generated chip says on hover: where it sits, how likely it was, what else was."""
    others = [c for c in step.distribution.top if c.token_id != step.token_id][:ALTERNATIVES_SHOWN]
    lines = [f"step {step.index} · position {step.position} · id {step.token_id}",
             f"raw p {pct(step.prob)} (rank {step.rank}) · final p {pct(step.final_prob)}",
             "alternatives: " + ", ".join(f"{quoted(c.text)} {pct(c.prob)}" for c in others)]
    if step.decision.forced:
        lines.append("forced by you (the sampler would have picked id "
                     f"{step.decision.sampler_token_id})")
    return "\n".join(lines)


def generated_chip(step: StepRecord, newest: bool = False) -> str:
    """One generated token as a chip coloured by its raw probability."""
    classes = _piece_classes(step.token)
    if step.decision.forced:
        classes.append("tbt-forced")
    if newest:
        classes.append("tbt-newest")
    style = ""
    if not step.token.special:
        background, colour = probability_colours(step.prob)
        style = f"background:{background};color:{colour}"
    # beside the chip, not in it: the chip's own text stays the token's
    return _chip(step.token, classes, step_tooltip(step), style) + sr_only(spoken_probability(step, newest))


def spoken_probability(step: StepRecord, newest: bool = False) -> str:
    """What the chip's shading says, in words: the raw probability the model gave the token."""
    return f"(raw p {pct(step.prob)}{', forced' if step.decision.forced else ''}{', newest' if newest else ''})"


def legend_html() -> str:
    """The key to the chips' colours and borders."""
    swatches = "".join(f'<span class="tbt-swatch" style="background:{c}"></span>' for c in _SCALE)
    return (f'<div class="tbt-legend"><span>generated, by raw probability: low {swatches} high</span>'
            '<span class="tbt-chip tbt-prompt">prompt</span>'
            '<span class="tbt-chip tbt-special">special</span>'
            '<span class="tbt-chip tbt-bytes">&lt;0xF0&gt; byte</span>'
            '<span class="tbt-chip tbt-newest">newest</span>'
            '<span class="tbt-chip tbt-forced">forced</span>'
            '<span>␣ space · ↵ newline</span></div>')


# A step's chip (not the newest) by the record's id, while the record lives: records never
# change, and without this every Step click drew every earlier chip again, a cost that grows
# with the length of the generation (`bench.ui_bench`).
_older_chips: dict[int, tuple[weakref.ref, str]] = {}


def older_chip(step: StepRecord) -> str:
    """`generated_chip(step)` for a step that is no longer the newest, drawn once per record."""
    key = id(step)
    cached = _older_chips.get(key)
    if cached is None or cached[0]() is not step:
        cached = (weakref.ref(step, lambda _, key=key: _older_chips.pop(key, None)), generated_chip(step))
        _older_chips[key] = cached
    return cached[1]


def context_html(prompt_html: str, steps: Sequence[StepRecord], legend: bool = True) -> str:
    """The whole context as chips: pre-rendered prompt chips, then one chip per step."""
    generated = "".join(older_chip(step) for step in steps[:-1]) + "".join(
        generated_chip(step, newest=True) for step in steps[-1:])
    return (CHIP_CSS + f'<div class="tbt-chips" data-steps="{len(steps)}">{prompt_html}{generated}</div>'
            + (legend_html() if legend else ""))


def chip_window(chips_html: str, lines: int = 3) -> str:
    """Chips in a window `lines` rows high that shows the newest ones: a column-reverse box starts
    scrolled to its end, older chips scroll up out of sight. Sized for presentation mode's chips
    (1.3rem type at line height 1.5, a 1 px border, 2 px above and below each: every row the same
    height, a line break adding none) so no row shows cut; 4 px more keep the newest chip's outline."""
    return (f'<div class="tbt-chip-window" style="max-height:calc({lines} * (1.95rem + 6px) + 4px);'
            f'padding:0 0 4px 0;box-sizing:border-box;overflow-y:auto;display:flex;flex-direction:column-reverse">'
            f"{chips_html}</div>")
