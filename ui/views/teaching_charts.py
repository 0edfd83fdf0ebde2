"""Plotly figures for the teaching pages (Sampler lab, KV cache & speed, Lesson).

Large fonts and labelled axes with units: these are read from the back of a classroom.
Figures only draw what the engine measured or computed; they compute nothing themselves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import plotly.graph_objects as go
import torch

from engine.speed import BatchPoint, CachePoint, DecodeIntensity, DeviceSpeed, PrefillDecode
from ui.domain.sampler_lab import CutPoint, Outcome, TemperaturePoint
from ui.views.charts import FINAL_COLOUR, RAW_COLOUR
from ui.views.format import quoted
from ui.views.theme import LIGHT, ChartTheme, axis_colours, layout_colours

FONT = 16
# A blue-green, not a green, beside the orange: the two stay apart for red-green colour-blind
# eyes (tests/ui/test_colour_vision.py)
SETTING_COLOURS = (FINAL_COLOUR, "#0ca678", "#7048e8")  # settings A, B, C
CHAIN_COLOURS = {"transformers": "#e8590c", "vllm": "#1971c2", "llama.cpp": "#0ca678"}
CACHED_COLOUR, RECOMPUTE_COLOUR = "#1971c2", "#c92a2a"


def _layout(figure: go.Figure, theme: ChartTheme, title: str, x_title: str, y_title: str,
            height: int = 420) -> go.Figure:
    """Shared look; sizes are set on every part because Streamlit's chart theme sets its own.
    Colours follow `theme` (the visitor's): transparent backgrounds, text and reference lines in
    the theme's text colours."""
    figure.update_layout(layout_colours(theme))
    figure.update_layout(
        # the title at the top, the legend under it: in a half-width chart the legend takes two lines
        title={"text": title, "font": {"size": FONT + 4}, "yref": "container", "y": 1, "yanchor": "top",
               "pad": {"t": 8}},
        height=height, font={"size": FONT}, margin={"l": 10, "r": 10, "t": 110, "b": 10},
        # under the title, above the plot: below it, the legend sat on the x axis's title
        legend={"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom", "font": {"size": FONT}})
    figure.update_xaxes(axis_colours(theme))
    figure.update_yaxes(axis_colours(theme))  # a second y axis too
    for axis, text in (("xaxis", x_title), ("yaxis", y_title)):  # primary axes; a second y axis keeps its own
        figure.update_layout({axis: {"title": {"text": text, "font": {"size": FONT}}, "tickfont": {"size": FONT},
                                     "showgrid": True, "zeroline": False}})
    figure.update_annotations(font={"size": FONT, "color": theme.text})
    figure.update_shapes(line_color=theme.muted)  # reference lines (add_vline, add_hline)
    figure.update_traces(textfont_color=theme.text, selector={"type": "bar"})  # value labels outside the bars
    return figure


def token_labels(texts: Mapping[int, str], logits: torch.Tensor, token_ids: Sequence[int]) -> list[str]:
    """'#rank 'text'' for each token (rank by raw logit, 1 = most probable): unique and short."""
    return [f"#{int((logits > logits[i]).sum()) + 1} {quoted(texts[i])}" for i in token_ids]


# ---- Sampler lab --------------------------------------------------------------------------

def _grouped_bars(figure: go.Figure, theme: ChartTheme, token_ids: Sequence[int], title: str,
                  x_title: str) -> go.Figure:
    figure.update_layout(barmode="group", bargap=0.2, bargroupgap=0.05,
                         legend={"traceorder": "reversed"})  # legend top-down matches the bars
    figure.update_xaxes(range=[0, 1.05])
    return _layout(figure, theme, title, x_title, "", height=190 + 64 * len(token_ids))


def settings_figure(labels: list[str], raw_probs: torch.Tensor, token_ids: Sequence[int],
                    outcomes: Sequence[tuple[str, Outcome]], picks: Sequence[str], *,
                    theme: ChartTheme = LIGHT) -> go.Figure:
    """Horizontal bars: the raw softmax and each setting's final probability per token;
    each setting's pick is named in the legend."""
    figure = go.Figure()
    rows = list(reversed(labels))  # the most probable at the top
    figure.add_bar(y=rows, x=[float(raw_probs[i]) for i in reversed(token_ids)], orientation="h",
                   name="raw softmax (the model)", marker_color=RAW_COLOUR)
    for (name, outcome), pick, colour in zip(outcomes, picks, SETTING_COLOURS, strict=False):
        figure.add_bar(y=rows, x=[float(outcome.chain.final_probs[i]) for i in reversed(token_ids)],
                       orientation="h", name=f"{name}: final (picks {pick})", marker_color=colour)
    return _grouped_bars(figure, theme, token_ids, "Same logits, different samplers", "probability (0–1)")


def temperature_figure(points: Sequence[TemperaturePoint], marked: float, *, theme: ChartTheme = LIGHT) -> go.Figure:
    """Entropy (bits, left axis) and the top token's probability (right axis) against T."""
    temps = [p.temperature for p in points]
    figure = go.Figure()
    figure.add_scatter(x=temps, y=[p.entropy_bits for p in points], name="entropy (bits)",
                       line={"color": "#7048e8", "width": 4})
    figure.add_scatter(x=temps, y=[p.top_prob for p in points], name="top token's probability",
                       line={"color": FINAL_COLOUR, "width": 4}, yaxis="y2")
    figure.add_vline(x=marked, line_dash="dash",
                     annotation_text=f"T = {marked:g}", annotation_font_size=FONT)
    figure.update_layout(yaxis2={"title": {"text": "top token's probability (0–1)", "font": {"size": FONT}},
                                 "overlaying": "y", "side": "right", "range": [0, 1.05], "tickfont": {"size": FONT},
                                 "tickvals": [0, 0.2, 0.4, 0.6, 0.8, 1.0], "showgrid": False})
    figure.update_layout(yaxis={"rangemode": "tozero"})
    return _layout(figure, theme, "Temperature reshapes the whole distribution", "temperature T",
                   "entropy (bits)")


def cut_figure(points: Sequence[CutPoint], setting: str, marked: float, log_x: bool = False, *,
               theme: ChartTheme = LIGHT) -> go.Figure:
    """Tokens kept (log scale) against a top-p or min-p setting."""
    figure = go.Figure()
    hover = ("min-p %{x:.3g}: keeps %{y:,} tokens<br>cuts below p = %{customdata:.3g}<extra></extra>"
             if setting == "min-p" else "top-p %{x:.3g}: keeps %{y:,} tokens<extra></extra>")
    figure.add_scatter(x=[p.value for p in points], y=[p.kept for p in points], mode="lines+markers",
                       customdata=[p.threshold for p in points], hovertemplate=hover,
                       line={"color": "#1971c2", "width": 4, "shape": "hv"}, name="tokens kept")
    figure.add_vline(x=marked, line_dash="dash",
                     annotation_text=f"{setting} = {marked:g}", annotation_font_size=FONT)
    figure.update_yaxes(type="log")
    if log_x:
        figure.update_xaxes(type="log")
    title = "Nucleus size against p" if setting == "top-p" else "Tokens left after the min-p cut"
    return _layout(figure, theme, title, setting, "tokens kept (log scale)", height=380)


def chains_figure(labels: list[str], token_ids: Sequence[int], outcomes: Mapping[str, Outcome],
                  picks: Mapping[str, str], *, theme: ChartTheme = LIGHT) -> go.Figure:
    """Final probability per token under each engine's chain order; picks named in the legend."""
    figure = go.Figure()
    rows = list(reversed(labels))
    for name, outcome in outcomes.items():
        figure.add_bar(y=rows, x=[float(outcome.chain.final_probs[i]) for i in reversed(token_ids)],
                       orientation="h", name=f"{name} (picks {picks[name]})", marker_color=CHAIN_COLOURS[name])
    return _grouped_bars(figure, theme, token_ids, "One set of settings, three chain orders", "final probability (0–1)")


def draws_figure(labels: list[str], token_ids: Sequence[int], counts: Mapping[int, int], total: int,
                 final_probs: torch.Tensor, *, theme: ChartTheme = LIGHT) -> go.Figure:
    """Share of draws per token (bars) against the final probability (diamonds)."""
    figure = go.Figure()
    figure.add_bar(x=labels, y=[counts.get(i, 0) / total for i in token_ids], name=f"share of {total:,} draws",
                   marker_color="#868e96")
    figure.add_scatter(x=labels, y=[float(final_probs[i]) for i in token_ids], mode="markers",
                       name="final probability", marker={"symbol": "diamond", "size": 16, "color": FINAL_COLOUR})
    figure.update_xaxes(tickangle=-35)
    _layout(figure, theme, f"{total:,} draws against the distribution they come from", "token",
            "share of draws / probability", height=480)
    # legend above the plot: the slanted token labels need the space below
    figure.update_layout(legend={"y": 1.0, "yanchor": "bottom", "x": 1.0, "xanchor": "right"},
                         margin={"l": 40, "t": 90})
    return figure


# ---- KV cache & speed ---------------------------------------------------------------------

def cache_figure(points: Sequence[CachePoint], *, theme: ChartTheme = LIGHT, height: int = 420) -> go.Figure:
    """Per-step time with and without the cache against context length, `height` pixels tall."""
    lengths = [p.context_tokens for p in points]
    figure = go.Figure()
    figure.add_scatter(x=lengths, y=[p.recompute_ms for p in points], name="no cache: recompute the whole context",
                       mode="lines+markers", line={"color": RECOMPUTE_COLOUR, "width": 4}, marker={"size": 10})
    figure.add_scatter(x=lengths, y=[p.cached_ms for p in points], name="with the KV cache: one new token",
                       mode="lines+markers", line={"color": CACHED_COLOUR, "width": 4}, marker={"size": 10})
    figure.update_yaxes(rangemode="tozero")
    return _layout(figure, theme, "Time for one new token as the context grows", "context length (tokens)",
                   "time per step (ms)", height=height)


def ratio_figure(points: Sequence[CachePoint], *, theme: ChartTheme = LIGHT) -> go.Figure:
    """How many times slower recomputing is, per context length."""
    figure = go.Figure()
    figure.add_bar(x=[f"{p.context_tokens:,}" for p in points], y=[p.ratio for p in points],
                   text=[f"{p.ratio:.1f}×" for p in points], textposition="outside", marker_color=RECOMPUTE_COLOUR,
                   textfont={"size": FONT}, cliponaxis=False)
    figure.add_hline(y=1, line_dash="dot")
    figure.update_xaxes(type="category")
    figure.update_yaxes(rangemode="tozero")
    return _layout(figure, theme, "Recompute ÷ cached", "context length (tokens)", "times slower (×)", height=380)


def prefill_decode_figure(result: PrefillDecode, *, theme: ChartTheme = LIGHT) -> go.Figure:
    """Time per token: reading the prompt in one pass against one token per pass."""
    figure = go.Figure()
    values = [result.prefill_ms_per_token, result.decode_ms]
    figure.add_bar(x=[f"prefill ({result.prompt_tokens} tokens, one pass)", "decode (one token per pass)"],
                   y=values, text=[f"{v:.2f} ms" for v in values], textposition="outside",
                   marker_color=[CACHED_COLOUR, RECOMPUTE_COLOUR])
    figure.update_yaxes(rangemode="tozero")
    return _layout(figure, theme, "Time per token", "", "milliseconds per token", height=380)


def kv_memory_figure(sizes: Sequence[tuple[str, int]], positions: int, *, theme: ChartTheme = LIGHT) -> go.Figure:
    """KV-cache size of a whole context for each model: (label, bytes) pairs."""
    gib = [size / 2**30 for _, size in sizes]
    figure = go.Figure()
    figure.add_bar(y=[label for label, _ in reversed(sizes)], x=list(reversed(gib)), orientation="h",
                   text=[f"{g:.2f} GiB" if g >= 0.1 else f"{g * 1024:.1f} MiB" for g in reversed(gib)],
                   textposition="outside", marker_color="#1971c2")
    figure.update_xaxes(range=[0, max(gib) * 1.3])
    return _layout(figure, theme, f"KV cache for {positions:,} tokens of context, one sequence", "GiB", "",
                   height=120 + 50 * len(sizes))


def roofline_figure(device: DeviceSpeed, intensity: DecodeIntensity, *, theme: ChartTheme = LIGHT) -> go.Figure:
    """Attainable FLOP/s against arithmetic intensity (the roofline), with the decode step."""
    ridge = device.ridge_flops_per_byte
    peak = device.flops_per_s / 1e9
    xs = [min(0.05, intensity.flops_per_byte / 4), ridge, ridge * 200]
    ys = [min(peak, x * device.bytes_per_s / 1e9) for x in xs]
    achieved = intensity.achieved_flops_per_s / 1e9
    figure = go.Figure()
    figure.add_scatter(x=xs, y=ys, name="the most this device can do (measured)", mode="lines",
                       line={"color": theme.muted, "width": 4})
    figure.add_scatter(x=[intensity.flops_per_byte], y=[achieved], mode="markers",
                       name="one decode step, batch 1 (measured)", marker={"size": 20, "color": RECOMPUTE_COLOUR})
    figure.add_vline(x=ridge, line_dash="dash")
    for x, text, anchor in ((ridge / 1.5, "← memory-bound", "right"), (ridge * 1.5, "compute-bound →", "left")):
        figure.add_annotation(x=math.log10(x), y=math.log10(peak * 2.2), text=text, showarrow=False,
                              xanchor=anchor, font={"size": FONT})
    low = min(ys[0], achieved) / 3
    figure.add_annotation(x=math.log10(ridge * 1.15), y=math.log10(low * 1.6), text=f"balance point {ridge:.1f}",
                          showarrow=False, xanchor="left", font={"size": FONT})
    figure.update_xaxes(type="log", dtick=1, range=[math.log10(xs[0]), math.log10(xs[-1])])
    figure.update_yaxes(type="log", dtick=1, range=[math.log10(low), math.log10(peak * 4)])
    return _layout(figure, theme, "Memory-bound or compute-bound?", "arithmetic intensity (FLOPs per byte read)",
                   "GFLOP/s")


def batch_figure(points: Sequence[BatchPoint], *, theme: ChartTheme = LIGHT) -> go.Figure:
    """Time per token for each batch size."""
    figure = go.Figure()
    figure.add_bar(x=[f"batch {p.batch}" for p in points], y=[p.per_token_ms for p in points],
                   text=[f"{p.per_token_ms:.1f} ms" for p in points], textposition="outside", marker_color="#2f9e44")
    figure.update_yaxes(rangemode="tozero")
    return _layout(figure, theme, "Time per token, decoding several sequences at once", "", "milliseconds per token",
                   height=380)


# ---- Lesson -------------------------------------------------------------------------------

def top_values_figure(labels: list[str], values: Sequence[float], title: str, x_title: str,
                      colour: str = RAW_COLOUR, text: Callable[[float], str] = "{:.2f}".format, *,
                      theme: ChartTheme = LIGHT) -> go.Figure:
    """Horizontal bars for the leading tokens (first label at the top)."""
    figure = go.Figure()
    figure.add_bar(y=list(reversed(labels)), x=list(reversed(values)), orientation="h", marker_color=colour,
                   text=[text(v) for v in reversed(values)], textposition="outside")
    low = min(0.0, min(values))
    figure.update_xaxes(range=[low * 1.2, max(values) * 1.25])
    return _layout(figure, theme, title, x_title, "", height=110 + 42 * len(labels))
