"""Breaking the chain: speculative decoding one round at a time, beside plain decoding.

The page is layout only: what its controls do is ui/controllers/breaking_the_chain.py, plain functions over
the visitor's state, and every panel is a view of two engine objects there: the speculative
lane (engine/speculative/generation.py) and a plain lane stepped to the same length.
"""

from __future__ import annotations

import time

import streamlit as st

from engine import LoadedModel, self_draft
from engine.speculative import GO_ON, K_MAX, K_MIN, DraftMethod, last_race_times, speculative_to_trace
from ui.controllers import breaking_the_chain as bc
from ui.domain import plain_ms_per_token
from ui.server import current_deployment, current_model, downloadable
from ui.session import CHAIN
from ui.views import (
    PANEL_CSS,
    chip_window,
    context_html,
    counted,
    plain,
    race_cost_text,
    race_table,
    race_verdict,
    round_line_html,
    speculative_chips_html,
)
from ui.widgets import (
    FORWARD,
    RUN,
    continue_run,
    ensure_app_frame,
    page_style,
    presenter_keys,
    presenting,
    show_notice,
)

S = st.session_state
RACE_POLL_S = 1.0  # a race under way is redrawn this often
CHIP_LINES = 3  # presentation mode: rows of chips shown per lane (the newest), so a round fits 1280x720


# ---- draft methods: the self-copies are shared, read-only, one per model -----------------------


@st.cache_resource(show_spinner=False, max_entries=4)
def _self_copy(_lm: LoadedModel, model_key: tuple[str, str, str], kind: str) -> LoadedModel:
    return self_draft(_lm, kind)


def self_copy(lm: LoadedModel, kind: str) -> LoadedModel:
    with st.spinner(f"Making a {kind} copy of the model to draft with…"):
        return _self_copy(lm, (lm.name, lm.source.location, str(lm.device)), kind)


def make_draft(lm: LoadedModel, method: str) -> DraftMethod:
    """A fresh draft method for this visitor (ui/controllers/breaking_the_chain.py draft_method)."""
    return bc.draft_method(lm, method, self_copy)


# ---- callbacks: the controller's functions on this visitor's state -------------------------------


def on_reset() -> None:
    bc.reset(S, current_model(), make_draft)


def on_method() -> None:
    bc.choose_method(S, current_model(), make_draft)


def on_trace_upload() -> None:
    bc.upload_trace(S, current_model(), make_draft, S.get(CHAIN.trace_upload))


# ---- setup --------------------------------------------------------------------------------------


def setup_controls() -> None:
    prompt_col, preset_col, method_col = st.columns([5, 3, 3], gap="small")
    with prompt_col:
        st.text_area("Prompt", key=CHAIN.prompt, height=100,
                     help="The text both lanes continue. Changing it (or chat, or the seed) starts over.")
    with preset_col:
        st.selectbox("Presets", list(bc.PRESETS_BY_NAME), index=None, key=CHAIN.preset, on_change=bc.choose_preset,
                     args=(S,), placeholder="Pick an example…")
        st.toggle("Chat template", key=CHAIN.chat)
        with st.popover("Sampler and stop", width="stretch"):
            st.slider("Temperature", **bc.widget_range(CHAIN.temperature), key=CHAIN.temperature,
                      help="0 = greedy (argmax).")
            st.slider("Top-k", **bc.widget_range(CHAIN.top_k), key=CHAIN.top_k, help="0 = off")
            st.slider("Top-p", **bc.widget_range(CHAIN.top_p), key=CHAIN.top_p, help="1 = off")
            st.slider("Min-p", **bc.widget_range(CHAIN.min_p), key=CHAIN.min_p, help="0 = off")
            st.slider("Repetition penalty", **bc.widget_range(CHAIN.repetition_penalty),
                      key=CHAIN.repetition_penalty, help="1 = off")
            st.number_input("Max new tokens", **bc.widget_range(CHAIN.max_new_tokens), key=CHAIN.max_new_tokens)
            st.text_area("Stop sequences (one per line; write a newline as \\n)", key=CHAIN.stop_sequences, height=80)
            st.number_input("Seed", **bc.widget_range(CHAIN.seed), key=CHAIN.seed)
    with method_col:
        st.selectbox("Draft method", bc.METHODS, key=CHAIN.method, on_change=on_method,
                     help="Where the guesses come from. Switching keeps the tokens so far.")
        st.number_input(f"k: tokens guessed per round ({K_MIN} to {K_MAX})", step=1, key=CHAIN.k,
                        help="More guesses can add more tokens per pass, but a rejection wastes the rest. The "
                             f"trained drafts (heads, MTP) guess up to k: they stop after a guess they gave under "
                             f"{GO_ON:.0%}, which is seldom kept.")
    if S.get(CHAIN.preset) in bc.PRESETS_BY_NAME:
        st.caption(f"Preset: {bc.PRESETS_BY_NAME[S[CHAIN.preset]].about}")
    for control in ("setup", "sampler", "stop", "k", "method"):
        if note := bc.notice(S, control):
            show_notice(note)


# ---- the workspace ------------------------------------------------------------------------------


def button_row(lanes: bc.Lanes) -> None:
    running, finished = bc.is_running(S), lanes.speculative.finished
    row = st.container(horizontal=True, vertical_alignment="center")
    unusable = bool(bc.message(S, "setup"))  # a prompt or setting that cannot be used: nothing steps
    row.button("Step", key=CHAIN.step, type="primary", on_click=bc.step, args=(S, make_draft),
               disabled=running or finished or unusable,
               help="Fix the prompt and settings above first." if unusable else
               "One round: guess k tokens, check them all in one forward pass, keep the agreed prefix.")
    row.button("Stop" if running else "Run", key=CHAIN.run, on_click=bc.stop_run if running else bc.start_run,
               args=(S,) if running else (S, make_draft), disabled=(finished or unusable) and not running,
               help="Rounds until a stop condition fires.")
    row.button("Reset", key=CHAIN.reset, on_click=on_reset, disabled=running, help="Start both lanes over.")
    finish = lanes.speculative.finish_reason
    row.markdown(f"round **{len(lanes.speculative.rounds)}**"
                 + (f" · :orange-background[finished: {finish.replace('_', ' ')}]" if finish else "")
                 + (" · running…" if running else ""))
    if text := bc.message(S, "buttons"):
        st.warning(plain(text), icon=":material/back_hand:")
    elif note := bc.message(S, "idle"):
        st.info(plain(note), icon=":material/history:")


def counts_row(lanes: bc.Lanes) -> None:
    counts = bc.counts(lanes)
    cols = st.columns(4)
    cols[0].metric("tokens produced", counts.tokens)
    cols[1].metric("forward passes: speculative", counts.target_passes,
                   help="One pass of the model per round, however many tokens the round adds")
    cols[2].metric("forward passes: plain", counts.plain_passes, help="One pass per token")
    cols[3].metric("guesses kept", "–" if counts.acceptance is None else f"{counts.accepted} of {counts.checked}",
                   delta=None if counts.acceptance is None else f"acceptance α = {counts.acceptance:.2f}",
                   delta_color="off", delta_arrow="off")


def lanes_view(lanes: bc.Lanes) -> None:
    prompt_html = bc.prompt_html(S, lanes)
    spec, plain_lane = lanes.speculative, lanes.plain
    left, right = st.columns(2, gap="medium")
    with left, st.container(border=True):
        st.markdown(f"**Speculative**: {counted(len(spec.rounds), 'forward pass', 'forward passes')} for "
                    f"{counted(len(spec.generated_ids), 'token')}")
        st.html(speculative_chips_html(prompt_html, spec, CHIP_LINES if presenting() else None))
    with right, st.container(border=True):
        passes = len(plain_lane.steps)
        st.markdown(f"**Plain decoding**: {counted(passes, 'forward pass', 'forward passes')} for "
                    f"{counted(passes, 'token')}")
        chips = context_html(prompt_html, plain_lane.steps, legend=False)
        st.html(chip_window(chips, CHIP_LINES) if presenting() else chips)
    if not spec.generated_ids:
        return
    if spec.sampler.greedy:
        if lanes.identical and spec.text == plain_lane.text:
            st.success("Identical text, token for token: greedy speculative decoding keeps only tokens the model "
                       "would have picked itself.", icon=":material/check_circle:")
        else:
            st.error("The lanes differ: that would be a bug (or a float-rounding near-tie).", icon=":material/error:")
    else:
        st.info("Sampling: the two lanes draw different random numbers, so their texts differ, but each token of "
                "the speculative lane has exactly the distribution plain sampling would give it (the tests check "
                "this over 20,000 rounds).", icon=":material/casino:")


def round_view(lanes: bc.Lanes) -> None:
    story = bc.story(lanes)
    if story is None:
        st.info("Press **Step**. The first round also reads the whole prompt (prefill) in the same pass.")
        return
    st.markdown(story.heading)
    st.markdown(story.draft)
    if story.draft_note:
        st.caption(plain(story.draft_note))
    if story.picture_html:
        st.html(story.picture_html)
    st.markdown(story.verify)
    st.html(PANEL_CSS + story.positions_html)
    if story.rejection_html:
        st.html(story.rejection_html)
    if story.stop_cut:
        st.markdown(story.stop_cut)
    st.markdown(story.kv)
    st.html(story.kv_html)
    with st.expander("Every round"):
        st.html(PANEL_CSS + story.rounds_html)


def trace_controls(lanes: bc.Lanes) -> None:
    """Download this run as a JSON trace (every round), or load one back."""
    with st.expander("Save or load a run"):
        st.download_button("Download trace (JSON)", key=CHAIN.trace_download, on_click="ignore",
                           data=lambda: downloadable(speculative_to_trace(lanes.speculative)),
                           file_name="speculative-trace.json", mime="application/json")
        st.file_uploader("Load a speculative trace", type=["json"], key=CHAIN.trace_upload, on_change=on_trace_upload,
                         max_upload_size=max(1, current_deployment().limits.max_upload_bytes // 2**20),
                         help="A trace from this page or from `python -m engine --speculative … --json`.")
        if problem := bc.message(S, "trace_error"):
            st.error(plain(problem), icon=":material/back_hand:")
        elif note := bc.message(S, "trace"):
            st.success(plain(note))


@st.fragment(key=CHAIN.workspace)
def workspace() -> None:
    bc.keep_open(S, make_draft)
    lanes = bc.current_lanes(S)
    if lanes is None:
        st.info("Type a prompt above to start.")
        return
    if bc.is_running(S):
        bc.advance_run(S, time.monotonic())
    button_row(lanes)
    counts_row(lanes)
    lanes_view(lanes)
    if presenting() and lanes.speculative.rounds:  # one screen: the round's guesses, kept and rejected
        st.html(round_line_html(lanes.speculative.rounds[-1]))
    round_view(lanes)  # in presentation mode, the details below the fold
    trace_controls(lanes)
    cost_section(lanes)
    if bc.is_running(S):
        continue_run(bc.RUN, S)  # the next round once this one has been on screen for its frame


# ---- why it pays ----------------------------------------------------------------------------------


def cost_section(lanes: bc.Lanes) -> None:
    """What a verify pass costs against a decode step, in theory and in this page's own timings."""
    costs = bc.costs(lanes)
    st.markdown("### What checking k guesses costs")
    st.markdown(costs.why)
    st.caption(costs.verify_path)
    st.markdown(costs.time_per_token)
    if st.button("Measure prefill against decode", key=CHAIN.measure,
                 help="The KV cache & speed page's measurement: the prompt in one pass against one token per pass"):
        with st.spinner("Measuring…"):
            bc.measure(S, lanes.speculative.lm)
    if note := bc.measured_note(S):
        st.markdown(note)
    if costs.round_yield:
        st.markdown(costs.round_yield)


OTHER_METHODS = """
### Other ways to break the chain

All of them keep the model's rule that each token depends on every token before it; they change how many of
those tokens one pass of the big model settles.

- **Speculative decoding with a draft model** (this page): any smaller model with the same tokenizer guesses; the
  output is exactly the big model's. It pays when the draft is much cheaper than the target and agrees with it
  often. Here the only drafts on hand are bfloat16 and int8 copies of the same model, so a draft token costs a
  large share of a step: whether that pays on this server, the Race below measures.
- **Prompt lookup** (this page): guesses copied from the context itself; no extra model, no training. It pays
  only when the output repeats the input: edits, quotes, code, retrieval answers.
- **Lookahead decoding** (this page): no draft model and no training. The verify pass's own predictions past a
  rejected guess are the next guesses (a Jacobi iteration, whose fixed point is greedy decoding), and every run
  of tokens the passes predicted goes into an n-gram pool to guess from later. Exact, greedy or sampled.
- **Early exit** (this page): the model's own first layers, its final norm and head draft (the logit lens used
  as a draft); all the layers verify. It is made for models trained to exit early; each draft token still
  reads the whole LM head, and the Race below shows how often this model's shallow layers agree with its last.
- **Parallel decoding heads** (Medusa and similar): extra output heads on the model itself predict tokens 2, 3, …
  ahead from the same hidden state, and a tree of their guesses is verified in one pass. The heads must be
  trained (the base model can stay frozen).
- **Multi-token prediction**: the model is trained from the start to predict several future tokens; the extra
  predictions can serve as its own draft at inference. It needs a model trained that way.
- **Continuous batching**: no guessing at all. One pass reads the weights once and makes the next token for many
  different requests together, so the bandwidth bound is shared rather than broken; each sequence still makes one
  token per pass. It needs no special model, only a server that schedules requests step by step.
"""


def main() -> None:
    ensure_app_frame()
    lm = current_model()
    bc.init_defaults(S)
    page_style()
    presenter_keys({CHAIN.step: FORWARD, CHAIN.run: RUN})  # no Back on this page: PageUp / ← do nothing
    st.html(PANEL_CSS)
    if not presenting():  # a projector's screen goes to the round
        st.header("Breaking the chain", anchor=False)
        st.caption("Token T+1 needs token T, so plain decoding makes one token per forward pass. Speculative "
                   "decoding guesses the next k tokens cheaply, checks all of them in ONE forward pass of the model, "
                   "and keeps the guesses the model agrees with, plus one token of its own. The output is exactly "
                   "the model's.")
    bc.keep_open(S, make_draft)
    bc.sync(S, lm, make_draft)
    if presenting():  # on a projector the setup folds away under the rounds
        workspace()
        with st.expander("Prompt and settings"):
            setup_controls()
    else:
        setup_controls()
        workspace()
    race_section()
    st.markdown(OTHER_METHODS)


def race_section() -> None:
    """Every method on the visitor's prompt, greedy, one after another on a thread of their own:
    the cost said before, a live row per run, then who won and why, and the texts."""
    st.markdown("### Race every method on this prompt")
    lanes, job = bc.current_lanes(S), bc.race_job(S)
    if job is None:
        lm = current_model()
        cost = race_cost_text(len(bc.RACE_METHODS) + 1, bc.RACE_TOKENS, last_race_times(lm.name, bc.RACE_TOKENS),
                              plain_ms_per_token(lanes))
        st.caption(plain(cost + " Each row's text is checked against plain decoding's, token for token."))
        st.button("Race", key=CHAIN.race, disabled=lanes is None, on_click=bc.start_race_job,
                  args=(S, lm, make_draft))
    else:
        race_live()
    if problem := bc.message(S, "race"):
        st.error(plain(problem), icon=":material/error:")
    if (rows := S.get(CHAIN.race_rows)) and job is None:
        st.dataframe(race_table(rows), hide_index=True, key=CHAIN.race_table)
        st.markdown(race_verdict(rows))
        with st.expander("The texts"):
            texts = {row.label: current_model().tokenizer.decode(list(row.ids)) for row in rows}
            same = all(row.same_text for row in rows)
            st.markdown("Every method wrote exactly this:" if same else "Each method's text:")
            for label, text in (list(texts.items())[:1] if same else texts.items()):
                st.code(text, language=None, wrap_lines=True)
                if not same:
                    st.caption(label)


@st.fragment(run_every=RACE_POLL_S)
def race_live() -> None:
    """The race under way, redrawn every RACE_POLL_S: which run goes on, every row so far."""
    job = bc.race_job(S)
    if job is None:  # it has just ended: the whole section again, with the result
        st.rerun()
        return
    done = len(job.rows)
    now = ("waiting for another visitor's race on this server to end" if job.waiting else
           f"running {job.running}" if job.running else "starting")
    st.progress(done / len(job.labels), text=f"{done} of {len(job.labels)} runs done · {now} · "
                                              f"{job.elapsed_s:.0f} s so far")
    st.dataframe(race_table(job.rows, job.running), hide_index=True)


if __name__ == "__main__":
    main()
