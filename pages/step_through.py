"""Step through: run the model one token at a time and look at every part of each step.

The page is layout only: what its controls do is ui/controllers/step_through.py, plain functions over
the visitor's state, and every panel is a view of the visitor's Generation. Two fragments keep it
fast: the workspace (buttons and every panel) reruns on Step / Back / Reset, and inside it
the sampler view (chart, decision, branch) reruns alone when a sampler control moves,
re-sampling the kept logits with no forward pass. (A slider callback that reruns only the
chart was measured slower in the browser than this nested fragment.)

The sampler controls sit in a column beside the workspace, outside both fragments, so a Step
does not draw them again: their callbacks rerun the sampler view by name. Six controls drawn
on every click cost the shared server a measurable share of its tokens/s with a class stepping
at once (`bench.load_bench`; figures in docs/benchmarks.md). On a projector (presentation mode)
the three that remain sit inside the sampler view, beside the decision.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from urllib.parse import urlencode

import streamlit as st
from streamlit.errors import StreamlitAPIException

from engine import CHAINS, SLIDE_SIZES, Generation, generation_slide, to_trace
from engine.speed import PrefillCost
from ui.controllers import step_through as control
from ui.server import (
    current_deployment,
    current_model,
    current_scheduler,
    current_source,
    downloadable,
    downloadable_recording,
    prefill_cost,
    switch_model,
    upload_problem,
)
from ui.session import (
    DETAIL_VIEWS,
    STEP,
    init_defaults,
    load_presets,
    message,
    preset_named,
    set_message,
    slider_range,
    step_generation,
    widget_range,
)
from ui.views import PANEL_CSS, chain_name, long_prompt_warning, plain, reading_progress
from ui.views import inside as inside_views
from ui.widgets import (
    BACKWARD,
    EMBED_ROWS,
    FORWARD,
    RUN,
    continue_run,
    current_theme,
    embedded,
    ensure_app_frame,
    page_style,
    panels,
    presenter_keys,
    presenting,
)

S = st.session_state
PROGRESS_TICK_S = 0.5  # a long prompt's progress bar moves this often
SAMPLER_CONTROLS = "sampler_controls"  # the controls' container: its CSS class is st-key-sampler_controls
# Less empty space above the title; room between the branch pills and the detail views' control.
# The sampler controls' column stays in view while the page scrolls, so a slider and the chart
# it changes are on screen together.
PAGE_CSS = """<style>[data-testid="stMainBlockContainer"]{padding-top:2.2rem}
.st-key-st_tabs{margin-top:1rem}
@media (min-width:640px){[data-testid="stColumn"]:has(.st-key-sampler_controls){
position:sticky;top:3.75rem;align-self:flex-start}}
</style>"""


# ---- callbacks: the controller's functions on this visitor's state, then the rerun they need --


def on_branch(token_id: int) -> None:
    control.branch(S, token_id)
    st.rerun(scope=STEP.workspace)


def on_repick() -> None:
    control.repick(S)
    st.rerun(scope=STEP.workspace)


def on_sampler_change() -> None:
    """A sampler control moved: rerun the sampler view alone, wherever the control is drawn.
    With no sampler view on the page (no generation yet), the page reruns as usual."""
    if step_generation(S) is None:
        return
    try:
        st.rerun(scope=STEP.sampler_view)
    except StreamlitAPIException:  # the view is not on the page: the default rerun draws it
        return


def on_branch_choice(key: str, picked: int) -> None:
    """A branch pill was chosen: force that token as the latest step's; choosing the pick
    itself again (which clears the pill) changes nothing and keeps it marked."""
    chosen = S.get(key)
    if chosen is None or chosen == picked:
        S[key] = picked
        return
    on_branch(chosen)


def on_trace_upload() -> None:
    if (upload := S.get(STEP.trace_upload)) is None:
        return
    if problem := upload_problem(upload.name, upload.size):
        set_message(S, "trace_error", problem)
        return
    with replay_progress(upload.name, cancel_button=False) as progress:  # a callback may draw no widget
        control.load_trace(S, current_model(), upload.name, upload.getvalue(), progress, current_scheduler())
    st.rerun()  # the whole page: the prompt and the sampler controls now show the trace's settings


@contextmanager
def replay_progress(what: str, cancel_button: bool) -> Iterator[Callable[[int, int], bool]]:
    """A progress bar for a replay while it runs, updated after each step. Any click during
    the replay (the Stop button, or anything else) ends the script run at the next update,
    which cancels the replay and leaves the visitor's generation as it was."""
    slot = st.empty()
    with slot.container():
        bar = st.progress(0.0, text=f"Replaying {plain(what)}…")
        if cancel_button:
            st.button("Stop replaying", key=STEP.replay_stop, help="Cancel: your generation stays as it is.")

    def report(done: int, total: int) -> bool:
        bar.progress(done / total, text=f"Replaying {plain(what)}: step {done:,} of {total:,}")
        return True

    yield report
    slot.empty()


# ---- the share link --------------------------------------------------------------------------


def apply_link_once() -> None:
    """On a visitor's first run, rebuild the state a share link describes."""
    shared = control.link_to_open(S, {key: st.query_params.get_all(key) for key in st.query_params})
    if shared is None:
        return
    if shared.model and not switch_model(shared.model):
        control.link_failed(S, f"The link's model '{shared.model}' could not be loaded.")
        return
    with replay_progress("the link", cancel_button=True) as progress:
        control.open_link(S, current_model(), shared, progress, current_scheduler())


def publish_link(gen: Generation) -> dict[str, str | list[str]]:
    """Keep the address bar a share link for the current state; return its parameters."""
    params = control.share_params(gen, current_source())
    if control.needs_publishing({key: st.query_params.get_all(key) for key in st.query_params}, params):
        st.query_params.from_dict(params)
    return params


# ---- setup: prompt, presets, stop settings (full reruns) -------------------------------------


def prompt_field() -> None:
    st.text_area("Prompt", key=STEP.prompt, height=68, persist_state="session",
                 label_visibility="collapsed" if embedded() else "visible", placeholder="Prompt",
                 help="The text the model continues. Changing it (or chat, or the seed) starts over.")


def setup_controls(with_prompt: bool = True) -> None:
    """Prompt, presets, chat, seed and stop settings (the prompt drawn above instead in an embed)."""
    prompt_col, preset_col, more_col = st.columns([5, 3, 2], gap="small")
    with prompt_col:
        if with_prompt:
            prompt_field()
    with preset_col:
        presets = load_presets()
        st.selectbox("Presets", [p.name for p in presets], index=None, key=STEP.preset,
                     on_change=control.choose_preset, args=(S,), placeholder="Pick an example…",
                     persist_state="session")
        st.toggle("Chat template", key=STEP.chat, persist_state="session",
                  help="Wrap the prompt as a user message in the model's chat template.")
        st.toggle("Let typed special tokens through", key=STEP.allow_special, persist_state="session",
                  help="For a lesson on prompt injection: text you type that spells a special token "
                       "(<|im_end|>, <|im_start|>) becomes that token, so it can end the text, end your turn or "
                       "start a forged one. Off, it is read as plain characters, as chat servers do.")
    with more_col:
        st.number_input("Seed", **widget_range(STEP.seed), key=STEP.seed,
                        persist_state="session", help="Seeds this generation's own random generator, which decides "
                        "every random draw u when sampling: the same seed and settings give the same tokens, another "
                        "seed other draws. The default's first draws are typical ones (0.56, 0.44, 0.64…).")
        stop_controls()
    if S.get(STEP.preset):
        st.caption(f"Preset: {preset_named(presets, S[STEP.preset]).about}")
    for control_name in ("prompt", "stop"):
        if problem := message(S, control_name):
            st.error(plain(problem), icon=":material/back_hand:")


def special_text_note(gen: Generation) -> None:
    """Say when the visitor typed a special token's spelling, and what was made of it."""
    if not gen.special_text:
        return
    spelled = ", ".join(gen.special_text)
    effect = "close its turn or start a new one" if gen.chat else "end the text as the model's own end token does"
    if gen.allow_special:
        st.warning(plain(f"Your text contains {spelled} and special tokens are let through: the model reads them as "
                         f"real special tokens, so your text can {effect} (prompt injection)."),
                   icon=":material/warning:")
    else:
        st.info(plain(f"Your text contains {spelled}: it is read as plain characters, not as special tokens, as "
                      "chat servers do, so it cannot " + ("end your turn or forge another" if gen.chat else
                                                          "act as the end token") + ". Turn on \"Let typed special "
                      "tokens through\" to see what happens otherwise."), icon=":material/shield:")


def templated_text() -> None:
    """With the chat template on, the exact text the model reads, special tokens included."""
    gen = step_generation(S)
    if gen is not None:
        special_text_note(gen)
    if gen is not None and gen.chat:
        # expanders cannot nest: in presentation mode this already sits in one
        with st.container() if presentation() else st.expander("Templated text: what the model actually reads"):
            st.code(gen.prompt_text, language=None, wrap_lines=True)


def stop_controls() -> None:
    """The termination settings in a popover whose label says what is in force: the generation's
    own settings, so a value the engine refused is never shown as if it applied."""
    gen = step_generation(S)
    stop = gen.stop if gen is not None and not message(S, "stop") else None
    if stop is None:
        label = "Stop settings ⚠"
    else:
        stops = len(stop.stop_sequences)
        label = f"Max {stop.max_new_tokens}" + (f" · {stops} stop" if stops else "") + (
            " · no EOS" if stop.ignore_eos else "")
    with st.popover(label, icon=":material/stop_circle:", width="stretch",
                    help="Termination: max new tokens, stop sequences, end of sequence"):
        st.number_input("Max new tokens", **widget_range(STEP.max_new_tokens), key=STEP.max_new_tokens,
                        persist_state="session")
        st.text_area("Stop sequences (one per line, up to 4; write a newline as \\n)", key=STEP.stop_sequences,
                     height=100, persist_state="session")
        st.toggle("Ignore EOS", key=STEP.ignore_eos, persist_state="session",
                  help="Keep going after the model emits its end-of-sequence token.")


# ---- the workspace fragment ------------------------------------------------------------------


def button_row(gen: Generation) -> None:
    """Step, Run, Back, Reset; while a Run goes on, Run turns into Stop and the others wait."""
    running, finished, unusable = control.is_running(S), gen.finished, control.prompt_problem(S)
    row = st.container(horizontal=True, vertical_alignment="center")
    row.button("Step", key=STEP.step, type="primary", on_click=control.step, args=(S,),
               disabled=running or finished or bool(unusable),
               help="Fix the prompt above first." if unusable else "One token: forward pass, sample, append, check.")
    # one key for Run and Stop: the button keeps its place and identity while its label flips
    row.button("Stop" if running else "Run", key=STEP.run, on_click=control.stop_run if running else control.start_run,
               args=(S,), disabled=(finished or bool(unusable)) and not running,
               help="Stop after the token being made now." if running else
               "Step until a stop condition fires; tokens appear as they come.")
    row.button("Back", key=STEP.back, on_click=control.back, args=(S,), disabled=running or not gen.steps,
               help="Rewind one step (the KV cache is cropped, the random generator restored).")
    row.button("Reset", key=STEP.reset, on_click=control.reset, args=(S,), disabled=running,
               help="Start over from the prompt.")
    if presentation():  # the projector's one click from the distribution to inside the pass
        row.toggle("Inside the pass", key=STEP.inside_screen,
                   help="Show what each layer would predict and where the new token looks, in place of the "
                        "distribution; every Step's pass is opened up while it is on.")
    row.markdown(status_text(gen) + (" · running…" if running else ""))
    if problem := message(S, "buttons"):
        st.warning(plain(problem), icon=":material/back_hand:")
    elif note := message(S, "idle"):
        st.info(plain(note), icon=":material/history:")


def cost_of_prefill(gen: Generation) -> PrefillCost:
    with st.spinner("Measuring how fast this server reads a prompt (once, for everyone)…"):
        return prefill_cost(gen.lm)


def wait_for_prompt(gen: Generation) -> None:
    """A long prompt's first Step: its pass's progress, against the estimate, until it has read
    the prompt; then the Step itself, and the workspace drawn again with its token."""
    cost = cost_of_prefill(gen)
    bar = st.progress(0.0)
    while (reading := control.awaiting_prompt(S, gen)) is not None:
        share, label = reading_progress(reading, cost)
        bar.progress(share, text=label)
        if reading.done:
            break
        time.sleep(PROGRESS_TICK_S)
    control.finish_awaited_step(S)
    st.rerun(scope="fragment")


def status_text(gen: Generation) -> str:
    count = len(gen.steps)
    text = f"**{count}** token{'s' if count != 1 else ''} generated · prompt {len(gen.prompt_ids)} tokens"
    if gen.finished:
        text += f" · :orange-background[finished: {gen.finish_reason.replace('_', ' ')}]"
    return text


def welcome_back() -> None:
    """Note that this visitor is here; a generation put away while the tab sat idle is rebuilt
    from its steps first, under a progress bar."""
    gen = step_generation(S)
    if gen is not None and gen.closed:
        with replay_progress("your generation", cancel_button=False) as progress:
            control.keep_open(S, progress)
    else:
        control.keep_open(S)


@st.fragment(key=STEP.workspace)
def workspace() -> None:
    """Buttons and every panel: reruns alone on Step, Back, Reset, Run and branch clicks."""
    welcome_back()
    gen = step_generation(S)
    if gen is None:
        st.info("Type a prompt above to start.")
        return
    if control.is_running(S):
        control.advance_run(S, gen, time.monotonic())
    button_row(gen)
    if control.awaiting_prompt(S, gen) is not None:
        wait_for_prompt(gen)
    elif control.is_long_prompt(gen):
        st.warning(long_prompt_warning(len(gen.prompt_ids), cost_of_prefill(gen)), icon=":material/hourglass_top:")
    panels.step_announcement(gen)  # a screen reader hears the new token
    if presentation() and S.get(STEP.inside_screen):  # one screen: chips and inside the latest pass
        panels.context_window_panel(gen, control.prompt_html(S, gen), 2 if embedded() else 3)
        projector_inside(gen)
    elif presentation():  # one screen: chips, chart, decision and check; the rest below the fold
        control.look_inside(S, gen, open_=False)  # closed: no pass is captured
        panels.context_window_panel(gen, control.prompt_html(S, gen), 2 if embedded() else 3)
        sampler_view()
        panels.html(panels.decoded_text(gen))
        left, right = st.columns(2, gap="medium")
        with left:
            st.markdown("#### Termination")
            panels.termination_panel(gen)
        with right:
            st.markdown("#### Sequence probability")
            panels.sequence_panel(gen, basis_key=STEP.sequence_basis, table=False)
    else:
        panels.context_panel(gen, control.prompt_html(S, gen))
        sampler_view()
        detail_tabs(gen)
    # the sampler view, drawn in both modes, has kept the address bar a share link
    if control.is_running(S):
        continue_run(control.RUN, S)  # the next token once this one has been on screen for its frame
    gen.read_prompt_ahead()  # before step 1: the prompt's pass starts while the visitor reads the page


def projector_inside(gen: Generation) -> None:
    """Inside the latest step's pass on one projector screen: each layer's guess as a cell, the
    attention sink and what the pass read, in words (the tables and charts stay on the wide page)."""
    view = control.look_inside(S, gen, open_=True)
    if view is None:
        st.markdown("Press **Step**: its forward pass is opened up here.")
        return
    if isinstance(view, str):
        st.warning(plain(view), icon=":material/back_hand:")
        return
    record = gen.steps[view.step - 1]
    st.markdown(f"**Step {view.step}**: {inside_views.pass_text(view, record.token)}")
    st.html(inside_views.lens_cells_html(view, record.token, record.token_id))
    if view.layers[-1].attention is not None:
        st.markdown(inside_views.sink_text(view, gen.prompt_pieces + [s.token for s in gen.steps]))
    st.markdown(inside_views.reading_text(view))


def presentation() -> bool:
    """The one-screen layout: on a projector, and inside another page (an embed's small frame)."""
    return presenting()


# ---- sampler controls, distribution, decision, candidates (nested fragment) ------------------


def sampler_controls() -> None:
    """The sampler's controls; each move reruns the sampler view (`on_sampler_change`)."""
    st.markdown("### Sampler")
    moved = {"persist_state": "session", "on_change": on_sampler_change}
    st.slider("Temperature", **slider_range(STEP.temperature, S), key=STEP.temperature, **moved,
              help="0 = greedy (argmax). Below 1 sharpens the distribution, above 1 flattens it.")
    st.slider("Top-k", **slider_range(STEP.top_k, S), key=STEP.top_k, **moved,
              help="Keep the k most probable tokens (0 = off).")
    st.slider("Top-p", **slider_range(STEP.top_p, S), key=STEP.top_p, **moved,
              help="Keep the most probable tokens until their mass reaches p (1 = off).")
    if presentation():
        return
    st.slider("Min-p", **slider_range(STEP.min_p, S), key=STEP.min_p, **moved,
              help="Drop tokens below min-p × the top token's probability (0 = off).")
    st.slider("Repetition penalty", **slider_range(STEP.repetition_penalty, S), key=STEP.repetition_penalty,
              **moved, help="Above 1 makes tokens already in the context less likely (1 = off).")
    st.selectbox("Chain order", list(CHAINS), key=STEP.chain, format_func=chain_name, **moved,
                 help="The order the stages run in, as in each engine: " + "; ".join(
                     f"{chain_name(name)}: {' → '.join(stages)}" for name, stages in CHAINS.items()))


@st.fragment(key=STEP.sampler_view)
def sampler_view() -> None:
    """Distribution, re-sample note, decision and branch: reruns alone when a sampler control
    moves, re-sampling the latest step's kept logits (no forward pass). The next Step uses the
    same settings. The chart is drawn first: the browser shows the elements in the order they
    arrive, and the chart is what a student is watching."""
    welcome_back()
    gen = step_generation(S)
    view = control.sampler_view(S, gen)  # the controls' values are in session_state already
    if presentation():
        projector_sampler_view(gen, view)
    else:
        wide_sampler_view(gen, view)
    publish_link(gen)


def wide_sampler_view(gen: Generation, view: control.SamplerView) -> None:
    """The full view, one panel under another (the controls are beside the workspace)."""
    if view.problem:
        st.error(plain(view.problem), icon=":material/back_hand:")
    record = view.record
    if record is None:
        st.info(FIRST_STEP_NOTE)
        return
    panels.distribution_panel(record, view.decision, view.distribution, mode_key=STEP.chart_mode,
                              chart_key=STEP.distribution_chart)
    if view.changed:
        panels.resample_note(record, view.decision, gen.lm.texts, on_repick, STEP.repick)
    panels.decision_and_branch_panel(record, view.decision, view.distribution, gen.lm.texts, on_branch_choice,
                                     key_prefix=STEP.force_prefix)


def projector_sampler_view(gen: Generation, view: control.SamplerView) -> None:
    """Presentation mode: the bars, and beside them the decision, the check and three controls."""
    view_col, control_col = st.columns([3, 1.3], gap="medium")
    record = view.record
    with view_col:
        if record is None:
            st.info(FIRST_STEP_NOTE)
        else:
            panels.distribution_bars_panel(record, view.decision, view.distribution, EMBED_ROWS if embedded() else 8)
    with control_col:
        if record is not None:
            panels.decision_line_panel(view.decision, view.distribution, gen.lm.texts)
            panels.termination_line_panel(gen)
        sampler_controls()
        if view.problem:
            st.error(plain(view.problem), icon=":material/back_hand:")
    if record is not None and view.changed:
        with view_col:
            panels.resample_note(record, view.decision, gen.lm.texts, on_repick, STEP.repick)


FIRST_STEP_NOTE = ("Press **Step**: the first forward pass reads the whole prompt at once (prefill) and gives the "
                   "distribution for the first new token. (The server starts that pass while you read this, so the "
                   "first step is quick.)")


# ---- the detail views (only the chosen one is computed) ---------------------------------------


def detail_tabs(gen: Generation) -> None:
    """One of the detail views, chosen with a segmented control. (st.tabs sends a block per tab
    on every Step, six messages against this control's one; with a class stepping at once, each
    message of a Step's rerun costs the shared server.)"""
    shown = st.segmented_control("Details", list(DETAIL_VIEWS), key=STEP.tabs, required=True,
                                 label_visibility="collapsed", persist_state="session")
    views = (panels.termination_panel,
             lambda g: panels.inside_panel(g, control.look_inside(S, g, open_=True), STEP.inside_head),
             lambda g: panels.sequence_panel(g, basis_key=STEP.sequence_basis),
             lambda g: panels.kv_panel(g, STEP.kv_chart),
             lambda g: panels.history_panel(g, STEP.history),
             share_panel)
    shown = shown if shown in DETAIL_VIEWS else DETAIL_VIEWS[0]
    if shown != "Inside the pass":
        control.look_inside(S, gen, open_=False)  # closed: no pass is captured
    views[DETAIL_VIEWS.index(shown)](gen)


def share_panel(gen: Generation) -> None:
    params = publish_link(gen)
    base = (st.context.url or "").split("?")[0]
    st.markdown("**Share link**: opens this exact state (model, prompt, settings, seed, every step and "
                "forced token); the address bar always holds it.")
    st.code(f"{base}?{urlencode(params, doseq=True)}", language=None, wrap_lines=True)
    query = urlencode(params, doseq=True)
    with st.container(horizontal=True):
        st.download_button("Download trace (JSON)", data=lambda: downloadable(to_trace(gen)),
                           file_name="token-by-token-trace.json", mime="application/json", key=STEP.trace_download,
                           on_click="ignore")
        st.download_button("Download as a web page", data=lambda: downloadable_recording(gen, query),
                           file_name="token-by-token-recording.html", mime="text/html", key=STEP.recording_download,
                           on_click="ignore", help="One file that replays these steps in any browser, with no server "
                           "and no network: for a handout, a course page or a slide. It carries the trace, so this "
                           "app loads it back.")
    if gen.steps:
        theme = current_theme().name
        with st.container(horizontal=True):
            for name, size in SLIDE_SIZES.items():
                st.download_button(f"Step {len(gen.steps)} as a slide ({name.replace('x', '×')})",
                                   data=lambda size=size: generation_slide(gen, None, size, theme),
                                   file_name=f"token-by-token-step-{len(gen.steps)}-{name}.png", mime="image/png",
                                   key=f"{STEP.slide_download}{name}", on_click="ignore", icon=":material/slideshow:",
                                   help=f"The chips, the distribution with the pick and the sampler's decision as "
                                        f"a picture for a slide, in the {theme} theme.")
    st.file_uploader("Load a trace or a recording", type=["json", "html"], key=STEP.trace_upload,
                     on_change=on_trace_upload,
                     max_upload_size=max(1, current_deployment().limits.max_upload_bytes // 2**20),
                     help="A trace (JSON) or a recording (web page) downloaded from this app; its steps are "
                          "replayed on the current model.")
    if problem := message(S, "trace_error"):
        st.error(plain(problem), icon=":material/back_hand:")
    elif note := message(S, "trace"):
        st.success(plain(note))


# ---- the page --------------------------------------------------------------------------------


def main() -> None:
    """The page, top to bottom."""
    ensure_app_frame()
    lm = current_model()
    init_defaults(S)
    apply_link_once()
    st.html(PAGE_CSS + PANEL_CSS)
    page_style()
    presenter_keys({STEP.step: FORWARD, STEP.back: BACKWARD, STEP.run: RUN})
    if embedded():  # a course page's frame: the prompt first, then the generation; settings below
        prompt_field()
    if not presentation():  # a projector's screen goes to the generation
        st.header("Step through", anchor=False)
        st.caption("One click = one token. Each step runs the model on the context, turns its scores into a "
                   "distribution over the whole vocabulary, picks one token, appends it, and checks whether to "
                   "stop.")
    if problem := message(S, "link"):
        st.warning(plain(problem), icon=":material/link:")
    welcome_back()
    # widget values are already in session_state; messages then show beside them
    control.sync_generation(S, lm, current_scheduler())
    if presentation():  # on a projector the setup folds away under the generation
        workspace()
    with st.expander("Settings" if embedded() else "Prompt and settings") if presentation() else st.container():
        setup_controls(with_prompt=not embedded())
        templated_text()
    if not presentation():
        main_col, controls_col = st.columns([3, 1.1], gap="medium")
        with main_col:
            workspace()
        with controls_col, st.container(key=SAMPLER_CONTROLS):  # outside the fragments: a Step leaves them be
            sampler_controls()


if __name__ == "__main__":  # Streamlit runs a page as __main__; an import only defines it
    main()
