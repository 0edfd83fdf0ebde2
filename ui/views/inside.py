"""Inside the forward pass, drawn: the logit lens as a table of layers, the new token's attention
as a heatmap of layers × positions, and the time per layer. Views of engine.InsideView only."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from engine import InsideView, TokenPiece
from ui.views.format import esc, nbytes, pct, quoted, visible

MEAN = "mean of the heads"
ATTENTION_COLOUR, MLP_COLOUR, OTHER_COLOUR = "#1971c2", "#e8590c", "#adb5bd"


LENS_COLUMNS_HELP = {
    "layer": "Where the lens reads the hidden state: the embeddings (before any layer), then after each layer.",
    "predicts": "The token this layer's state would predict if the model stopped here: the final norm and the "
                "LM head applied to it (the raw logit lens).",
    "its p": "That token's probability under this layer's lens.",
    "the pick's p": "The probability this layer's lens gives the token the step actually picked.",
    "the pick's rank": "Where the step's pick stands in this layer's lens: 1 is the top token.",
    "entropy (bits)": "How spread out this layer's lens is: 0 bits is certain; more bits, more tokens in play.",
    "ms": "The time this layer took in this one pass (see the note under the time chart on how steady it is).",
}


def lens_table(view: InsideView) -> pd.DataFrame:
    """One row per layer: what the model would predict if it stopped there, and the pick's place."""
    rows = []
    for layer in view.layers:
        name = "embeddings" if layer.layer == 0 else f"layer {layer.layer}"
        mark = " ◀ the pick leads from here" if layer.layer == view.first_lead else ""
        rows.append({"layer": name + mark, "predicts": quoted(layer.top_text), "its p": layer.top_prob,
                     "the pick's p": layer.pick_prob, "the pick's rank": layer.pick_rank,
                     "entropy (bits)": layer.entropy_bits,
                     "ms": layer.ms})
    return pd.DataFrame(rows)


def head_choices(view: InsideView) -> list[str]:
    """The heatmap's head selector: the mean, then each query head with the KV head it reads."""
    return [MEAN, *(f"query head {h} (reads KV head {kv})" for h, kv in enumerate(view.kv_head_of))]


def attention_rows(view: InsideView, head: str) -> list[list[float]]:
    """Per layer 1..L, the fed token's attention over positions 0..position for one head (or the mean)."""
    rows = []
    for layer in view.layers[1:]:
        heads = layer.attention or ()
        if head == MEAN:
            rows.append([sum(values) / len(heads) for values in zip(*heads, strict=True)] if heads else [])
        else:
            rows.append(list(heads[head_choices(view).index(head) - 1]))
    return rows


def attention_figure(view: InsideView, pieces: Sequence[TokenPiece], head: str = MEAN, height: int = 520
                     ) -> go.Figure:
    """Layers (rows, the first at the bottom) × context positions (columns, labelled with their
    tokens): how much of the new token's attention each position takes."""
    rows = attention_rows(view, head)
    labels = [f"{i} {visible(p.text)}" for i, p in enumerate(pieces[: view.position + 1])]
    figure = go.Figure(go.Heatmap(
        z=rows, x=labels, y=[f"layer {layer.layer}" for layer in view.layers[1:]], colorscale="Blues", zmin=0,
        zmax=1, colorbar={"title": {"text": "weight"}},
        hovertemplate="%{y}, position %{x}: %{z:.3f}<extra></extra>"))
    figure.update_layout(title={"text": f"The new token's attention ({head})"}, height=height,
                         margin={"l": 10, "r": 10, "t": 50, "b": 10}, xaxis={"tickangle": -60, "type": "category"},
                         yaxis={"type": "category"})
    return figure


def times_figure(view: InsideView, height: int = 360) -> go.Figure:
    """Milliseconds per layer, split into attention, MLP and the rest (norms, residuals), and the LM head."""
    names = ["embed", *(str(layer.layer) for layer in view.layers[1:]), "head"]
    attention = [0.0, *(layer.attention_ms or 0.0 for layer in view.layers[1:]), 0.0]
    mlp = [0.0, *(layer.mlp_ms or 0.0 for layer in view.layers[1:]), 0.0]
    totals = [view.layers[0].ms, *(layer.ms for layer in view.layers[1:]), view.head_ms]
    other = [max(0.0, t - a - m) for t, a, m in zip(totals, attention, mlp, strict=True)]
    figure = go.Figure()
    for label, values, colour in (("attention", attention, ATTENTION_COLOUR), ("MLP", mlp, MLP_COLOUR),
                                  ("the rest (norms, embedding, head)", other, OTHER_COLOUR)):
        figure.add_bar(x=names, y=values, name=label, marker_color=colour,
                       hovertemplate="%{x}: %{y:.2f} ms<extra>" + label + "</extra>")
    figure.update_layout(barmode="stack", height=height, title={"text": "Time per layer in this pass (ms)"},
                         margin={"l": 10, "r": 10, "t": 80, "b": 10},
                         legend={"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"},
                         xaxis={"title": {"text": "layer"}, "type": "category"},
                         yaxis={"title": {"text": "ms"}})
    return figure


def bytes_read(view: InsideView) -> tuple[int, int, int]:
    """The bytes the pass read: the layers' weights, the cached keys and values, and all of them
    with the LM head (a tied head is the embedding matrix: read once per step, as the head)."""
    layers = sum(layer.weight_bytes for layer in view.layers[1:])
    kv = sum(layer.kv_bytes for layer in view.layers)
    return layers, kv, layers + kv + view.head_bytes


def steadiness_text(view: InsideView) -> str:
    """How far one pass's layer times can be trusted: every layer does the same work, so their
    spread within this pass is the machine's noise (other visitors, other programs), not the layers."""
    times = sorted(layer.ms for layer in view.layers[1:])
    if len(times) < 2:
        return "One pass's times: another pass of the same step can take longer or shorter."
    middle = times[len(times) // 2]
    return (f"These are one pass's times. The {len(times)} layers do the same work, yet took from "
            f"{times[0]:.1f} to {times[-1]:.1f} ms (median {middle:.1f} ms) in this pass: that spread is mostly the "
            "machine's noise (other visitors' steps, other programs), not a difference between layers. Compare "
            "layers by the median, and another step's pass for a second reading.")


def bytes_text(view: InsideView) -> str:
    """What the pass read, in words: every layer's weights, the KV cache, the LM head."""
    layers, kv, total = bytes_read(view)
    embeddings, head = view.layers[0].weight_bytes, view.head_bytes
    share = head / total if total else 0.0
    tied = " (the same matrix as the embeddings: this model ties them)" if embeddings == head else ""
    return (f"This pass read **{nbytes(layers)}** of layer weights, **{nbytes(kv)}** of cached keys and values, "
            f"and the LM head's **{nbytes(head)}**{tied}: the head alone is **{share:.0%}** of the bytes a decode "
            "step reads, because every step scores all of the vocabulary. Reading them, not the arithmetic, is "
            "what a decode step waits for (the KV cache & speed page measures it).")


def reading_text(view: InsideView) -> str:
    """The pass's time and bytes in one sentence, for a projector."""
    layers, kv, total = bytes_read(view)
    return (f"This pass took **{view.forward_ms:.0f} ms** and read **{nbytes(total)}**: the layers' weights "
            f"{nbytes(layers)}, the cached keys and values {nbytes(kv)}, the LM head {nbytes(view.head_bytes)} "
            f"(**{view.head_bytes / total:.0%}**, for scoring all of the vocabulary)." if total else "")


def pass_text(view: InsideView, pick: TokenPiece) -> str:
    """The pass in one sentence: the fed token's place, the layers, where the pick came to lead."""
    return (f"the fed token at position {view.position} went through {len(view.layers) - 1} layers. "
            f"{lead_text(view, pick)}")


def lead_runs(view: InsideView, pick_id: int) -> list[tuple[int, int]]:
    """The stretches of consecutive layers (first, last) at which the pick is the lens's top token."""
    runs: list[tuple[int, int]] = []
    for layer in view.layers:
        if layer.top_token_id != pick_id:
            continue
        if runs and runs[-1][1] == layer.layer - 1:
            runs[-1] = (runs[-1][0], layer.layer)
        else:
            runs.append((layer.layer, layer.layer))
    return runs


def layer_name(index: int, last: int) -> str:
    """A layer as the lens table names it: the embeddings, layer N, the last layer."""
    return "the embeddings" if index == 0 else "the last layer" if index == last else f"layer {index}"


def run_name(run: tuple[int, int], last: int) -> str:
    first, end = run
    if first == end:
        return layer_name(first, last)
    start = "the embeddings" if first == 0 else f"layer {first}"
    return f"{start} to {layer_name(end, last)}" if first == 0 or end == last else f"layers {first}–{end}"


def lead_text(view: InsideView, pick: TokenPiece) -> str:
    """Where the step's pick is the lens's top token, in words that name exactly those layers."""
    last = len(view.layers) - 1
    runs = lead_runs(view, pick.token_id)
    if not runs:
        return (f"{quoted(pick.text)} is the lens's top token at no layer: the sampler chose it from the final "
                "distribution, where it is not the top token either.")
    if runs == [(last, last)]:
        return f"{quoted(pick.text)} comes to the top only at the last layer."
    if len(runs) == 1 and runs[0][1] == last:
        if runs[0][0] == 0:
            return f"{quoted(pick.text)} is the lens's top token at every layer, the embeddings to the last layer."
        return (f"{quoted(pick.text)} leads from **layer {runs[0][0]}** on, of {last}: the layers after it sharpen "
                "what the middle of the network decided.")
    named = [run_name(run, last) for run in runs]
    where = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
    if runs[-1][1] != last:
        return (f"{quoted(pick.text)} is the lens's top token at {where}: not at the last layer, so the sampler "
                "chose it from the final distribution, where another token is on top.")
    return (f"{quoted(pick.text)} is the lens's top token at {where}: it loses the lead in between and takes it "
            "back, to keep it to the end.")


def echo_lesson(view: InsideView) -> str:
    """Why layer 0 predicts what it does, true to this model (tied embeddings or not)."""
    tied = view.layers[0].weight_bytes == view.head_bytes
    return ("**The embeddings echo the input.** Before any layer has worked, the hidden state is just the fed token's "
            + ("embedding; this model uses the same matrix as its LM head (tied embeddings), so the lens reads the "
               "token back, usually with near certainty (where it does not, another token's embedding lies even "
               "closer to this one than the token's own)." if tied else
               "embedding; this model's LM head is a separate matrix, so what layer 0 predicts is not the input "
               "token itself but whatever that embedding happens to score highest."))


# ---- the Lesson's stage: the same view, compact enough for one projector screen -------------

LENS_CSS = """<style>
.tbt-lens{display:grid;grid-template-columns:repeat(auto-fill,minmax(8.4em,1fr));gap:.25rem;margin:.3rem 0 .6rem;
 font-size:max(.95rem,calc(.5rem + .75vw))}  /* larger on a wide projector, never below body text */
.tbt-lens-cell{border:1px solid var(--tbt-cell-rule,#c9ced6);border-radius:5px;padding:.1rem .35rem;
 background:var(--tbt-cell,#f1f3f5);color:var(--tbt-cell-ink,#212529);
 line-height:1.3;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.tbt-lens-cell b{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;white-space:pre}
.tbt-lens-pick{background:#fff3bf;border-color:#e67700;color:#212529}  /* the pick's light band in either theme */
.tbt-lens-lead{outline:3px solid #e67700;outline-offset:-1px}
.tbt-lens-key{font-size:.85rem;margin-bottom:.2rem}
</style>"""


def lens_cells_html(view: InsideView, pick: TokenPiece, pick_id: int) -> str:
    """Every layer as one small cell (its number, the token it would predict, that token's
    probability), wrapping into a few rows; the cells that predict the step's pick are shaded and
    say so in text (▶), the layer from which it leads is outlined and starred (★)."""
    cells = []
    for layer in view.layers:
        name = "embeddings" if layer.layer == 0 else f"layer {layer.layer}"
        picks = layer.top_token_id == pick_id
        lead = layer.layer == view.first_lead
        marks = ("★ " if lead else "") + ("▶ " if picks else "")
        classes = "tbt-lens-cell" + (" tbt-lens-pick" if picks else "") + (" tbt-lens-lead" if lead else "")
        said = f"{name}: predicts {quoted(layer.top_text)} at {pct(layer.top_prob)}" + (
            ", the step's pick" if picks else "") + (", the pick leads from here" if lead else "")
        cells.append(f'<div class="{classes}" role="listitem" aria-label="{esc(said)}">{esc(marks)}'
                     f'{esc("emb" if layer.layer == 0 else f"L{layer.layer}")} <b>{esc(visible(layer.top_text))}'
                     f'</b> {esc(pct(layer.top_prob, 0))}</div>')
    key = (f'<div class="tbt-lens-key">Each cell: a layer, the token it would predict, its probability. '
           f'▶ shaded: predicts the step\'s pick {esc(quoted(pick.text))} · ★ outlined: the pick leads from here on'
           '</div>')
    return LENS_CSS + key + f'<div class="tbt-lens" role="list">{"".join(cells)}</div>'


def attention_by_position(view: InsideView) -> list[float]:
    """The fed token's attention on each context position, averaged over every layer and query
    head (each layer's heads sum to 1 over the positions, so the averages do too)."""
    rows = [[sum(values) / len(heads) for values in zip(*heads, strict=True)]
            for layer in view.layers[1:] if (heads := layer.attention)]
    return [sum(column) / len(rows) for column in zip(*rows, strict=True)] if rows else []


def sink_text(view: InsideView, pieces: Sequence[TokenPiece]) -> str:
    """How much of the new token's attention lands on the first position, in words."""
    weights = attention_by_position(view)
    if not weights:
        return ""
    first, latest = weights[0], weights[-1]
    heads = len(view.kv_head_of)
    kv_heads = len(set(view.kv_head_of))
    shared = (f" Its {heads} query heads read {kv_heads} KV heads ({heads // kv_heads} query heads share each "
              "cached key and value: grouped-query attention)." if kv_heads < heads else "")
    sink = " (an attention sink)" if first == max(weights) and len(weights) > 1 else ""
    return (f"Averaged over the {len(view.layers) - 1} layers and every head, the new token's query puts "
            f"**{pct(first, 0)}** of its attention on the very first token {quoted(pieces[0].text)}{sink} and "
            f"**{pct(latest, 0)}** on itself; the other {max(0, len(weights) - 2)} positions share "
            f"the rest.{shared}")


LESSONS = (
    "**The answer appears late.** Early and middle layers favour punctuation and frequent short tokens; the "
    "specific next word usually takes the lead only in the last few layers.",
    "**Attention sinks.** Most heads put much of the new token's attention on the very first position: a "
    "place to park attention that is not needed elsewhere, not a sign the first token matters most.",
    "**Why the cache exists.** The new token's query must meet the key of every earlier position at every "
    "layer. Those keys (and values) never change, so the KV cache keeps them and each step computes only the "
    "new token's own.",
    "**A raw lens.** This is the plain logit lens: each layer's state through the model's own final norm and "
    "head. It is not a tuned lens (a trained translator per layer, which this app does not have).",
)


def lessons(view: InsideView) -> tuple[str, ...]:
    """What the view teaches, in the app's words, true to the model it shows."""
    total = bytes_read(view)[2]
    head = (f"**The LM head is {view.head_bytes / total:.0%} of the bytes.** One matrix of vocabulary × hidden "
            f"size ({nbytes(view.head_bytes)}) turns the last state into a score for every token, and each step "
            "reads all of it, while each of the layers is much smaller." if total else "")
    return (echo_lesson(view), *LESSONS, *((head,) if head else ()))
