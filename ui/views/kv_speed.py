"""The KV cache & speed page's pure pieces: the chart of this server's latest forward passes,
the words for each way of batching, and what bounds a decode step in words that follow what was
measured on this device (a CPU's lesson is not a GPU's). No Streamlit here."""

from __future__ import annotations

import plotly.graph_objects as go

from engine import LoadedModel
from engine.serving import SchedulerStats, exact_rows_kernel_in_use, packed_pass_path, sum_order
from engine.speed import DecodeIntensity, DecodeReads, DeviceSpeed
from ui.views.theme import LIGHT, ChartTheme, axis_colours, layout_colours


def recent_batches_figure(stats: SchedulerStats, theme: ChartTheme = LIGHT) -> go.Figure:
    """Requests served by each of the latest forward passes, oldest on the left."""
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


# the orders the exact rows kernel can copy (engine/fast/exact_rows_kernel.cpp's header), in words
SUM_ORDER_WORDS = {
    "four lanes": "four interleaved running sums, then combines them",
    "sixteen fused lanes": "sixteen running sums with fused multiply-adds, then halves them pairwise",
}

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
        return (f"The order is no mystery: on this CPU a single row's product adds its products in "
                f"{SUM_ORDER_WORDS[sum_order()]}, and the exact batching adds up every row of the batch in that "
                "same order (checked bit for bit when the server started).")
    return "The exact batching multiplies each row on its own, through the very kernel a lone pass uses."


# ---- what bounds a decode step: words that follow the measurement ----------------------------

# Below this share of the device's measured bandwidth the step is not waiting on memory: on a CPU
# a batch-1 step reads at most of its memory speed; on a GPU a small model's step reaches a few
# per cent, its time spent launching and finishing many small kernels (docs/gpu.md)
MEMORY_BOUND_SHARE = 0.25


def memory_bound(device: DeviceSpeed, step: DecodeIntensity) -> bool:
    """Whether the measured step spends its time reading: it reaches a good share of the bandwidth
    the device was measured at, not merely a low FLOPs-per-byte ratio."""
    return step.achieved_bytes_per_s >= MEMORY_BOUND_SHARE * device.bytes_per_s


def bound_text(device: DeviceSpeed, step: DecodeIntensity) -> str:
    """What bounds the step, said from its FLOPs per byte and from how fast it actually read."""
    ratio = (f"A decode step at batch 1 does about **{step.flops_per_byte:.2f} FLOPs for every byte** it reads: each "
             f"weight is fetched once, used for one multiply and one add, and dropped. That is below the device's "
             f"{device.ridge_flops_per_byte:.1f}, ")
    if step.flops_per_byte >= device.ridge_flops_per_byte:
        return ratio.replace("That is below", "That is above") + "so the step is bound by **compute**."
    reading_ms = step.bytes / device.bytes_per_s * 1e3
    if memory_bound(device, step):
        return (ratio + "so the step is bound by **memory bandwidth**: the arithmetic units mostly wait for weights "
                "to arrive.")
    return (ratio + "so by its arithmetic it would wait on memory. **It does not, here**: reading its "
            f"{step.bytes / 2**20:,.0f} MiB at the device's measured {device.bytes_per_s / 1e9:,.0f} GB/s would take "
            f"{reading_ms:.2f} ms, and the step takes **{step.step_ms:.1f} ms**, "
            f"{100 * step.achieved_bytes_per_s / device.bytes_per_s:.0f}% of that speed. Its time goes to the work "
            "around the reads: starting each of its many small operations and waiting for each to finish (below).")


def reads_text(reads: DecodeReads, device_type: str) -> str:
    """How the step reads, against a plain read, in the device's own terms (the step its parts were
    set against: `reads.step`)."""
    step = reads.step
    each = ("each launched as a kernel of its own on the GPU and finished before the next can begin"
            if device_type == "cuda" else
            "each started, shared out among the CPU's threads and finished before the next can begin")
    products = reads.products_bytes_per_s
    start = (f"Measured the way the step reads, the weights come in at **{products / 1e9:.1f} GB/s**: "
             f"{100 * products / reads.read_bytes_per_s:.0f}% of a plain read, where one long read "
             f"streams on; the step reads them in {reads.product_calls} separate products, {each}. The whole step "
             f"reaches **{100 * reads.achieved_fraction:.0f}%** of the plain read; ")
    if not reads.parts_add_up:
        return start + (f"its parts, each timed on its own, took longer than the whole {step.step_ms:.1f} ms step this "
                        "time, so the split above is no measurement: the machine may be busy, press Measure again.")
    return start + (f"the rest of its {step.step_ms:.1f} ms is attention ({reads.attention_ms:.2f} ms) and "
                    f"**{reads.other_ms:.1f} ms** of everything else, each part measured above.")


def batch_one_text(reading_bound: bool) -> str:
    """Why batch 1 costs what it does, as this device's measured step says."""
    if reading_bound:
        return ("At batch 1 a decode step's cost is mostly **reading the weights**: each one is fetched from memory "
                "to make a single token, so the step is bound by memory bandwidth. With several sequences in the "
                "batch, each weight is read once and used for every sequence's token: the matrix–vector product "
                "becomes a skinny matrix–matrix product with more FLOPs per byte, so the time per token falls.")
    return ("At batch 1 a decode step's cost here is mostly **the work around the reads** (section 4): launching and "
            "finishing its many small operations, whatever their size. With several sequences in the batch that "
            "cost is paid once for all of them, and each weight is read once for every sequence's token, so the "
            "time per token falls almost in proportion to the batch.")
