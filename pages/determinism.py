"""Same prompt, different answers: why temperature 0 can still vary on a server, run live.

The page is layout only: what its form does is ui/controllers/determinism.py, and every number is
a real pass of the model through the server's queue (engine/serving/determinism.py).
"""

from __future__ import annotations

import streamlit as st
import torch

from engine import LoadedModel
from engine.serving import DeterminismResult, product_in_two_shapes, sum_in_two_orders
from ui.controllers import determinism as det
from ui.server import current_model, current_scheduler, shared_board, tokens_served
from ui.session import DETERMINISM as DET
from ui.views import (
    closest_calls,
    kernel_lines,
    precision_line,
    product_line,
    sampled_closest,
    step_figure,
    step_table,
    sum_line,
    texts_html,
    verdict,
)
from ui.widgets import current_theme, described_chart, ensure_app_frame, html, page_style, presenting

S = st.session_state
SERVER_BATCHING = {  # what this server does with its visitors' steps (TBT_BATCHING, docs/serving.md)
    "exact": "This server batches its visitors in exact mode: nobody's answer depends on who else is here.",
    "fast": "This server batches its visitors in fast mode: their last digits depend on who else is here.",
    "off": "This server runs every visitor's pass alone: nobody's answer depends on who else is here.",
}
PRESENTING_CHART_HEIGHT = 300  # presentation mode: the chart beside the texts on one 1280x720 screen


def header() -> None:
    st.title("Same prompt, different answers")
    if presenting():
        st.markdown("Temperature 0 picks the most likely token, so why can a server answer the same prompt "
                    "differently? Run it: the prompt alone, then batched with other visitors' requests.")
        return
    st.markdown(
        "Temperature 0 always picks the most likely token, so why can the same prompt give a different answer "
        "on a chat service tomorrow? Because a server does not run your request alone. Each new token needs the one "
        "before it, so a server keeps its processors busy by putting **many users' decode steps into one pass** "
        "(continuous batching). How the matrix products then add up your numbers depends on the batch's shape, "
        "**floating-point addition is not associative**, and your logits move in their last digits with whoever "
        "else was being served. Where two tokens are nearly tied, the pick flips, and every token after it "
        "differs. Below, your prompt runs alone and then inside batches of other sequences, with the ordinary "
        "batched product (**fast**) and with this server's batch-invariant one (**exact**): real passes, now.")


def experiment_form(lm: LoadedModel) -> None:
    """The experiment's settings and its Run button; a Run runs it here, with a progress bar."""
    det.init_defaults(S)
    with st.form(DET.form, border=True):
        st.text_area("Prompt (read as plain text, no chat template)", key=DET.prompt, height=68,
                     max_chars=2000)
        cols = st.columns(5)
        cols[0].number_input("Runs in each mode", key=DET.runs, min_value=det.RUNS[0], max_value=det.RUNS[1],
                             help="Each run meets fresh random company: a batch of 2 up to the largest batch, your "
                                  "prompt at a random row, the others' texts of random lengths.")
        cols[1].number_input("New tokens", key=DET.tokens, min_value=det.TOKENS[0], max_value=det.TOKENS[1])
        cols[2].number_input("Largest batch", key=DET.batch, min_value=det.BATCH[0], max_value=det.BATCH[1],
                             help="Rows in a packed pass, yours included")
        cols[3].number_input("Temperature (0: greedy)", key=DET.temperature, min_value=det.TEMPERATURE[0],
                             max_value=det.TEMPERATURE[1], step=0.1, format="%.1f")
        cols[4].number_input("Seed", key=DET.seed, min_value=det.SEED[0], max_value=det.SEED[1],
                             help="Chooses the company (and, above temperature 0, the draws): the same seed and "
                                  "settings give the same experiment")
        pressed = st.form_submit_button("Run the experiment", type="primary", key=DET.run)
    if pressed:
        bar = st.progress(0.0, text="Decoding alone…")

        def progress(done: int, total: int) -> None:
            bar.progress(done / total, text=f"{done} of {total} decodes ({'alone' if done == 1 else 'in company'})")

        det.run(S, lm, shared_board(), run_pass=current_scheduler().call, progress=progress, waiting=st.spinner,
                served=tokens_served)
        bar.empty()
    if error := S.get(DET.error):
        st.error(error)


def findings(lm: LoadedModel, result: DeterminismResult) -> None:
    """The repeated experiment's answer beside the published one."""
    published = det.PUBLISHED
    cols = st.columns(3)
    cols[0].metric("exact: completions", f"{result.exact.distinct_completions} of {result.runs}",
                   help="Runs in company with this server's batch-invariant products")
    cols[1].metric("fast: completions", f"{result.fast.distinct_completions} of {result.runs}",
                   help="Runs in company with the ordinary batched product")
    cols[2].metric("published, ordinary kernels", f"{published.distinct} of {published.runs:,}",
                   delta=f"first divergence at token {published.first_divergence}", delta_color="off",
                   delta_arrow="off", help=f"{published.source}: {published.model}")
    st.markdown(verdict(result))


def step_section(lm: LoadedModel, result: DeterminismResult) -> None:
    """One run, token by token, and the texts side by side."""
    st.header("1 · One run, token by token")
    index = det.shown_run(S, result)
    fast = result.fast.runs[index]
    if result.runs > 1:
        st.selectbox("Run shown", list(range(result.runs)), key=DET.shown_run,
                     format_func=lambda i: f"run {i + 1}: batch of {result.fast.runs[i].batch}, your prompt at row "
                                           f"{result.fast.runs[i].row + 1}")
    st.markdown(
        f"In run {index + 1} your prompt shared every pass with {fast.batch - 1} other sequence(s) "
        f"({', '.join(str(n) for n in fast.company_lengths)} tokens of context when it began). The bars are "
        "how far the top token was ahead of the second when your prompt ran alone; the line is how far the "
        "fast pass moved any logit. A token flips only where two logits move by more than half the bar.")
    described_chart(step_figure(result, index, theme=current_theme()), key=DET.step_chart)
    html(run_texts(lm, result, index))
    with st.expander("Every token of this run, in numbers"):
        st.dataframe(step_table(lm, result, index), hide_index=True)


def projected(lm: LoadedModel, result: DeterminismResult) -> None:
    """Presentation mode's one screen: the chart of the run shown beside the three texts."""
    index = det.shown_run(S, result)
    left, right = st.columns([3, 2])
    described_chart(step_figure(result, index, theme=current_theme(), height=PRESENTING_CHART_HEIGHT),
                    key=DET.step_chart, where=left)
    with right:
        html(run_texts(lm, result, index, level=2))


def run_texts(lm: LoadedModel, result: DeterminismResult, index: int, level: int = 3) -> str:
    """Run `index`'s texts in both modes beside the lone run's, under headings of `level`."""
    return texts_html(lm, result.lone, [("In company, exact", result.exact.runs[index]),
                                        ("In company, fast", result.fast.runs[index])], level)


def repeated_section(lm: LoadedModel, experiment: det.Experiment, result: DeterminismResult) -> None:
    """All the runs, the published figure, and where a flip would have to happen."""
    st.header(f"2 · {result.runs} runs in each mode")
    published = det.PUBLISHED
    rows = [{"run": i + 1, "batch": fast.batch, "your row": fast.row + 1,
             "exact: first difference": _token(exact.first_divergence),
             "fast: first difference": _token(fast.first_divergence),
             "fast: largest logit change": f"{fast.max_abs_logit_diff:.1e}", "fast pass": f"{fast.step_ms:.1f} ms"}
            for i, (exact, fast) in enumerate(zip(result.exact.runs, result.fast.runs, strict=True))]
    st.dataframe(rows, hide_index=True)
    st.markdown(
        f"**Published** ({published.source}, [the article]({published.url})): {published.model}, one prompt "
        f"{published.runs:,} times at temperature 0 on a production stack: **{published.distinct} different "
        f"completions**, the first difference at **token {published.first_divergence}**; with batch-invariant "
        f"kernels, **{published.runs:,} identical**.")
    if result.lone.sampling is None:
        st.markdown(f"**Here, honestly:** {precision_line(result)}. So a flip here needs a near-tie. Your prompt's "
                    "nearest ones when it ran alone:")
        st.markdown("\n".join(f"- {line}" for line in closest_calls(lm, result)))
        st.caption("Try another prompt or a longer run to find a nearer tie, or a temperature above 0: a sampled "
                   "step flips when the draw falls near the edge of its token's share.")
    elif note := sampled_closest(result):
        st.markdown(note)


def _token(index: int | None) -> str:
    return "none" if index is None else f"token {index + 1}"


def why_section(lm: LoadedModel, result: DeterminismResult | None) -> None:
    """Why the digits move, computed on the spot, what batch invariance costs, and what a visitor controls."""
    st.header("3 · Why the last digits move")
    sums = (sum_in_two_orders(1e8, -1e8, 0.1), sum_in_two_orders(1.0, 0.003, 0.003, torch.bfloat16))
    # a product through the model's weight: once for the server, in its turn with the experiments
    # and the KV page's measurements
    key = ("product in two shapes", lm.name, str(lm.device))
    with st.spinner("Multiplying a row of the model's weight alone and in a batch…"):
        product = shared_board().get(key, lambda: product_in_two_shapes(lm, 8)).value
    st.markdown("**Adding in another order gives another answer.** Computed now, with torch:")
    st.markdown("\n".join(f"- {sum_line(example)}" for example in sums))
    st.markdown(
        "A logit is the end of long sums (each output of a layer adds up hundreds of products), and a matrix "
        "library chooses how to split and order those sums by the **shape** of the product: one row alone gets "
        "one order, the same row inside a batch another. " + product_line(product))
    lines = kernel_lines(lm)
    st.markdown(f"- {lines['exact']}\n- {lines['fast']}")
    if result is not None:
        speed = result.speed
        st.markdown(
            f"**Batch-invariant** means each row's numbers do not depend on the batch: the same row gives the same "
            f"digits alone or with any company. What it costs here, both timed in your experiment on the same "
            f"{speed.batch} rows ({speed.repeats} passes each, median): **exact {speed.exact_ms:.1f} ms**, "
            f"**fast {speed.fast_ms:.1f} ms** per packed pass ({_cost(speed.exact_ms, speed.fast_ms)}).")
    st.markdown(
        "**What you can and cannot control on a real service.** You choose the **temperature** (0: greedy), the "
        "sampler's other settings and, on some services, a **seed** for the random draws. You do not choose who "
        "else is being served in the same pass, so not the batch's shape, nor the kernels, the hardware or the "
        "software version. A seed fixes the draws, not the logits: a service keeps the same prompt's answer only "
        f"when its kernels are batch-invariant, as exact mode is. {SERVER_BATCHING[current_scheduler().batching]}")


def _cost(exact_ms: float, fast_ms: float) -> str:
    if exact_ms <= fast_ms:
        return "on this CPU the batch-invariant pass is no slower"
    return f"batch invariance costs {100 * (exact_ms / fast_ms - 1):.0f}% here"


def main() -> None:
    """The page, top to bottom."""
    ensure_app_frame()
    page_style()
    lm = current_model()
    header()
    # presentation mode: the settings folded away, so the findings fill the projector's one screen
    with st.expander("Experiment settings") if presenting() else st.container():
        experiment_form(lm)
    latest = det.latest(S)
    if latest is None:
        st.info("Press **Run the experiment**: about half a minute with the settings above on two CPU cores.")
    else:
        experiment, result = latest
        findings(lm, result)
        if presenting():
            projected(lm, result)
        else:
            step_section(lm, result)
        repeated_section(lm, experiment, result)
    why_section(lm, None if latest is None else latest[1])


if __name__ == "__main__":  # Streamlit runs a page as __main__; an import only defines it
    main()
