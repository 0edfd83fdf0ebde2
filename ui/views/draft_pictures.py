"""Each draft method's own picture of one round (the Breaking the chain page, under the round):
parallel heads fan out from one hidden state; multi-token prediction feeds each guess back;
lookahead shows its Jacobi window and n-gram pool; early exit shows which layers drafted.

Pure functions from the engine's records (`DraftPicture`, the round's checks) to HTML: tests read
them without a browser. Sized in rem, text in the page's own colour, so they read in either theme.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine import RoundRecord, TokenTexts
from engine.speculative import Check, DraftPicture, Leader
from ui.views.breaking_the_chain import CHAIN_CSS, DRAFT_COLOUR, counted, guess_chip, token_chip
from ui.views.chips import CHIP_CSS
from ui.views.format import esc, pct, quoted, sr_only

PICTURE_CSS = """
<style>
.dp{margin:.4rem 0 .6rem 0;padding:.5rem .7rem;border:1px solid var(--tbt-rule,#dee2e6);border-radius:8px}
.dp-title{font-weight:700;margin-bottom:.35rem}
.dp-row{display:grid;grid-template-columns:repeat(auto-fit,minmax(12rem,1fr));gap:.5rem;align-items:stretch}
.dp-box{border:1px solid var(--tbt-rule,#dee2e6);border-radius:6px;padding:.3rem .5rem;min-width:0}
.dp-box h4{margin:0 0 .25rem 0;padding:0;font-size:.9rem;font-weight:600;line-height:1.3}
.dp-from{margin:0 0 .35rem 0;font-size:.95rem}
.dp-arrow{font-weight:700;margin:0 .3rem}
.dp-leaders{display:grid;grid-template-columns:minmax(0,max-content) 1fr max-content;gap:.15rem .4rem;
 align-items:center;font-size:.85rem}
.dp-leaders .tbt-chip{max-width:9rem;overflow:hidden;text-overflow:ellipsis}
.dp-track{height:.55rem;border-radius:2px;background:var(--tbt-rule,#dee2e6);overflow:hidden}
.dp-fill{height:100%;border-radius:2px}
.dp-num{font-variant-numeric:tabular-nums;text-align:right}
.dp-picked{font-weight:700}
.dp-verdict{margin-top:.25rem;font-size:.85rem}
.dp-layers{display:flex;flex-wrap:wrap;gap:2px;margin:.3rem 0}
.dp-layer{width:1.1rem;height:1.3rem;border-radius:2px;border:1px solid #868e96;font-size:.6rem;line-height:1.3rem;
 text-align:center;color:#212529;background:#f1f3f5}
.dp-layer.dp-ran{background:#74c0fc;border-color:#1c7ed6}
.dp-gram{display:flex;flex-wrap:wrap;gap:.15rem;align-items:center;margin:.15rem 0}
.dp-gram.dp-used{outline:2px solid #f08c00;outline-offset:2px;border-radius:4px}
.dp-note{font-size:.85rem;color:var(--tbt-muted,#5f5b57);margin-top:.3rem}
</style>
"""


def draft_picture_html(picture: DraftPicture, record: RoundRecord, texts: TokenTexts) -> str:
    """The round's draft as its method makes it, each guess marked as the verify pass judged it."""
    checks = {check.index: check for check in record.checks}
    if picture.method == "medusa-heads":
        body = _heads(picture, checks, texts)
    elif picture.method == "mtp":
        body = _mtp(picture, checks, texts)
    elif picture.method == "lookahead":
        body = _lookahead(picture, checks, texts)
    elif picture.exit_layer is not None and picture.layers is not None:
        body = _early_exit(picture, checks, texts)
    else:  # a draft model: each guess from its own pass, fed back
        body = (_title(f"Draft model: {counted(len(picture.guesses), 'guess', 'guesses')}, one pass of the draft "
                       "each, each fed the guess before")
                + _sequential(picture, checks, texts, "the draft model's pass"))
    return (CHIP_CSS + CHAIN_CSS + PICTURE_CSS
            + f'<figure class="dp" data-method="{esc(picture.method)}" data-guesses="{len(picture.guesses)}">'
            + body + "</figure>")


def _title(text: str) -> str:
    return f'<figcaption class="dp-title">{esc(text)}</figcaption>'


def _quoted(texts: TokenTexts, token_id: int) -> str:
    return quoted(texts.piece(token_id).text)


def _chip(texts: TokenTexts, token_id: int, title: str = "") -> str:
    return token_chip(texts.piece(token_id), "#e9ecef", title or f"id {token_id}")


def _leaders(leaders: Sequence[Leader], picked: int, texts: TokenTexts) -> str:
    """The draft's leading tokens at one guess, a bar each (the probability it gave them); the
    guessed token in bold (with a sampler other than greedy it may not be the first)."""
    rows = []
    for leader in leaders:
        mark = " dp-picked" if leader.token_id == picked else ""
        said = sr_only(" (the guess)") if leader.token_id == picked else ""
        rows.append(f'<span class="{mark.strip()}">{_chip(texts, leader.token_id)}{said}</span>'
                    f'<span class="dp-track"><span class="dp-fill" style="display:block;width:'
                    f'{max(1.0, 100 * leader.prob):.0f}%;background:{DRAFT_COLOUR}"></span></span>'
                    f'<span class="dp-num{mark}">{esc(pct(leader.prob))}</span>')
    return f'<div class="dp-leaders">{"".join(rows)}</div>' if rows else ""


def _verdict(index: int, checks: dict[int, Check], token_id: int, texts: TokenTexts) -> str:
    """The guess as the round's chips show it: ✓ kept, ✗ rejected, – never checked."""
    chip = guess_chip(texts.piece(token_id), checks.get(index))
    words = ("kept" if checks[index].accepted else "rejected") if index in checks else "not checked"
    return f'<div class="dp-verdict">guess {index + 1}: {chip}{sr_only(words)}</div>'


def _guess_box(picture: DraftPicture, index: int, heading: str, checks: dict[int, Check], texts: TokenTexts) -> str:
    leaders = picture.leaders[index] if index < len(picture.leaders) else ()
    token = picture.guesses[index]
    return (f'<div class="dp-box" data-guess="{index + 1}"><h4>{esc(heading)}</h4>'
            f"{_leaders(leaders, token, texts)}{_verdict(index, checks, token, texts)}</div>")


def _heads(picture: DraftPicture, checks: dict[int, Check], texts: TokenTexts) -> str:
    count = len(picture.guesses)
    boxes = "".join(_guess_box(picture, i, f"head {i + 1}: the token {counted(i + 1, 'place')} after "
                                           f"{_quoted(texts, picture.after_token)}", checks, texts)
                    for i in range(count))
    return (_title(f"Parallel decoding heads: one hidden state, {counted(count, 'guess', 'guesses')} at once")
            + f'<div class="dp-from">the model\'s last hidden state, the one that predicted '
            f'{_chip(texts, picture.after_token)}<span class="dp-arrow" aria-hidden="true">⇉</span>'
            f"{counted(count, 'head')}, side by side:</div>"
            f'<div class="dp-row">{boxes}</div>'
            + '<div class="dp-note">Every head reads the same state in one small product: no guess waits for '
            "another, so a later head guesses further ahead with less to go on.</div>" + _unsure_note(picture))


def _sequential(picture: DraftPicture, checks: dict[int, Check], texts: TokenTexts, maker: str) -> str:
    boxes = []
    for i in range(len(picture.guesses)):
        before = picture.after_token if i == 0 else picture.guesses[i - 1]
        fed = "the context's last token" if i == 0 else f"guess {i}"
        arrow = "" if i == 0 else "→ "  # each box takes the one before's guess
        boxes.append(_guess_box(picture, i, f"{arrow}{maker}, fed {fed} {_quoted(texts, before)}", checks, texts))
    return f'<div class="dp-row">{"".join(boxes)}</div>'


def _mtp(picture: DraftPicture, checks: dict[int, Check], texts: TokenTexts) -> str:
    return (_title(f"Multi-token prediction: {counted(len(picture.guesses), 'guess', 'guesses')}, one after another")
            + _sequential(picture, checks, texts, "the MTP block")
            + '<div class="dp-note">The first block reads the model\'s last hidden state and the embedding of '
            f"{esc(_quoted(texts, picture.after_token))}; each later one reads the state the block before "
            "made and the embedding of that block's own guess. One small block per guess, not the whole model.</div>"
            + _unsure_note(picture))


def _unsure_note(picture: DraftPicture) -> str:
    """Why a trained draft guessed fewer than k: it was unsure of its last guess."""
    if picture.stopped_unsure is None or picture.go_on is None:
        return ""
    return (f'<div class="dp-note" data-stopped="unsure">It stopped after guess {len(picture.guesses)}: it gave that '
            f"guess {esc(pct(picture.stopped_unsure))}, and it guesses again only at {esc(pct(picture.go_on, 0))} or "
            "more. An unsure guess is seldom kept, and each further guess would cost a draft step and a row of "
            "the verify pass.</div>")


def _early_exit(picture: DraftPicture, checks: dict[int, Check], texts: TokenTexts) -> str:
    ran, layers = picture.exit_layer or 0, picture.layers or 0
    cells = "".join(f'<span class="dp-layer{" dp-ran" if layer <= ran else ""}" title="layer {layer}">{layer}</span>'
                    for layer in range(1, layers + 1))
    return (_title(f"Early exit: the first {ran} of {layers} layers drafted, all {layers} verified")
            + f'<div class="dp-layers" role="img" aria-label="layers 1 to {ran} of {layers} drafted">{cells}</div>'
            + _sequential(picture, checks, texts, f"the first {ran} layers, final norm and head")
            + '<div class="dp-note">Each guess is the logit lens at layer '
            f"{ran}, used as a draft. It skips {counted(layers - ran, 'layer')} of {layers} but still reads the "
            "whole LM head, the fifth of a step's bytes.</div>")


SOURCES = {"text": "the text itself: what followed the context's last two tokens before",
           "pool": "the n-gram pool: a run an earlier verify pass predicted after this token",
           "jacobi": "the Jacobi window: the last verify pass's own predictions past its rejected guess"}


def _lookahead(picture: DraftPicture, checks: dict[int, Check], texts: TokenTexts) -> str:
    guess = "".join(_verdict(i, checks, t, texts) for i, t in enumerate(picture.guesses))
    window = ("".join(_chip(texts, t) for t in picture.window) if picture.window
              else '<span class="dp-note">empty: the last pass left no refined guesses for this context</span>')
    grams = []
    for gram in picture.pool:
        used = picture.source == "pool" and tuple(gram[:len(picture.guesses)]) == picture.guesses
        chips = "".join(_chip(texts, t) for t in gram)
        grams.append(f'<div class="dp-gram{" dp-used" if used else ""}">{_chip(texts, picture.after_token)}'
                     f'<span class="dp-arrow" aria-hidden="true">→</span>{chips}'
                     f"{sr_only(' (the guess came from this one)') if used else ''}</div>")
    pool = "".join(grams) or '<span class="dp-note">none after this token yet</span>'
    held = f"the pool holds {counted(picture.pool_size, 'n-gram')}; {len(picture.pool)} follow this token"
    return (_title(f"Lookahead: {counted(len(picture.guesses), 'guess', 'guesses')} from "
                   f"{SOURCES.get(picture.source, picture.source)}")
            + '<div class="dp-row">'
            + f'<div class="dp-box"><h4>Jacobi window{" (used)" if picture.source == "jacobi" else ""}</h4>'
            + f'<div class="dp-gram{" dp-used" if picture.source == "jacobi" else ""}">{window}</div></div>'
            + f'<div class="dp-box"><h4>n-gram pool after {esc(_quoted(texts, picture.after_token))}</h4>'
            + f'{pool}<div class="dp-note">{esc(held)}</div></div>'
            + f'<div class="dp-box"><h4>the guess, checked by the one verify pass</h4>{guess}</div></div>'
            + '<div class="dp-note">No draft model: the guesses come from the text and from the verify passes\' '
            "own predictions, refined pass by pass (greedy decoding is the fixed point of that refinement).</div>")
