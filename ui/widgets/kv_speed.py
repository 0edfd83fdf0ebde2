"""The server's own forward-pass scheduler, live: the KV cache & speed page's batching lesson
seen on the visitors using this server right now."""

from __future__ import annotations

import streamlit as st

from engine import LoadedModel
from engine.serving import BATCHING_ENV, PackedDifference
from ui.server.model import current_scheduler
from ui.session.keys import KV
from ui.views.charts import CHART_CONFIG
from ui.views.kv_speed import MODES, how_exact_adds_up, recent_batches_figure

REFRESH_S = 2.0  # the live panel redraws itself this often


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
