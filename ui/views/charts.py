"""Plotly figures shared by the pages: the next-token distribution and the KV cache growth.

Figures are kept lean (few traces, no toolbar) because they are redrawn on every step and
every slider move. They are written as plain Plotly JSON and wrapped without Plotly's property
validation (`unchecked_figure`): validating the distribution chart took 8-22 ms of every
slider move, more than re-sampling itself. The tests validate every figure's JSON instead.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go
import plotly.io as pio

from engine import Candidate, Distribution, StepRecord
from ui.views.format import pct, quoted
from ui.views.theme import ChartTheme, axis_colours, current_theme, layout_colours

RAW_COLOUR = "#6baed6"  # the model's own softmax, the same blue as the chips
FINAL_COLOUR = "#e8590c"  # the distribution the sampler actually draws from
RAW_NAME = "raw softmax (the model)"
FINAL_NAME = "final (after the sampler, drawn from)"
# Not colour alone: the final bars are striped as well as orange, in the chart and its legend
# (presentation mode's HTML bars draw the same stripes: FINAL_STRIPES)
FINAL_PATTERN = {"shape": "/", "fillmode": "overlay", "fgcolor": "#ffffff", "fgopacity": 0.55, "size": 7,
                 "solidity": 0.3}
FINAL_STRIPES = "repeating-linear-gradient(-45deg,rgba(255,255,255,.5) 0 2px,transparent 2px 6px)"
CUT = "cut"  # the value label of a token the sampler removed: its final bar has no length to show
MODES = ("probability", "log probability", "logit")
CHART_CONFIG = {"displayModeBar": False}


def unchecked_figure(data: list[dict], layout: dict) -> go.Figure:
    """A Figure from plain Plotly JSON, skipping Plotly's per-property validation (slow, and
    run again by every accessor). Properties must be written nested (`marker=dict(color=...)`,
    not `marker_color`); tests rebuild each figure with validation to catch a wrong name."""
    return JsonFigure({"data": data, "layout": _with_default_template(layout)})


def _with_default_template(layout: dict) -> dict:
    """The layout with Plotly's default template, as a Figure writes it into its layout."""
    default = pio.templates.default
    if "template" in layout or default is None:
        return layout
    template = _named_template(default) if isinstance(default, str) else default.to_plotly_json()
    return {"template": template, **layout}


@functools.cache
def _named_template(name: str) -> dict:
    # JSON of a registered template, made once and shared by every figure (only serialised)
    return pio.templates[name].to_plotly_json()


class JsonFigure(go.Figure):
    """A Figure that stays its plain Plotly JSON until something asks for more than that JSON.

    `st.plotly_chart` reads a Figure only through `to_dict()`. Building the Figure's objects
    (even unvalidated) and deep-copying them back out was a tenth of a Step click's page
    script under load (`bench.ui_bench`). So the objects are built on first
    use of anything else (`figure.data`, `update_layout`, ...), and until then `to_dict()`
    returns the JSON itself, which its callers only serialise (it holds no numpy arrays, so
    Plotly's base64 packing has nothing to do).
    """

    def __init__(self, spec: dict) -> None:  # go.Figure.__init__ runs on first use, in __getattr__
        object.__setattr__(self, "_spec", spec)
        object.__setattr__(self, "_built", False)

    def __getattr__(self, name: str) -> object:
        # reached only for what the instance lacks: until it is built, the Figure's own state
        if name.startswith("__") or object.__getattribute__(self, "_built"):
            raise AttributeError(name)
        object.__setattr__(self, "_built", True)
        go.Figure.__init__(self, self._spec, _validate=False)
        return getattr(self, name)

    def to_dict(self) -> dict:
        return super().to_dict() if self._built else self._spec


@dataclass(frozen=True)
class BarRows:
    """The rows of a distribution chart: the shown candidates, then all other tokens."""

    shown: tuple[Candidate, ...]
    others_count: int
    others_prob: float
    others_final_prob: float


def bar_rows(distribution: Distribution, top_n: int, pick_id: int | None = None) -> BarRows:
    """The top_n candidates by raw probability (plus the pick, wherever it ranks); every
    other token of the vocabulary is summed into one row."""
    shown = list(distribution.top[:top_n])
    if pick_id is not None and all(c.token_id != pick_id for c in shown):
        shown += [c for c in distribution.top if c.token_id == pick_id]
    hidden = [c for c in distribution.top if c not in shown]
    return BarRows(
        shown=tuple(shown),
        others_count=distribution.others_count + len(hidden),
        others_prob=distribution.others_prob + sum(c.prob for c in hidden),
        others_final_prob=distribution.others_final_prob + sum(c.final_prob for c in hidden),
    )


def _row_label(candidate: Candidate, pick_id: int | None) -> str:
    marker = "▶ " if candidate.token_id == pick_id else ""
    return f"{marker}#{candidate.rank} {quoted(candidate.text)}"


def distribution_figure(distribution: Distribution, pick_id: int | None = None, *,
                        mode: str = "probability", top_n: int = 10, height: int | None = None,
                        font_size: int = 13, theme: ChartTheme | None = None) -> go.Figure:
    """Horizontal bars for the next-token distribution: raw softmax and final sampling
    probability side by side (or raw logits), the pick's row highlighted, one row for all others.

    Args:
        distribution: a step's (or a resample's) distribution from the engine.
        pick_id: the token to highlight as the pick, if any.
        mode: one of MODES. "logit" shows the raw logits only (the rest has no single logit).
        top_n: candidates shown, by raw probability.
        theme: the colours of its text and grid; the visitor's theme if not given.
    """
    theme = theme or current_theme()
    if mode not in MODES:
        raise ValueError(f"mode = {mode!r} is not allowed: one of {', '.join(MODES)}.")
    rows = bar_rows(distribution, top_n, pick_id)
    labels = [_row_label(c, pick_id) for c in rows.shown]
    ids = [c.token_id for c in rows.shown]
    if mode == "logit":
        values = [c.logit for c in rows.shown]
        traces = [_bar("raw logit", labels, values, RAW_COLOUR, ids, [f"{v:.2f}" for v in values], font_size,
                       theme)]
        axis = dict(title=dict(text="raw logit (the model's score before the softmax)", standoff=4))
    else:
        labels.append(f"all other {rows.others_count:,} tokens")
        ids.append(-1)
        raw = [c.prob for c in rows.shown] + [rows.others_prob]
        final = [c.final_prob for c in rows.shown] + [rows.others_final_prob]
        log = mode == "log probability"
        traces = [_bar(RAW_NAME, labels, raw, RAW_COLOUR, ids, [pct(p) for p in raw], font_size, theme),
                  _bar(FINAL_NAME, labels, final, FINAL_COLOUR, ids,
                       [final_label(p, log) for p in final], font_size, theme, FINAL_PATTERN)]
        largest = max(raw + final)
        axis = dict(title=dict(text="probability" + (" (log scale)" if log else ""), standoff=4),
                    type="log" if log else "linear")
        if not log:
            axis.update(tickformat=".0%", range=[0, largest * 1.18])  # room for the labels outside the bars
    colours = layout_colours(theme)
    layout = dict(
        colours,
        barmode="group", bargap=0.2, bargroupgap=0.0,
        # rows, margins and the legend grow with the font so a projector's larger type still fits
        height=height or 3 * font_size + (2.3 * font_size + 4) * len(labels),
        margin=dict(l=4, r=4, t=int(3.2 * font_size), b=int(2.8 * font_size)),
        font=dict(colours["font"], size=font_size),
        # in the top margin
        legend=dict(colours["legend"], orientation="h", x=0, y=1.0, yanchor="top", yref="container"),
        uniformtext=dict(minsize=font_size - 2, mode="show"),
        yaxis=dict(axis_colours(theme), autorange="reversed", automargin=True, type="category"),
        xaxis=dict(axis_colours(theme), automargin=True, **axis),
    )
    layout["xaxis"]["title"] = dict(axis["title"], font=colours["font"])
    if pick_id in ids:
        layout["shapes"] = [_pick_band(ids.index(pick_id), theme)]
    return unchecked_figure(traces, layout)


def final_label(p: float, log: bool = False) -> str:
    """A final bar's value label: its percentage, or 'cut' where the sampler removed the token (on a
    log axis a zero has no place, so no label)."""
    if p > 0:
        return pct(p)
    return "" if log else CUT


def _pick_band(row: int, theme: ChartTheme) -> dict:
    """A highlight behind the picked token's row (category rows sit at 0, 1, 2, ...)."""
    return dict(type="rect", xref="paper", x0=0, x1=1, yref="y", y0=row - 0.5, y1=row + 0.5,
                fillcolor=theme.band, opacity=theme.band_opacity, line=dict(width=0), layer="below")


def _bar(name: str, labels: list[str], values: list[float], colour: str, ids: list[int],
         texts: list[str], font_size: int, theme: ChartTheme, pattern: dict | None = None) -> dict:
    marker = dict(color=colour, pattern=pattern) if pattern else dict(color=colour)
    return dict(type="bar", name=name, y=labels, x=values, orientation="h", marker=marker,
                text=texts, textposition="outside", cliponaxis=False, customdata=ids,
                # 'cut' in the muted colour (still 4.5:1): under greedy every row but the pick says it
                textfont=dict(size=font_size - 1, color=[theme.muted if t == CUT else theme.text for t in texts]
                              if CUT in texts else theme.text),
                hovertemplate="%{y}<br>" + name + ": %{text}<br>id %{customdata}<extra></extra>")


def kv_figure(steps: Sequence[StepRecord], height: int = 260, theme: ChartTheme | None = None) -> go.Figure:
    """KV cache positions (bars) and bytes (line) after each step's forward pass: a jump at
    step 1 (the whole prompt, prefill), then one position per step."""
    theme = theme or current_theme()
    x = [s.index for s in steps]
    traces = [
        dict(type="bar", name="positions held", x=x, y=[s.kv.positions for s in steps],
             marker=dict(color=RAW_COLOUR), hovertemplate="step %{x}: %{y} positions<extra></extra>"),
        dict(type="scatter", name="MiB", x=x, y=[s.kv.bytes / 1024 ** 2 for s in steps], yaxis="y2",
             mode="lines+markers", line=dict(color=FINAL_COLOUR),
             hovertemplate="step %{x}: %{y:.3f} MiB<extra></extra>"),
    ]
    colours = layout_colours(theme)

    def axis(title: str, **rest: object) -> dict:
        plain = axis_colours(theme)
        return dict(plain, title=dict(plain["title"], text=title), **rest)

    layout = dict(
        colours, height=height, margin=dict(l=8, r=8, t=8, b=8),
        legend=dict(colours["legend"], orientation="h", y=1.12, x=0),
        xaxis=axis("step", dtick=max(1, len(x) // 10) if x else 1),
        yaxis=axis("positions", rangemode="tozero"),
        yaxis2=axis("MiB", overlaying="y", side="right", rangemode="tozero", showgrid=False),
    )
    return unchecked_figure(traces, layout)


# ---- the charts in words, for a screen reader ------------------------------------------------


def distribution_words(distribution: Distribution, pick_id: int | None = None, *, mode: str = "probability",
                       top_n: int = 10) -> str:
    """What `distribution_figure` draws, row by row in the same numbers: a chart's text alternative."""
    rows = bar_rows(distribution, top_n, pick_id)
    pick = next((c for c in rows.shown if c.token_id == pick_id), None)

    def name(c: Candidate) -> str:
        return f"#{c.rank} {quoted(c.text)}" + (" (the pick)" if c.token_id == pick_id else "")

    if mode == "logit":
        values = [f"{name(c)}: raw logit {c.logit:.2f}" for c in rows.shown]
        what = "raw logits"
    else:
        log = mode == "log probability"
        values = [f"{name(c)}: raw {pct(c.prob)}, final {final_label(c.final_prob, log) or '0%'}" for c in rows.shown]
        values.append(f"all other {rows.others_count:,} tokens: raw {pct(rows.others_prob)}, final "
                      f"{final_label(rows.others_final_prob, log) or '0%'}")
        what = "raw softmax and final probability"
    picked = f" The pick is {quoted(pick.text)}." if pick is not None else ""
    return (f"Chart of the next-token distribution, the top {len(rows.shown)} tokens by raw probability, "
            f"{what}:{picked} " + "; ".join(values) + ".")


def kv_words(steps: Sequence[StepRecord]) -> str:
    """What `kv_figure` draws, in words: positions and MiB after each step (the first and the latest
    few when there are many)."""
    values = [f"step {s.index}: {s.kv.positions} positions, {s.kv.bytes / 1024 ** 2:.3f} MiB" for s in steps]
    if len(values) > 6:
        values = [*values[:2], "…", *values[-3:]]
    each = "after each of its" if len(steps) > 1 else "after its"
    return f"Chart of the KV cache {each} {len(steps)} step{'s' * (len(steps) != 1)}: {'; '.join(values)}."


def _value(value: object) -> str:
    return f"{value:.3g}" if isinstance(value, float) else f"{value:,}" if isinstance(value, int) else str(value)


def _axis_title(layout: dict, axis: str) -> str:
    title = (layout.get(axis) or {}).get("title") or {}
    return title.get("text", "") if isinstance(title, dict) else str(title)


def _heatmap_words(trace: dict) -> str:
    """A heatmap in words: for each row, the column with the largest value."""
    rows = list(trace.get("z") or [])
    columns, names = list(trace.get("x") or []), list(trace.get("y") or [])
    best = []
    for name, row in zip(names, rows, strict=False):
        values = list(row)
        if values and columns:
            top = max(range(len(values)), key=lambda i: values[i])
            best.append(f"{name}: {columns[top]} ({_value(float(values[top]))})")
    return "the largest in each row: " + ", ".join(best) if best else ""


def _trace_words(trace: dict, layout: dict) -> str:
    """One trace of a figure in words: its name, then each category or point with its value (its
    value label where the chart writes one). A long line is its ends and its range."""
    if trace.get("type") == "heatmap":
        return _heatmap_words(trace)
    horizontal = trace.get("orientation") == "h"
    where, values = (trace.get("y"), trace.get("x")) if horizontal else (trace.get("x"), trace.get("y"))
    if where is None or values is None:
        return ""
    texts = trace.get("text")
    labels = list(texts) if isinstance(texts, list | tuple) and len(texts) == len(values) else None
    pairs = [(w, labels[i] if labels and labels[i] else _value(v)) for i, (w, v) in enumerate(zip(where, values,
                                                                                                strict=False))]
    if horizontal and (layout.get("yaxis") or {}).get("autorange") != "reversed":
        pairs.reverse()  # the rows as they read, top down: a horizontal bar chart's first category is at the bottom
    name = trace.get("name") or _axis_title(layout, "xaxis" if horizontal else "yaxis") or "values"
    if len(pairs) > 12:
        numbers = [v for v in values if isinstance(v, int | float)]
        ends = f"{_value(where[0])}: {pairs[0][1]}, …, {_value(where[-1])}: {pairs[-1][1]}"
        span = f" (from {_value(min(numbers))} to {_value(max(numbers))})" if numbers else ""
        return f"{name}, {len(pairs)} points: {ends}{span}"
    return f"{name}: " + ", ".join(f"{_value(w)} {v}" for w, v in pairs)


def figure_words(figure: go.Figure) -> str:
    """A teaching chart in words, read from the figure's own data: its title, each trace's values,
    its notes (a marked setting, a balance point)."""
    spec = figure.to_dict()
    layout = spec.get("layout", {})
    title = ((layout.get("title") or {}).get("text") or "a chart")
    axes = ", ".join(f"{name} {text}" for name, axis in (("across:", "xaxis"), ("up:", "yaxis"))
                     if (text := _axis_title(layout, axis)))
    traces = [words for trace in spec.get("data", []) if (words := _trace_words(trace, layout))]
    notes = [note["text"] for note in layout.get("annotations", []) if note.get("text")]
    return (f"Chart: {title}" + (f" ({axes})" if axes else "") + ". " + ". ".join(traces) + "."
            + (f" Marked: {', '.join(notes)}." if notes else ""))
