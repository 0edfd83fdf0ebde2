"""Same prompt, different answers: the page's pure pieces. The step-by-step chart and table of one
run in company against the lone run, the texts side by side with their divergence marked, and the
sentences that say what the numbers show, each written so its numbers cannot contradict it. No
Streamlit here."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
import torch

from engine import LoadedModel, visible
from engine.serving import CompanyRun, DeterminismResult, LoneRun, ProductOrder, SumOrder, packed_pass_path
from ui.views.format import esc, sr_only
from ui.views.kv_speed import how_exact_adds_up
from ui.views.theme import LIGHT, ChartTheme, axis_colours, layout_colours

MARGIN_COLOUR = "#6baed6"  # the lone run's top-two margin: the distance a change must cross
FAST_COLOUR = "#e8590c"  # the ordinary batched product's change
CLOSEST = 5  # the lone run's nearest ties listed
DIVERGED_CSS = ("<style>.tbt-det-texts{display:grid;grid-template-columns:repeat(auto-fit,minmax(16rem,1fr));gap:.8rem}"
                ".tbt-det-text{border:1px solid var(--tbt-rule);border-radius:.4rem;padding:.5rem .7rem;"
                "white-space:pre-wrap;overflow-wrap:anywhere}.tbt-det-text :is(h2,h3){margin:0 0 .3rem;font-size:.9rem;"
                "padding:0}.tbt-det-text .tbt-det-same{color:var(--tbt-muted)}"
                ".tbt-det-diverged{color:var(--tbt-bad);font-weight:600;text-decoration:underline wavy;"
                "text-underline-offset:3px}</style>")


def kernel_lines(lm: LoadedModel) -> dict[str, str]:
    """Which kernel each mode's packed pass used on this machine, in a sentence each."""
    library = "torch matrix product" + (" (MKL)" if torch.backends.mkl.is_available() else "")
    return {
        "exact": f"**Exact**, through {packed_pass_path(lm, True)}. {how_exact_adds_up(lm)}",
        "fast": f"**Fast**, through {packed_pass_path(lm, False)}: one {library} per layer for all the rows, in the "
                "order that product chooses for the batch's shape.",
    }


def texts_html(lm: LoadedModel, lone: LoneRun, runs: Sequence[tuple[str, CompanyRun]], level: int = 3) -> str:
    """The lone run's text and each run's, side by side, each under a heading of `level` (the
    page's next); a run's tokens from its first difference with the lone run on are marked (and
    said so to a screen reader)."""
    panels = [_text_panel(lm, "Alone", lone.token_ids, None, level)]
    panels += [_text_panel(lm, title, run.token_ids, run.first_divergence, level) for title, run in runs]
    return DIVERGED_CSS + f'<div class="tbt-det-texts">{"".join(panels)}</div>'


def _text_panel(lm: LoadedModel, title: str, ids: Sequence[int], diverged: int | None, level: int) -> str:
    decode = lm.tokenizer.decode
    if diverged is None:
        note = "" if title == "Alone" else " · same as alone"
        return f'<div class="tbt-det-text"><h{level}>{esc(title)}{note}</h{level}>{esc(decode(list(ids)))}</div>'
    same, rest = decode(list(ids[:diverged])), decode(list(ids[diverged:]))
    return (f'<div class="tbt-det-text"><h{level}>{esc(title)} · differs from token {diverged + 1}</h{level}>'
            f'<span class="tbt-det-same">{esc(same)}</span>{sr_only(" (from here it differs:) ")}'
            f'<span class="tbt-det-diverged">{esc(rest)}</span></div>')


def step_table(lm: LoadedModel, result: DeterminismResult, index: int) -> pd.DataFrame:
    """Run `index` in both modes, step by step, against the lone run."""
    exact, fast = result.exact.runs[index], result.fast.runs[index]
    rows = []
    for step, lone in enumerate(result.lone.steps):
        rows.append({
            "token": step + 1, "alone picks": token_text(lm, lone.token_id), "top-two margin": f"{lone.margin:.4f}",
            "exact: largest change": _change(exact.steps[step].max_abs_logit_diff),
            "exact picks": _pick(lm, exact.steps[step].token_id, exact.steps[step].differs),
            "fast: largest change": _change(fast.steps[step].max_abs_logit_diff),
            "fast picks": _pick(lm, fast.steps[step].token_id, fast.steps[step].differs),
        })
    return pd.DataFrame(rows)


def token_text(lm: LoadedModel, token_id: int) -> str:
    return visible(lm.tokenizer.decode([token_id]))


def _change(diff: float | None) -> str:
    return "— (contexts differ)" if diff is None else ("0" if diff == 0 else f"{diff:.1e}")


def _pick(lm: LoadedModel, token_id: int, differs: bool) -> str:
    return token_text(lm, token_id) + (" ✗ differs" if differs else "")


def step_figure(result: DeterminismResult, index: int, theme: ChartTheme = LIGHT, height: int = 340) -> go.Figure:
    """Per token, on a log scale: the lone run's top-two margin (a flip needs a change of half of it
    in two logits) and how far the fast run's logits moved; the exact run's moved 0."""
    fast = result.fast.runs[index]
    tokens = list(range(1, result.tokens + 1))
    figure = go.Figure(layout=layout_colours(theme))
    figure.add_bar(x=tokens, y=[step.margin for step in result.lone.steps], name="top-two margin, alone",
                   marker_color=MARGIN_COLOUR, hovertemplate="token %{x}: margin %{y:.4f}<extra></extra>")
    compared = [(t, s.max_abs_logit_diff) for t, s in zip(tokens, fast.steps, strict=True)
                if s.max_abs_logit_diff is not None and s.max_abs_logit_diff > 0]
    figure.add_scatter(x=[t for t, _ in compared], y=[d for _, d in compared], mode="lines+markers",
                       name="largest logit change, fast", marker_color=FAST_COLOUR, line_color=FAST_COLOUR,
                       hovertemplate="token %{x}: change %{y:.1e}<extra></extra>")
    if (flip := fast.first_divergence) is not None:
        figure.add_vline(x=flip + 1, line_dash="dash", line_color=theme.muted,
                         annotation_text=f"fast flips at token {flip + 1}", annotation_font_color=theme.text)
    exact_note = "exact: 0 at every token" if result.exact.runs[index].max_abs_logit_diff == 0 else \
        f"exact: up to {result.exact.runs[index].max_abs_logit_diff:.1e}"
    figure.update_yaxes(type="log", title_text="logits (log scale)", exponentformat="power")
    figure.update_xaxes(title_text="new token", dtick=max(1, result.tokens // 12))
    figure.update_xaxes(axis_colours(theme))
    figure.update_yaxes(axis_colours(theme))
    figure.update_layout(title_text=f"Run {index + 1}: how far each step was from a flip ({exact_note})",
                         height=height, margin={"l": 10, "r": 10, "t": 50, "b": 10}, bargap=0.3,
                         legend={"orientation": "h", "y": -0.25, "font": {"color": theme.text}})
    return figure


def verdict(result: DeterminismResult) -> str:
    """What the repeated experiment found, in both modes, in a paragraph."""
    exact, fast = result.exact, result.fast
    flips = [d for d in fast.first_divergence if d is not None]
    exact_words = (f"**exact**: {_completions(exact.distinct_completions)} in {result.runs} runs, every logit "
                   "bit for bit the lone run's (largest change **0**)" if exact.max_abs_logit_diff == 0 else
                   f"**exact**: {_completions(exact.distinct_completions)} in {result.runs} runs, logits moved by up "
                   f"to {exact.max_abs_logit_diff:.1e} (no packed pass on this device keeps the lone digits)")
    fast_words = (f"**fast**: {_completions(fast.distinct_completions)}, logits moved by up to "
                  f"**{fast.max_abs_logit_diff:.1e}**")
    if flips:
        fast_words += (f"; {len(flips)} of {result.runs} runs left the lone run's text, first at token "
                       f"{min(flips) + 1}")
    else:
        fast_words += ", and no greedy token flipped" if result.lone.sampling is None else ", and no draw moved"
    return f"{exact_words}; {fast_words}."


def _completions(count: int) -> str:
    return "**1 completion**" if count == 1 else f"**{count} different completions**"


def precision_line(result: DeterminismResult) -> str:
    """How finely float32 and bfloat16 hold a logit the size of this run's top ones: the step
    between neighbouring numbers there."""
    top = float(result.lone.logits.max(dim=-1).values.abs().median())
    steps = {dtype: 2.0 ** math.floor(math.log2(top)) * torch.finfo(dtype).eps for dtype in (torch.float32,
                                                                                              torch.bfloat16)}
    return (f"this is a small model in float32, where a logit near {top:.0f} (this run's top ones) is held to steps "
            f"of **{steps[torch.float32]:.1e}**; in bfloat16, which large services run, the step there is "
            f"**{steps[torch.bfloat16]:.3g}**, {steps[torch.bfloat16] / steps[torch.float32]:,.0f}× coarser, and their "
            "answers run to hundreds of tokens")


def closest_calls(lm: LoadedModel, result: DeterminismResult, count: int = CLOSEST) -> list[str]:
    """The lone run's nearest ties, each with how much more the logits would have to move than fast
    batching moved them here (two logits each moving by d can close a margin of at most 2d)."""
    change = result.fast.max_abs_logit_diff
    order = sorted(range(result.tokens), key=lambda i: result.lone.steps[i].margin)[:count]
    lines = []
    for i in order:
        margin = result.lone.steps[i].margin
        if change > 0 and margin < 2 * change:
            needs = "within what fast batching moved the logits here: a flip can happen"
        elif change > 0:
            needs = f"a flip needs {margin / (2 * change):,.0f}× what fast batching moved them here"
        else:
            needs = "a flip needs a change fast batching never made here"
        lines.append(f"token {i + 1} ({token_text(lm, result.lone.steps[i].token_id)}): margin {margin:.2g}; {needs}")
    return lines


def sampled_closest(result: DeterminismResult) -> str | None:
    """Sampled runs: how near the lone run came to a moved draw, against the change fast batching
    made. Each step draws the same u in every run, and the bands are laid in order of probability.
    So a pick can move two ways: another token within 2d of its logit (every logit moving by at
    most d) swaps places with it; or, the order kept, an edge of its band moves onto u. Each
    probability changes by a factor within e^(±2d/T) (T the temperature), so an edge moves by at
    most e^(2d/T) - 1."""
    sampling = result.lone.sampling
    if sampling is None:
        return None
    change, steps = result.fast.max_abs_logit_diff, result.lone.steps
    edge = min(range(result.tokens), key=lambda i: steps[i].band_gap)
    rival = min(range(result.tokens), key=lambda i: steps[i].rival_gap)
    reach = math.expm1(2 * change / sampling.settings.temperature)
    can_move = steps[edge].band_gap < reach or steps[rival].rival_gap < 2 * change
    return (f"With sampling at temperature {sampling.settings.temperature:g} and seed {sampling.seed}, each step "
            "draws the same number u in every run, and a pick moves only if its band does. Nearest calls when your "
            f"prompt ran alone: a draw **{steps[edge].band_gap:.2e}** from the edge of its token's band (token "
            f"{edge + 1}), where the fast change can move an edge by at most **{reach:.1e}**; and a pick whose logit "
            f"was **{steps[rival].rival_gap:.2g}** from another token's (token {rival + 1}), which a change of "
            f"**{2 * change:.1e}** could swap. "
            + ("So a draw could move here." if can_move else "So no draw could move here."))


def sum_line(example: SumOrder) -> str:
    """The three-number example in words, its numbers computed on the spot."""
    return (f"In {example.dtype}: ({_num(example.a)} + {_num(example.b)}) + {_num(example.c)} = "
            f"**{_num(example.left)}**, but {_num(example.a)} + ({_num(example.b)} + {_num(example.c)}) = "
            f"**{_num(example.right)}**.")


def _num(value: float) -> str:
    return f"{value:.9g}"


def product_line(example: ProductOrder) -> str:
    """One row of a real weight alone and in a batch, in words."""
    exact = ("" if example.exact_max_diff is None else
             " Through the exact rows kernel the same row in the same batch differs by "
             f"**{example.exact_max_diff:g}**.")
    return (f"The model's `{example.weight}` ({example.inputs} inputs × {example.outputs} outputs) applied to one "
            f"row alone, then to the same row inside a batch of {example.rows}: the batched product's outputs differ "
            f"in **{example.batched_outputs_differing} of {example.outputs}**, by up to "
            f"**{example.batched_max_diff:.1e}**." + exact)
