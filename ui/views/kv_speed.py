"""The KV cache & speed page's pure pieces about this server's batching: the chart of its latest
forward passes and the words for each way of batching. No Streamlit here."""

from __future__ import annotations

import plotly.graph_objects as go

from engine import LoadedModel
from engine.serving import SchedulerStats, exact_rows_kernel_in_use
from ui.views.theme import axis_colours, current_theme, layout_colours


def recent_batches_figure(stats: SchedulerStats) -> go.Figure:
    """Requests served by each of the latest forward passes, oldest on the left."""
    theme = current_theme()
    figure = go.Figure(layout=layout_colours(theme))
    largest = max(stats.recent_batches)
    figure.add_bar(x=list(range(1 - len(stats.recent_batches), 1)), y=list(stats.recent_batches),
                   marker_color="#2f9e44", hovertemplate="%{y} visitors in this pass<extra></extra>")
    # ticks from the bars' own heights: a scale made for 32 showed only "0" beside bars of 1
    figure.update_yaxes(range=[0, largest + 0.5], title_text="visitors in the pass", dtick=max(1, -(-largest // 4)))
    figure.update_xaxes(title_text="pass (0 = the latest)")
    figure.update_xaxes(axis_colours(theme))
    figure.update_yaxes(axis_colours(theme))
    figure.update_layout(title_text=f"The server's latest {len(stats.recent_batches)} forward passes, since it started",
                         height=300, margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return figure


MODES = {
    "exact": "**batches** the decode steps that are waiting, adding up each visitor's row in exactly the order "
             "a lone pass adds it up (while reading each weight once for all of them), so every visitor's numbers "
             "are bit for bit what they would be alone",
    "fast": "**batches** the decode steps that are waiting in one matrix product per layer, so a visitor's "
            "numbers can differ from their lone values in the last digits (measured below)",
    "off": "runs every pass **alone**, one after another (no batching)",
}


def how_exact_adds_up(lm: LoadedModel) -> str:
    """How this server's exact batching keeps each row's lone order, in a sentence."""
    if exact_rows_kernel_in_use(lm):
        return ("The order is no mystery: on this CPU a single row's product adds its products in four interleaved "
                "running sums, then combines them, and the exact batching adds up every row of the batch in that "
                "same order (checked bit for bit when the server started).")
    return "The exact batching multiplies each row on its own, through the very kernel a lone pass uses."
