"""The server's own forward-pass scheduler, live: the KV cache & speed page's batching lesson
seen on the visitors using this server right now."""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from engine import LoadedModel
from engine.serving import BATCHING_ENV, PackedDifference, SchedulerStats, exact_rows_kernel_in_use, packed_pass_path
from ui.charts import CHART_CONFIG
from ui.keys import KV
from ui.measurement_board import MeasurementBoard
from ui.model import current_scheduler
from ui.theme import axis_colours, current_theme, layout_colours

REFRESH_S = 2.0  # the live panel redraws itself this often


@st.cache_resource
def measurement_board() -> MeasurementBoard:
    """The server's one board of speed measurements, shared by every visitor (ui/measurement_board.py)."""
    return MeasurementBoard()


def tokens_served() -> int:
    """Tokens the current model's scheduler has made for visitors since the server started."""
    return current_scheduler().stats().tokens


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


@st.fragment(run_every=REFRESH_S)
def live_scheduler() -> None:
    """What the shared scheduler is doing now (redrawn every REFRESH_S seconds)."""
    stats = current_scheduler().stats()
    cols = st.columns(4)
    window = f"{stats.window_s:.0f} s"
    cols[0].metric(f"visitors, last {window}", stats.visitors,
                   help=f"generations that had a forward pass in the last {window}")
    cols[1].metric(f"tokens / s, last {window}", f"{stats.tokens_per_s:.1f}",
                   help=f"next tokens delivered to every visitor together over the last {window}")
    recent = stats.recent_batches
    cols[2].metric("mean visitors per pass", f"{sum(recent) / len(recent):.1f}" if recent else "–",
                   help=f"over the latest {len(recent)} passes")
    cols[3].metric("waiting now", stats.waiting, help="forward passes queued behind the one running")
    if recent:
        st.plotly_chart(recent_batches_figure(stats), config=CHART_CONFIG, key=KV.live_batches)
    else:
        st.caption("No forward pass yet: step a generation on the Step-through page (in another tab) and "
                   "watch it appear here.")


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
    if lm.device.type != "cpu":
        return f"On this server's {lm.device.type} device there is {packed_pass_path(lm)}."
    if exact_rows_kernel_in_use(lm):
        return ("The order is no mystery: on this CPU a single row's product adds its products in four interleaved "
                "running sums, then combines them, and the exact batching adds up every row of the batch in that "
                "same order (checked bit for bit when the server started).")
    return "The exact batching multiplies each row on its own, through the very kernel a lone pass uses."


def server_batching(lm: LoadedModel, differences: tuple[PackedDifference, PackedDifference]) -> None:
    """The batching section's live part: this server's scheduler, and what each way of batching
    does to the numbers (`differences`: the exact and the fast packed pass against lone passes)."""
    st.subheader("This server, batching its visitors now")
    mode = current_scheduler().stats().batching
    st.markdown(
        "Every visitor's forward pass on this server goes through one queue. One worker runs one pass at a time "
        f"and {MODES[mode]}. The steps of all visitors who pressed Step while the previous pass ran go through "
        "the model together, as one sequence of their newest tokens, each attending only to its own KV cache. A "
        "visitor alone always gets the plain single-sequence pass.")
    live_scheduler()
    exact, fast = differences
    st.markdown(
        f"**Does batching change your numbers?** Measured just now: {fast.batch} sequences decoded {fast.steps} "
        "tokens together, each row's logits compared with the same sequence's lone pass. Each row added up in "
        "its lone order (this server's *exact* batching) the largest difference in any logit was "
        f"**{exact.max_logit_diff:.1g}**. In "
        f"one matrix product for all rows (*fast*) it was **{fast.max_logit_diff:.1e}** in a logit and "
        f"**{fast.max_prob_diff:.1e}** in a probability, and the most probable token changed in "
        f"{fast.argmax_flips} of {fast.rows} rows: a matrix product adds up a batch in another order than a "
        "single row, so the last bits of a float can differ, and a probability sitting on a rounding edge could "
        f"show its 4th decimal one apart. {how_exact_adds_up(lm)} The server's operator chooses with "
        f"`{BATCHING_ENV}=exact` (the default), `fast` (the library's own batch product) or `off`.")
