"""KV cache & speed: what a decode step costs on this device, measured, and why."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import streamlit as st

from engine import LoadedModel
from engine.serving import measure_packed_difference
from engine.speed import (
    CachePoint,
    DecodeIntensity,
    Sizes,
    measure_batching,
    measure_cache_vs_recompute,
    measure_decode_intensity,
    measure_decode_reads,
    measure_device,
    measure_kv,
    measure_prefill_decode,
)
from ui.controllers import kv_speed as kv
from ui.server import REFRESH_AFTER_S, current_model, shared_board, tokens_served
from ui.session import KV
from ui.views import (
    batch_figure,
    batch_one_text,
    bound_text,
    cache_figure,
    kv_memory_figure,
    memory_bound,
    nbytes,
    prefill_decode_figure,
    ratio_figure,
    reads_text,
    roofline_figure,
)
from ui.widgets import current_theme, described_chart, embedded, ensure_app_frame, page_style, server_batching

S = st.session_state
T = TypeVar("T")
EMBED_CHART_HEIGHT = 330  # the cache chart in an embed's 450-pixel frame, under the buttons


def measured(lm: LoadedModel, what: str, run: Callable[[], T]) -> T:
    """The controller's measurement, on this server's board, waiting under a spinner."""
    return kv.measured(S, lm, what, run, shared_board(), tokens_served, st.spinner)


def header(lm: LoadedModel) -> Sizes:
    """Title, what is measured, and the buttons that measure more or again; returns the sizes."""
    page_style()
    st.title("KV cache & speed")
    if embedded():  # a course page's frame: the buttons and the first chart on its one screen
        return measure_buttons(lm, f"Measured now, on this machine ({lm.device}, "
                                   f"{str(lm.dtype).removeprefix('torch.')}): contexts up to {{longest}} tokens.")
    st.markdown(
        "Every number on this page is **measured now, on this machine** "
        f"(`{lm.device}`, {str(lm.dtype).removeprefix('torch.')}), with the loaded model "
        f"({lm.parameters / 1e6:.0f} M parameters). Each time is the fastest of a few repeats after a warm-up "
        "pass: other work on the machine can only slow a run down. Compare shapes and ratios rather than the last "
        "digit.")
    return measure_buttons(lm, "Now measuring contexts up to {longest} tokens.")


def measure_buttons(lm: LoadedModel, caption: str) -> Sizes:
    """The buttons that measure more or again, and `caption` (its {longest}: the longest context
    measured) beside them; returns the sizes to measure."""
    tier = kv.tier(S)
    more_help = "Contexts up to 1,024 tokens, a longer prompt, more repeats (about a minute on 2 CPU cores)"
    with st.container(horizontal=True, vertical_alignment="center"):
        if tier == "quick" and st.button("Measure more", key=KV.more, help=more_help):
            kv.measure_more(S)
        if st.button("Measure again", key=KV.again, help="Time everything afresh, for everyone on this server "
                     f"(results younger than {REFRESH_AFTER_S:.0f} s are kept)"):
            kv.measure_again(S, shared_board(), lm)
        sizes = kv.sizes(S, lm)
        st.caption(caption.format(longest=f"{max(sizes.cache_lengths):,}"))
    return sizes


def cache_glance(points: list[CachePoint]) -> None:
    """An embed's first screen: the cached and recomputed step against the context, and the three
    figures that say it (the section's words follow below)."""
    left, right = st.columns([3, 1])
    described_chart(cache_figure(points, theme=current_theme(), height=EMBED_CHART_HEIGHT), key=KV.cache_chart,
                    where=left)
    last = points[-1]
    right.caption(f"One step at {last.context_tokens:,} tokens of context:")
    right.metric("with the KV cache", f"{last.cached_ms:.1f} ms")
    right.metric("recomputing all", f"{last.recompute_ms:.1f} ms", delta=f"{last.ratio:.1f}× slower",
                 delta_color="off", delta_arrow="off")


def cache_section(lm: LoadedModel, sizes: Sizes) -> None:
    """Per-step time with and without the KV cache as the context grows, and their ratio."""
    points = measured(lm, "cache vs recompute", lambda: measure_cache_vs_recompute(lm, sizes.cache_lengths,
                                                                                    sizes.repeats))
    if embedded():
        cache_glance(points)
    st.header("1 · With the KV cache, or recompute everything?")
    st.markdown(
        "Attention at every layer needs a **key** and a **value** vector for every earlier position. They never "
        "change once computed, so the **KV cache** keeps them: each step feeds the model only the newest token. "
        "Without the cache, each step must push the **whole context** through all "
        f"{lm.geometry.layers} layers again. Both give the same logits; only the cost differs.")
    if embedded():  # the time chart is on the first screen already
        described_chart(ratio_figure(points, theme=current_theme()), key=KV.ratio_chart)
    else:
        left, right = st.columns([3, 2])
        described_chart(cache_figure(points, theme=current_theme()), key=KV.cache_chart, where=left)
        described_chart(ratio_figure(points, theme=current_theme()), key=KV.ratio_chart, where=right)
    first, last = points[0], points[-1]
    st.markdown(
        f"At **{last.context_tokens:,} tokens** of context: **{last.cached_ms:.1f} ms** per step with the cache, "
        f"**{last.recompute_ms:.1f} ms** without, **{last.ratio:.1f}× slower**. From {first.context_tokens:,} to "
        f"{last.context_tokens:,} tokens {kv.cached_trend(first.cached_ms, last.cached_ms)}, and the recomputed one "
        f"went from {first.recompute_ms:.1f} to {last.recompute_ms:.1f} ms. The cached step only reads a little "
        "more cache each time; recomputing redoes the whole context for every new token, so a whole answer costs "
        "roughly the square of its length.")


def prefill_section(lm: LoadedModel, sizes: Sizes) -> None:
    """Time per token when the prompt is read in one pass against one token per pass."""
    st.header("2 · Prefill against decode")
    st.markdown(
        "**Prefill** reads the whole prompt in one forward pass: all its positions go through each weight "
        "matrix together, a matrix–matrix product. **Decode** makes one token per pass, because each new token "
        "needs the one before it: a matrix–vector product that still reads every weight.")
    result = measured(lm, "prefill vs decode",
                      lambda: measure_prefill_decode(lm, sizes.prompt_tokens, sizes.decode_steps, sizes.repeats))
    left, right = st.columns([3, 2])
    described_chart(prefill_decode_figure(result, theme=current_theme()), key=KV.prefill_chart, where=left)
    right.metric(f"prefill: {result.prompt_tokens} tokens in one pass", f"{result.prefill_ms:.1f} ms")
    right.metric("prefill, per token", f"{result.prefill_ms_per_token:.2f} ms")
    right.metric("decode, per token", f"{result.decode_ms:.1f} ms",
                 delta=f"{result.ratio:.1f}× the prefill cost per token", delta_color="off", delta_arrow="off")


def memory_section(lm: LoadedModel) -> None:
    """KV bytes per position measured from real cache tensors, beside published models."""
    st.header("3 · How much memory the cache takes")
    snapshot = measured(lm, "KV cache size", lambda: measure_kv(lm, min(kv.KV_SAMPLE_POSITIONS, lm.context_window - 1)))
    per_position = snapshot.bytes // snapshot.positions
    st.markdown(
        f"Measured: a real cache holding **{snapshot.positions} positions** weighs **{snapshot.bytes:,} bytes**, "
        f"so **{per_position:,} bytes per position** ({nbytes(per_position)}). The formula agrees: "
        f"{snapshot.formula} = {snapshot.formula_bytes:,} bytes. Every layer keeps a key and a value for every "
        "KV head; models that share KV heads between attention heads (grouped-query attention: Llama-3, "
        "Mistral, Qwen2.5) keep far less than those that do not (Llama-2-7B).")
    positions = int(st.number_input("Context length (tokens)", 1, 131_072, 4_096, 256, key=KV.positions))
    rows = kv.kv_rows(lm, per_position)
    described_chart(kv_memory_figure(kv.kv_sizes(rows, positions), positions, theme=current_theme()),
                    key=KV.memory_chart)
    st.dataframe(kv.kv_table(rows, positions), hide_index=True,
                 column_config={"model": st.column_config.TextColumn(width="medium"),  # names whole at 1440 px
                                "source": st.column_config.TextColumn(width="large")})
    st.caption("Other models' shapes are from their published config.json files (named in the source column), in "
               "the dtype those configs store the weights in. The bundled model runs here in "
               f"{str(lm.dtype).removeprefix('torch.')}, dequantised from its GGUF file. Mistral-7B-v0.1 uses a "
               "4,096-token sliding window, so a rolling cache for it stops growing there. The cache grows "
               "with every sequence in a batch: 16 sequences need 16 times this.")


def intensity_section(lm: LoadedModel, sizes: Sizes) -> bool:
    """The decode step's FLOPs per byte against the device's measured balance point; whether the
    measured step spends its time reading (the batching section says why batch 1 costs what it does)."""
    st.header("4 · What bounds a decode step: compute or memory?")
    device = measured(lm, "device compute and bandwidth", lambda: measure_device(lm.device, lm.dtype))
    step = measured(lm, "one decode step",
                    lambda: measure_decode_intensity(lm, sizes.prompt_tokens, 2 * sizes.repeats + 1))
    st.markdown(
        f"**The device, measured just now:** a {device.matmul_size:,} × {device.matmul_size:,} matrix product in "
        f"{device.dtype} ran at **{device.flops_per_s / 1e9:,.1f} GFLOP/s**; copying "
        f"{device.copy_bytes // 2 // 2**20:,} MiB moved **{device.bytes_per_s / 1e9:,.1f} GB/s** (bytes read + "
        f"written). Their ratio, **{device.ridge_flops_per_byte:.1f} FLOPs per byte**, is the device's balance "
        "point: work that does fewer FLOPs per byte it reads waits on memory.")
    cols = st.columns(4)
    cols[0].metric("FLOPs per decode step", f"{step.flops / 1e6:,.0f} M", help="≈ 2 × parameters (a multiply and an "
                   "add per weight), plus attention over the context")
    cols[1].metric("bytes read per step", nbytes(step.bytes), help=f"weights {nbytes(step.weight_bytes)} + KV cache "
                   f"{nbytes(step.kv_bytes)} at {step.context_tokens} tokens")
    cols[2].metric("arithmetic intensity (FLOP/byte)", f"{step.flops_per_byte:.2f}",
                   delta=f"device balance {device.ridge_flops_per_byte:.1f}", delta_color="off", delta_arrow="off")
    cols[3].metric("achieved bandwidth", f"{step.achieved_bytes_per_s / 1e9:.1f} GB/s",
                   delta=f"{100 * step.achieved_bytes_per_s / device.bytes_per_s:.0f}% of the copy",
                   delta_color="off", delta_arrow="off",
                   help=f"bytes read ÷ measured step time ({step.step_ms:.1f} ms)")
    described_chart(roofline_figure(device, step, theme=current_theme()), key=KV.roofline_chart)
    st.markdown(bound_text(device, step))
    reads_section(lm, step, sizes)
    return memory_bound(device, step)


def reads_section(lm: LoadedModel, step: DecodeIntensity, sizes: Sizes) -> None:
    """How fast the step reads, against a plain read and its own products alone, and where the
    rest of its time goes: every part measured."""
    reads = measured(lm, "how the step reads", lambda: measure_decode_reads(lm, step, 2 * sizes.repeats + 1))
    step = reads.step  # the step its parts were set against: the board keeps the two results apart
    st.subheader("How close to memory speed is the step?")
    cols = st.columns(3)
    cols[0].metric("a plain read of memory", f"{reads.read_bytes_per_s / 1e9:.1f} GB/s",
                   help=f"summing {reads.read_bytes // 2**20:,} MiB: bytes read, nothing written")
    cols[1].metric("the step's products alone", f"{reads.products_bytes_per_s / 1e9:.1f} GB/s",
                   delta=f"{nbytes(reads.products_bytes)} in {reads.products_ms:.1f} ms", delta_color="off",
                   delta_arrow="off", help="one row through every weight, as the step multiplies, and nothing else")
    cols[2].metric("the whole step", f"{step.achieved_bytes_per_s / 1e9:.1f} GB/s",
                   delta=f"{100 * reads.achieved_fraction:.0f}% of the plain read", delta_color="off",
                   delta_arrow="off", help=f"bytes read ÷ the step's {step.step_ms:.1f} ms")
    st.dataframe(kv.step_parts(reads), hide_index=True)
    st.markdown(reads_text(reads, lm.device.type))
    st.caption(f"This server's lone decode steps take **{reads.path}**: {reads.reason}.")
    with st.expander("Every fast path this server has checked, and why it is used or not"):
        st.caption("Each fast path gives transformers' own numbers bit for bit, and is used only after a probe on "
                   "this machine has shown it. `python -m engine proofs` prints the same list from the command line.")
        st.dataframe(kv.proof_table(lm), hide_index=True)


def batch_section(lm: LoadedModel, sizes: Sizes, reading_bound: bool) -> None:
    """Time per token at batch 1, 4 and 16, and why batching helps (`reading_bound`: what section 4
    measured bounds a step here)."""
    st.header("5 · Batching: many sequences, one pass over the weights")
    points = measured(lm, "batched decode",
                      lambda: measure_batching(lm, (1, 4, 16), sizes.batch_context, sizes.repeats))
    left, right = st.columns([3, 2])
    described_chart(batch_figure(points, theme=current_theme()), key=KV.batch_chart, where=left)
    for point in points:
        right.metric(f"batch {point.batch}: one step", f"{point.step_ms:.1f} ms",
                     delta=f"{point.tokens_per_s:,.0f} tokens/s", delta_color="off", delta_arrow="off")
    one, most = points[0], points[-1]
    change = kv.batch_saving(one.per_token_ms, most.per_token_ms)
    st.markdown(
        f"Measured: **{one.per_token_ms:.1f} ms per token** at batch {one.batch}, **{most.per_token_ms:.1f} ms** at "
        f"batch {most.batch} ({change}). " + batch_one_text(reading_bound) + " One sequence cannot "
        "do this for itself, because its next token needs the token before it; servers batch different "
        "requests together (continuous batching). Each sequence still needs its own KV cache, so memory, and "
        "once the FLOPs per byte pass the device's balance point, compute, set the limit.")
    server_batching(lm, measured(lm, "packed vs lone passes", lambda: (measure_packed_difference(lm, exact=True),
                                                                       measure_packed_difference(lm, exact=False))))


def main() -> None:
    """The page, top to bottom."""
    ensure_app_frame()
    lm = current_model()
    sizes = header(lm)
    # filled once the sections below have their measurements; an embed's frame has no room above
    # its first chart, so there the note comes last
    taken_note = st if embedded() else st.empty()
    cache_section(lm, sizes)
    prefill_section(lm, sizes)
    memory_section(lm)
    reading_bound = intensity_section(lm, sizes)
    batch_section(lm, sizes, reading_bound)
    if note := kv.provenance(S.get(KV.taken, {})):
        taken_note.caption(note)

if __name__ == "__main__":  # Streamlit runs a page as __main__; an import only defines it
    main()
