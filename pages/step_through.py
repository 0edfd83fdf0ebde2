"""Step through: run the model one token at a time and look at every part of each step.

The page is a view of the visitor's Generation (in session_state). Two fragments keep it
fast: the workspace (buttons and every panel) reruns on Step / Back / Reset, and inside it
the sampler view (controls, chart, decision) reruns alone when a sampler control moves,
re-sampling the kept logits with no forward pass. (A slider callback that reruns only the
chart was measured slower in the browser than this nested fragment.)
"""

from __future__ import annotations

import json
import time
from urllib.parse import urlencode

import streamlit as st
from streamlit.errors import StreamlitAPIException

from engine import (
    CHAINS,
    Generation,
    GenerationFinished,
    LoadedModel,
    PromptError,
    Resampled,
    SamplerSettings,
    SettingsError,
    TraceError,
    parse_trace,
    replay,
    to_trace,
)
from ui import panels
from ui import state as keys
from ui.chips import prompt_chips
from ui.frame import ensure_app_frame
from ui.model import current_model, current_scheduler, current_source, switch_model
from ui.presets import apply_preset, load_presets, preset_named
from ui.share import ShareError, from_generation, from_params, replay_trace, to_params
from ui.state import parse_stop_sequences
from ui.teaching import PRESENTATION_CSS
from ui.views import PANEL_CSS

S = st.session_state
WORKSPACE_KEY = "st_workspace"  # the fragment a branch or a re-pick reruns
SAMPLER_VIEW_KEY = "st_sampler"  # the fragment a sampler control reruns, nested in the workspace
# Less empty space above the title.
PAGE_CSS = """<style>[data-testid="stMainBlockContainer"]{padding-top:2.2rem}</style>"""


# ---- state changes (button callbacks run before the rerun that shows their result) ---------


def _generation() -> Generation | None:
    return S.get(keys.GENERATION)


def _act(action) -> None:
    """Run an engine action; an engine error becomes the message beside the buttons."""
    try:
        action()
    except (GenerationFinished, SettingsError, PromptError) as exc:
        keys.set_message(S, "buttons", str(exc))
    else:
        keys.set_message(S, "buttons", None)


def on_step() -> None:
    gen = _generation()
    if gen is not None:
        _act(gen.step)


def on_back() -> None:
    gen = _generation()
    if gen is not None and gen.steps:
        _act(lambda: gen.rewind(len(gen.steps) - 1))


def on_reset() -> None:
    """A fresh generation with the current prompt and settings (a new prefill on Step)."""
    gen = _generation()
    if gen is not None:
        _act(lambda: S.update({keys.GENERATION: _new_generation(gen.lm)}))


def on_run() -> None:
    S[keys.RUNNING] = True


def on_stop() -> None:
    S[keys.RUNNING] = False


def on_branch(token_id: int) -> None:
    """Replace the latest step's pick with another candidate, then rerun the workspace."""
    gen = _generation()
    if gen is not None and gen.steps:
        def branch() -> None:
            gen.rewind(len(gen.steps) - 1)
            gen.step(force_token_id=token_id)
        _act(branch)
    st.rerun(scope=WORKSPACE_KEY)


def on_repick() -> None:
    """Take the latest step again under the current sampler settings."""
    gen = _generation()
    if gen is not None and gen.steps:
        def repick() -> None:
            gen.rewind(len(gen.steps) - 1)
            gen.step()
        _act(repick)
    st.rerun(scope=WORKSPACE_KEY)


def on_preset() -> None:
    name = S.get(keys.PRESET)
    if name:
        apply_preset(S, preset_named(name))


def on_trace_upload() -> None:
    """Replay an uploaded trace into a live generation; a bad file leaves everything as is."""
    upload = S.get("st_trace_upload")
    if upload is None:
        return
    try:
        trace = parse_trace(upload.getvalue())
        result = replay(current_model(), trace)
    except (TraceError, PromptError) as exc:
        keys.set_message(S, "trace_error", f"{upload.name}: {exc}")
        return
    if problem := keys.write_generation(S, result.generation):
        keys.set_message(S, "trace_error", f"{upload.name}: {problem}")
        return
    keys.set_message(S, "trace_error", None)
    note = f"Loaded {upload.name}: {len(result.generation.steps)} steps replayed."
    if result.mismatched_steps:
        note += f" Steps {', '.join(map(str, result.mismatched_steps))} sampled differently here and were forced."
    model = trace.get("model")
    recorded = model.get("name") if isinstance(model, dict) else None
    if recorded not in (None, current_model().name):
        note += f" The trace was recorded with {recorded}; it is replayed on {current_model().name}."
    keys.set_message(S, "trace", note)


def _new_generation(lm: LoadedModel) -> Generation:
    """A generation from the widgets' current values (raises the engine's errors)."""
    setup = keys.setup_from(S, lm)
    return Generation(lm, setup.prompt, chat=setup.chat, seed=setup.seed, sampler=keys.sampler_from(S),
                      stop=keys.stop_from(S), scheduler=current_scheduler())


# ---- the share link --------------------------------------------------------------------------


def apply_link_once() -> None:
    """On a visitor's first run, rebuild the state a share link describes."""
    if S.get("st_link_read"):
        return
    S["st_link_read"] = True
    params = {key: st.query_params.get_all(key) for key in st.query_params}
    if "prompt" not in params:
        return
    try:
        shared = from_params(params)
        if shared.model and not switch_model(shared.model):
            raise ShareError(f"The link's model '{shared.model}' could not be loaded.")
        with st.spinner(f"Replaying {len(shared.steps)} steps from the link…"):
            result = replay(current_model(), replay_trace(shared))
    except (ShareError, SettingsError, TraceError, PromptError) as exc:
        keys.set_message(S, "link", f"This link cannot be opened: {exc}")
        return
    if problem := keys.write_generation(S, result.generation):
        keys.set_message(S, "link", f"This link cannot be opened: {problem}")
        return
    if result.mismatched_steps:
        keys.set_message(S, "link", "Steps " + ", ".join(map(str, result.mismatched_steps))
                         + " sampled differently on this machine and were forced to the linked tokens.")


def publish_link(gen: Generation) -> dict[str, str | list[str]]:
    """Keep the address bar a share link for the current state; return its parameters."""
    params = to_params(from_generation(gen, "" if current_source() == "bundled" else current_source()))
    if S.get("st_published") != params:
        st.query_params.from_dict(params)
        S["st_published"] = params
    return params


# ---- setup: prompt, presets, stop settings (full reruns) -------------------------------------


def setup_controls() -> None:
    prompt_col, preset_col, more_col = st.columns([5, 3, 2], gap="small")
    with prompt_col:
        st.text_area("Prompt", key=keys.PROMPT, height=68, persist_state="session",
                     help="The text the model continues. Changing it (or chat, or the seed) starts over.")
    with preset_col:
        names = [p.name for p in load_presets()]
        st.selectbox("Presets", names, index=None, key=keys.PRESET, on_change=on_preset,
                     placeholder="Pick an example…", persist_state="session")
        st.toggle("Chat template", key=keys.CHAT, persist_state="session",
                  help="Wrap the prompt as a user message in the model's chat template.")
    with more_col:
        st.number_input("Seed", **_range(keys.SEED), key=keys.SEED,
                        persist_state="session", help="Seeds this generation's own random generator.")
        stop_controls()
    if S.get(keys.PRESET):
        st.caption(f"Preset: {preset_named(S[keys.PRESET]).about}")
    for control in ("prompt", "stop"):
        if problem := keys.message(S, control):
            st.error(problem, icon=":material/back_hand:")


def templated_text() -> None:
    """With the chat template on, the exact text the model reads, special tokens included."""
    gen = _generation()
    if gen is not None and gen.chat:
        # expanders cannot nest: in presentation mode this already sits in one
        with st.container() if presentation() else st.expander("Templated text: what the model actually reads"):
            st.code(gen.prompt_text, language=None, wrap_lines=True)


def stop_controls() -> None:
    stops = len(parse_stop_sequences(S[keys.STOPS]))
    label = f"Stop: max {S[keys.MAX_NEW]}" + (f" · {stops} seq." if stops else "") + (
        " · no EOS" if S[keys.IGNORE_EOS] else "")
    with st.popover(label, width="stretch", help="Termination: max new tokens, stop sequences, end of sequence"):
        st.number_input("Max new tokens", **_range(keys.MAX_NEW), key=keys.MAX_NEW,
                        persist_state="session")
        st.text_area("Stop sequences (one per line, up to 4; write a newline as \\n)", key=keys.STOPS,
                     height=100, persist_state="session")
        st.toggle("Ignore EOS", key=keys.IGNORE_EOS, persist_state="session",
                  help="Keep going after the model emits its end-of-sequence token.")


def sync_generation(lm: LoadedModel) -> None:
    """Start over when the prompt, chat flag, seed or model changed; pass stop settings on.
    On bad input the message is shown beside the control and the current generation stays."""
    gen = _generation()
    try:
        stop = keys.stop_from(S)
    except SettingsError as exc:
        keys.set_message(S, "stop", str(exc))
        stop = None
    else:
        keys.set_message(S, "stop", None)
    if gen is None or keys.setup_of(gen) != keys.setup_from(S, lm):
        try:
            gen = _new_generation(lm) if stop is not None else gen
        except (PromptError, SettingsError) as exc:
            keys.set_message(S, "prompt", str(exc))
            return
        keys.set_message(S, "prompt", None)
        S[keys.GENERATION] = gen
        S[keys.RUNNING] = False
    if gen is not None and stop is not None:
        gen.stop = stop


# ---- the workspace fragment ------------------------------------------------------------------


def button_row(gen: Generation) -> None:
    """Step, Run, Back, Reset; while a Run goes on, Run turns into Stop and the others wait."""
    running, finished = bool(S.get(keys.RUNNING)), gen.finished
    row = st.container(horizontal=True, vertical_alignment="center")
    row.button("Step", key="st_step", type="primary", on_click=on_step, disabled=running or finished,
               help="One token: forward pass, sample, append, check.")
    # one key for Run and Stop: the button keeps its place and identity while its label flips
    row.button("Stop" if running else "Run", key="st_run", on_click=on_stop if running else on_run,
               disabled=finished and not running,
               help="Stop after the token being made now." if running else
               "Step until a stop condition fires; tokens appear as they come.")
    row.button("Back", key="st_back", on_click=on_back, disabled=running or not gen.steps,
               help="Rewind one step (the KV cache is cropped, the random generator restored).")
    row.button("Reset", key="st_reset", on_click=on_reset, disabled=running, help="Start over from the prompt.")
    row.markdown(status_text(gen) + (" · running…" if running else ""))
    if problem := keys.message(S, "buttons"):
        st.warning(problem, icon=":material/back_hand:")


def status_text(gen: Generation) -> str:
    count = len(gen.steps)
    text = f"**{count}** token{'s' if count != 1 else ''} generated · prompt {len(gen.prompt_ids)} tokens"
    if gen.finished:
        text += f" · :orange-background[finished: {gen.finish_reason.replace('_', ' ')}]"
    return text


def _prompt_chips(gen: Generation) -> str:
    """Prompt chips never change for a generation: build them once."""
    cached = S.get("st_prompt_chips")
    if cached is None or cached[0] is not gen:
        cached = (gen, prompt_chips(gen.prompt_pieces))
        S["st_prompt_chips"] = cached
    return cached[1]


def advance_run(gen: Generation) -> None:
    """One token of a Run. Streamlit does not interrupt a fragment for another fragment's
    click, so Run takes one step per rerun: a Stop click is handled between two tokens."""
    S[keys.RUN_FRAME_STARTED] = time.monotonic()
    if not gen.finished:
        _act(gen.step)
    if gen.finished or keys.message(S, "buttons"):
        S[keys.RUNNING] = False


def continue_run() -> None:
    """Queue the next token of a Run (a full rerun when this run was not a fragment run),
    once this token has been on screen for RUN_FRAME_S (ui/state.py)."""
    started = S.get(keys.RUN_FRAME_STARTED, time.monotonic())
    time.sleep(max(0.0, keys.RUN_FRAME_S - (time.monotonic() - started)))
    try:
        st.rerun(scope="fragment")
    except StreamlitAPIException:
        st.rerun()


@st.fragment(key=WORKSPACE_KEY)
def workspace() -> None:
    """Buttons and every panel: reruns alone on Step, Back, Reset, Run and branch clicks."""
    gen = _generation()
    if gen is None:
        st.info("Type a prompt above to start.")
        return
    if S.get(keys.RUNNING):
        advance_run(gen)
    button_row(gen)
    panels.context_panel(gen, _prompt_chips(gen), legend=not presentation())
    sampler_view()
    if presentation():
        left, right = st.columns(2, gap="medium")
        with left:
            st.markdown("#### Termination")
            panels.termination_panel(gen)
        with right:
            st.markdown("#### Sequence probability")
            panels.sequence_panel(gen, basis_key=keys.SEQ_BASIS, table=False)
    else:
        detail_tabs(gen)
    publish_link(gen)
    if S.get(keys.RUNNING):
        continue_run()


def presentation() -> bool:
    return bool(S.get(keys.PRESENTATION))


# ---- sampler controls, distribution, decision, candidates (nested fragment) ------------------


def _range(key: str) -> dict:
    """A widget's min, max and step, from the one table links and traces are checked against."""
    low, high, step = keys.RANGES[key]
    return {"min_value": low, "max_value": high, "step": step}


def sampler_controls() -> None:
    st.markdown("#### Sampler")
    st.slider("Temperature", **_range(keys.TEMPERATURE), key=keys.TEMPERATURE, persist_state="session",
              help="0 = greedy (argmax). Below 1 sharpens the distribution, above 1 flattens it.")
    st.slider("Top-k", **_range(keys.TOP_K), key=keys.TOP_K, persist_state="session",
              help="Keep the k most probable tokens (0 = off).")
    st.slider("Top-p", **_range(keys.TOP_P), key=keys.TOP_P, persist_state="session",
              help="Keep the most probable tokens until their mass reaches p (1 = off).")
    if presentation():
        return
    st.slider("Min-p", **_range(keys.MIN_P), key=keys.MIN_P, persist_state="session",
              help="Drop tokens below min-p × the top token's probability (0 = off).")
    st.slider("Repetition penalty", **_range(keys.REPETITION), key=keys.REPETITION, persist_state="session",
              help="Above 1 makes tokens already in the context less likely (1 = off).")
    st.selectbox("Chain order", list(CHAINS), key=keys.CHAIN, persist_state="session",
                 help="The order the stages run in, as in each engine: " + "; ".join(
                     f"{name}: {' → '.join(stages)}" for name, stages in CHAINS.items()))


def resample_cached(gen: Generation, sampler: SamplerSettings) -> Resampled:
    """The latest step re-sampled under `sampler`, remembered per visitor until the latest step
    changes, so dragging a slider back over values already seen costs nothing."""
    record = gen.steps[-1]
    cached_for, cache = S.get("st_resampled", (None, {}))
    if cached_for is not record:
        cache = {}
        S["st_resampled"] = (record, cache)
    if sampler not in cache:
        cache[sampler] = gen.resample(sampler)
    return cache[sampler]


@st.fragment(key=SAMPLER_VIEW_KEY)
def sampler_view() -> None:
    """Sampler controls, distribution, re-sample note, decision and branch buttons: reruns
    alone when a control moves, re-sampling the latest step's kept logits (no forward pass).
    The next Step uses the same settings. The chart is drawn first: the browser shows the
    elements in the order they arrive, and the chart is what a student is watching."""
    gen = _generation()
    view_col, control_col = st.columns([3, 1.3], gap="medium")
    try:
        sampler = keys.sampler_from(S)  # the controls' values are in session_state already
        problem = None
    except SettingsError as exc:
        sampler, problem = gen.sampler, str(exc)
    gen.sampler = sampler
    record = gen.steps[-1] if gen.steps else None
    changed = record is not None and sampler != record.decision.settings
    if record is None:
        view_col.info("Press **Step**: the first forward pass reads the whole prompt at once (prefill) and "
                      "gives the distribution for the first new token.")
    else:
        view = resample_cached(gen, sampler) if changed else record  # the kept logits, the same u
        decision, distribution = view.decision, view.distribution
        with view_col:
            panels.distribution_panel(record, decision, distribution, mode_key=keys.CHART_MODE,
                                      chart_key="st_distribution_chart", font_size=20 if presentation() else 13)
    with control_col:
        sampler_controls()
        if problem:
            st.error(problem, icon=":material/back_hand:")
    publish_link(gen)
    if record is None:
        return
    with view_col:
        if changed:
            panels.resample_note(record, decision, gen.lm.texts, on_repick, "st_repick")
        panels.decision_panel(decision, distribution, gen.lm.texts)
    if not presentation():
        with control_col:
            panels.candidates_panel(record, distribution, on_branch, key_prefix="st_force_")


# ---- the detail tabs (only the open one is computed) -----------------------------------------

TABS = ("Termination", "P(sequence)", "KV cache", "History", "Share")


def detail_tabs(gen: Generation) -> None:
    tabs = st.tabs(list(TABS), key="st_tabs", on_change="rerun")
    views = (panels.termination_panel,
             lambda g: panels.sequence_panel(g, basis_key=keys.SEQ_BASIS),
             lambda g: panels.kv_panel(g, "st_kv_chart"),
             lambda g: panels.history_panel(g, "st_history"),
             share_panel)
    for tab, view in zip(tabs, views, strict=True):
        if tab.open:
            with tab:
                view(gen)


def share_panel(gen: Generation) -> None:
    params = publish_link(gen)
    base = (st.context.url or "").split("?")[0]
    st.markdown("**Share link**: opens this exact state (model, prompt, settings, seed, every step and "
                "forced token); the address bar always holds it.")
    st.code(f"{base}?{urlencode(params, doseq=True)}", language=None, wrap_lines=True)
    st.download_button("Download trace (JSON)", data=lambda: json.dumps(to_trace(gen), indent=1,
                                                                        ensure_ascii=False),
                       file_name="token-by-token-trace.json", mime="application/json", key="st_trace_download",
                       on_click="ignore")
    st.file_uploader("Load a trace", type=["json"], key="st_trace_upload", on_change=on_trace_upload,
                     help="A trace downloaded from this app; its steps are replayed on the current model.")
    if problem := keys.message(S, "trace_error"):
        st.error(problem, icon=":material/back_hand:")
    elif note := keys.message(S, "trace"):
        st.success(note)


# ---- the page --------------------------------------------------------------------------------


def main() -> None:
    ensure_app_frame()
    lm = current_model()
    keys.init_defaults(S)
    apply_link_once()
    st.html(PAGE_CSS + PANEL_CSS + (PRESENTATION_CSS if presentation() else ""))
    st.header("Step through", anchor=False)
    st.caption("One click = one token. Each step runs the model on the context, turns its scores into a "
               "distribution over the whole vocabulary, picks one token, appends it, and checks whether to stop.")
    if problem := keys.message(S, "link"):
        st.warning(problem, icon=":material/link:")
    sync_generation(lm)  # widget values are already in session_state; messages then show beside them
    # on a projector the setup folds away so the generation gets the screen
    with st.expander("Prompt and settings") if presentation() else st.container():
        setup_controls()
        templated_text()
    workspace()


main()
