"""Streamlit panels that show one Generation: each is a view of the engine's step records.

Pages decide the layout and pass in the callbacks (ui/controllers/step_through.py's functions); these
functions only draw. Widget keys are the ones a page passes in (ui/session/keys.py), so two pages can
show the same panel.
"""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from engine import (
    Decision,
    Distribution,
    Generation,
    InsideView,
    StepRecord,
    TokenTexts,
    stop_sequence_states,
)
from ui.session.keys import STEP
from ui.views import inside as inside_views
from ui.views.bars import distribution_bars_html
from ui.views.charts import (
    CHART_CONFIG,
    FINAL_NAME,
    MODES,
    RAW_NAME,
    distribution_figure,
    distribution_words,
    figure_words,
    kv_figure,
    kv_words,
)
from ui.views.chips import chip_window, context_html
from ui.views.format import SR_ONLY_STYLE, chain_name, esc, pct, plain, quoted, sr_only
from ui.views.records import (
    LINE_CSS,
    cdf_strip_html,
    decision_html,
    decision_line_html,
    decoded_text_html,
    eos_names,
    factorisation_html,
    heading_html,
    kv_check_html,
    sequence_stats,
    sequence_table_html,
    stages_html,
    termination_html,
    termination_line_html,
    token_name,
)
from ui.widgets.theme import current_theme

CANDIDATES_SHOWN = 8


class _AsWritten(str):
    """HTML that st.html sends as it is: given a plain string, Streamlit first asks the file
    system whether it names a file, then dedents and strips it, a regex pass over the whole
    text (a cost on every Step for the context panel's chips, seen in a profile of the
    server); an object with `_repr_html_` it takes as written. Our HTML has no indentation to remove."""

    def _repr_html_(self) -> str:
        return str(self)


def html(body: str) -> None:
    """st.html for the HTML these panels build."""
    st.html(_AsWritten(body))


def decoded_text(gen: Generation) -> str:
    """The prompt and the output as text, a stop sequence marked (HTML)."""
    stops = stop_sequence_states(gen.output_text, gen.stop.stop_sequences)
    return decoded_text_html(gen.prompt_text, gen.output_text, stops, gen.finish_reason, eos_names(gen.lm))


def context_panel(gen: Generation, prompt_html: str, legend: bool = True) -> None:
    """The context as chips (prompt chips pre-rendered, they never change) and as decoded text."""
    with st.container(border=True):
        html(context_html(prompt_html, gen.steps, legend=legend) + decoded_text(gen))


def context_window_panel(gen: Generation, prompt_html: str, lines: int = 3) -> None:
    """Presentation mode: the chips in a window `lines` high that shows the newest ones."""
    with st.container(border=True):
        html(chip_window(context_html(prompt_html, gen.steps, legend=False), lines))


def heading(title: str, caption: str, words: str = "") -> None:
    """A panel's title (a level-3 heading) and its plain-words caption (HTML) as one element (each
    element costs the browser a re-render on every rerun, so panels keep their count low); `words`,
    a chart's text alternative, goes with them for a screen reader."""
    html(heading_html(title, caption) + (sr_only(words, "div") if words else ""))


# An element holding only screen-reader text takes no room in the page's column (no gap for it)
ALONE_CSS = ('<style>[data-testid="stElementContainer"]:has(.tbt-sr-alone){position:absolute;width:1px;height:1px;'
             "overflow:hidden}</style>")


def described_chart(figure: object, *, key: str, words: str | None = None, where: object = st) -> None:
    """A Plotly chart and, for a screen reader, what it shows in words (read from the figure unless
    given), in `where` (the page, or a column)."""
    where.plotly_chart(figure, config=CHART_CONFIG, key=key)
    where.html(_AsWritten(ALONE_CSS + f'<div class="tbt-sr-alone" style="{SR_ONLY_STYLE}">'
                          f"{esc(words or figure_words(figure))}</div>"))


def distribution_panel(record: StepRecord, decision: Decision, distribution: Distribution, *,
                       mode_key: str, chart_key: str) -> None:
    """The next-token distribution of the latest step: raw and final side by side, and the same
    rows in words for a screen reader."""
    vocabulary = record.distribution.others_count + len(record.distribution.top)
    mode = st.session_state.get(mode_key) or MODES[0]  # the switch is drawn under the chart, read first
    heading(f"Next-token distribution at step {record.index}",
            f"The model scores all {vocabulary:,} tokens of its vocabulary. <b>Blue: {RAW_NAME}</b>, the softmax "
            f"of its logits. <b>Orange, striped: {FINAL_NAME}</b>, after the sampler chain reshaped it ('cut': "
            f"the sampler removed that token). The highlighted row (▶) is the pick. Entropy (uncertainty, "
            f"0 = certain): raw {distribution.raw_entropy_bits:.2f} bits, final "
            f"{distribution.final_entropy_bits:.2f} bits.",
            distribution_words(distribution, decision.token_id, mode=mode, top_n=10))
    figure = distribution_figure(distribution, decision.token_id, mode=mode, top_n=10, theme=current_theme())
    st.plotly_chart(figure, config=CHART_CONFIG, key=chart_key)
    st.segmented_control("Scale", list(MODES), key=mode_key, label_visibility="collapsed", persist_state="session")


def distribution_bars_panel(record: StepRecord, decision: Decision, distribution: Distribution, top_n: int = 8
                            ) -> None:
    """Presentation mode: the distribution as viewport-sized bars, the top `top_n` and the rest."""
    html(LINE_CSS + f'<div class="tbt-title">Next-token distribution at step {record.index} · entropy raw '
         f"{distribution.raw_entropy_bits:.2f}, final {distribution.final_entropy_bits:.2f} bits</div>"
         + distribution_bars_html(distribution, decision.token_id, top_n))


def decision_line_panel(decision: Decision, distribution: Distribution, texts: TokenTexts) -> None:
    """Presentation mode: the pick in one line, and for a random draw the strip u fell on."""
    html(LINE_CSS + '<div class="tbt-title">Sampler decision</div>' + decision_line_html(decision, texts)
         + cdf_strip_html(decision, distribution))


def termination_line_panel(gen: Generation) -> None:
    """Presentation mode: every stop condition in one line."""
    line = (termination_line_html(gen.termination, eos_names(gen.lm)) if gen.steps else
            '<div class="tbt-line tbt-check">Checked after every token: end token, stop sequences, max tokens.</div>')
    html(LINE_CSS + '<div class="tbt-title">Check: stop or go on?</div>' + line)


def resample_note(record: StepRecord, decision: Decision, texts: TokenTexts,
                  on_repick: Callable[[], None], button_key: str) -> None:
    """Say what a slider change did to the latest step, and offer to take the step again."""
    same = decision.token_id == record.token_id
    verdict = ("still picks " + quoted(record.token.text) if same else
               f"would pick {token_name(texts, decision.token_id)} instead of {quoted(record.token.text)}")
    st.info(f"Re-sampled step {record.index} from its kept logits with the new settings (no forward pass, "
            f"the same random number u): it {verdict}. The next Step uses these settings.", icon=":material/tune:")
    if not same:
        st.button(f"Take step {record.index} again with these settings", key=button_key, on_click=on_repick)


def decision_and_branch_panel(record: StepRecord, decision: Decision, distribution: Distribution, texts: TokenTexts,
                              on_choice: Callable[[str, int], None], key_prefix: str) -> None:
    """The sampler chain stage by stage, then the draw (or argmax, or the forced token); then
    the latest step's top candidates as one row of pills, its pick marked: choosing another
    forces it as the step's token (a branch). Both panels' text is one element and the
    candidates one widget, not a button each: every element here is sent again on each Step.
    `on_choice(key, pick)` reads the choice under `key`."""
    html(heading_html("Sampler decision", f"Stages in {esc(chain_name(decision.settings.chain))} order. Each one "
                      "removes tokens or reshapes the distribution; the last one leaves the final distribution the "
                      "pick is drawn from.")
         + stages_html(decision) + decision_html(decision, distribution, texts)
         + heading_html("Branch", f"What if another token had been picked? The marked one is step {record.index}'s "
                        "pick; choose another to force it, and Step continues from there. Each shows its raw "
                        "probability (the model's softmax, before the sampler)."))
    top = distribution.top[:CANDIDATES_SHOWN]
    labels = {candidate.token_id: f"{quoted(candidate.text)} {pct(candidate.prob)}" for candidate in top}
    # a new widget for each pick, so it opens with the pick marked
    key = f"{key_prefix}{record.index}_{record.token_id}"
    st.pills("Force a candidate", list(labels), format_func=labels.__getitem__, key=key,
             default=record.token_id if record.token_id in labels else None, label_visibility="collapsed",
             on_change=on_choice, args=(key, record.token_id))


def termination_panel(gen: Generation) -> None:
    """Every stop condition's state at the latest step; the one that fired highlighted."""
    if not gen.steps:
        st.caption("After every token four conditions are checked: the end-of-sequence token, stop "
                   "sequences, max new tokens and the context window.")
        return
    termination = gen.termination
    html(termination_html(termination, eos_names(gen.lm)))
    if termination != gen.steps[-1].termination:
        st.info("The stop settings changed after this step; the conditions above are re-checked under "
                "the new settings" + (f": generation ends here ({termination.finish_reason.replace('_', ' ')})."
                                      if termination.finish_reason else ", and generation can go on."))


def sequence_panel(gen: Generation, *, basis_key: str, table: bool = True) -> None:
    """log P of the sequence, perplexity and the product of conditionals with real numbers."""
    if not gen.steps:
        st.caption("The probability of the whole output is the product of each token's probability "
                   "given everything before it.")
        return
    basis = st.radio("Probability used", ["raw", "final"], key=basis_key, horizontal=True,
                     persist_state="session",
                     format_func=lambda b: "raw softmax (the model's own)" if b == "raw"
                     else "final (after the sampler)")
    stats = sequence_stats(gen.steps, basis)
    a, b, c = st.columns(3)
    a.metric("log P(sequence)", f"{stats.total:.3f}")
    b.metric("perplexity", f"{stats.perplexity:.3f}")
    c.metric("tokens", len(gen.steps))
    html(factorisation_html(gen.steps, stats, basis) + (sequence_table_html(gen.steps, stats) if table else ""))
    st.caption("Raw (the default) is the model's own probability of each token given the prompt and the tokens "
               "before it, whatever the sampler did. Final is the probability in the distribution each token "
               "was drawn from (1 under greedy). Natural logs; perplexity = exp(−mean log P).")


def kv_panel(gen: Generation, chart_key: str) -> None:
    """KV cache positions and bytes against step, with the formula cross-check."""
    if not gen.steps:
        st.caption("The KV cache fills on the first step (every prompt position at once), then grows by one "
                   "position per step.")
        return
    record = gen.steps[-1]
    fed = record.forward_tokens
    st.caption(f"Step 1 fed all {gen.steps[0].forward_tokens} prompt tokens at once (prefill). Each later step "
               "feeds one token and reuses the keys and values of every earlier position (a token's own "
               "keys and values enter the cache when the next step reads it). "
               f"The latest step fed {fed} token{'' if fed == 1 else 's'} (forward pass "
               f"{record.timing.forward_ms:.0f} ms).")
    st.plotly_chart(kv_figure(gen.steps, theme=current_theme()), config=CHART_CONFIG, key=chart_key)
    html(sr_only(kv_words(gen.steps), "div") + kv_check_html(record.kv))


def inside_panel(gen: Generation, view: InsideView | str | None, head_key: str) -> None:
    """Inside the latest step's forward pass: the logit lens per layer, where the new token's
    query looks, and what each layer cost."""
    heading("Inside the forward pass", "What each layer would predict if the model stopped there (the raw logit "
            "lens), where the fed token's query looks over the cached keys, and the time and bytes of each layer, "
            "measured in this step's pass.")
    if view is None:
        st.caption("Take a step: its forward pass is opened up here, and every later step's while this view is open.")
        return
    if isinstance(view, str):
        st.warning(plain(view), icon=":material/back_hand:")
        return
    record = gen.steps[view.step - 1]
    for part in view.unavailable:
        st.info(plain(f"Not shown for this model: {part}."), icon=":material/info:")
    st.markdown(f"Step {view.step}: {inside_views.pass_text(view, record.token)}")
    formats = {"its p": "%.3f", "the pick's p": "%.4f", "entropy (bits)": "%.2f", "ms": "%.2f"}
    st.dataframe(inside_views.lens_table(view), hide_index=True, key=STEP.inside_table, column_config={
        name: st.column_config.NumberColumn(format=formats[name], help=text) if name in formats
        else st.column_config.Column(help=text) for name, text in inside_views.LENS_COLUMNS_HELP.items()})
    if view.layers[-1].attention is not None:
        head = st.selectbox("Attention of", inside_views.head_choices(view), key=head_key,
                            help="Grouped-query attention: several query heads read the same KV head.")
        described_chart(inside_views.attention_figure(view, gen.prompt_pieces + [s.token for s in gen.steps], head),
                        key=STEP.inside_attention)
    described_chart(inside_views.times_figure(view), key=STEP.inside_times)
    st.caption(inside_views.steadiness_text(view))
    st.markdown(inside_views.bytes_text(view))
    with st.expander("What this shows"):
        for lesson in inside_views.lessons(view):
            st.markdown(lesson)


def history_panel(gen: Generation, table_key: str) -> None:
    """Every step in one table."""
    if not gen.steps:
        st.caption("Every step will be listed here.")
        return
    rows = [{"step": s.index, "position": s.position, "token": quoted(s.token.text), "id": s.token_id,
             "raw p": s.prob, "final p": s.final_prob, "rank": s.rank, "forced": s.decision.forced,
             "u": draw_text(s.decision), "entropy (bits)": round(s.distribution.raw_entropy_bits, 3),
             "KV positions": s.kv.positions, "forward ms": round(s.timing.forward_ms, 1),
             "stop": s.termination.finish_reason or "–"}
            for s in gen.steps]
    small = st.column_config.Column(width="small")
    st.dataframe(rows, hide_index=True, key=table_key,
                 column_config={"raw p": st.column_config.NumberColumn(format="%.4f", width="small"),
                                "final p": st.column_config.NumberColumn(format="%.4f", width="small"),
                                "u": st.column_config.TextColumn(width="small", help="the random number drawn; "
                                                                 "greedy steps draw none"),
                                **dict.fromkeys(("step", "position", "id", "rank", "forced", "KV positions",
                                                 "forward ms", "stop"), small)})


def draw_text(decision: Decision) -> str:
    """The history's u cell: the number drawn, or why there is none."""
    if decision.draw is None:
        return "greedy"
    return f"{decision.draw.u:.4f}" if decision.draw.u is not None else "multinomial"


# The live region keeps its element from run to run (the same place in the fragment, Markdown's
# same <div>), so a screen reader hears each new text, politely, after what it is reading.
LIVE_CSS = ('<style>[data-testid="stElementContainer"]:has(.tbt-live){position:absolute;width:1px;height:1px;'
            "overflow:hidden}</style>")


def step_words(gen: Generation) -> str:
    """What the live region says after a Step, Back or Reset: the latest token, how likely it was,
    and whether generation has ended."""
    if not gen.steps:
        return f"No token generated yet. The prompt is {len(gen.prompt_ids)} tokens."
    step = gen.steps[-1]
    how = "forced by you" if step.decision.forced else f"raw p {pct(step.prob)}, final p {pct(step.final_prob)}"
    ended = f" Finished: {gen.finish_reason.replace('_', ' ')}." if gen.finished else ""
    count = len(gen.steps)
    return f"Step {step.index}: {quoted(step.token.text)}, {how}. {count} token{'s' * (count != 1)} generated.{ended}"


def step_announcement(gen: Generation) -> None:
    """A visually hidden live region (role status: polite) that announces the latest token."""
    st.markdown(LIVE_CSS + f'<div class="tbt-live" role="status" aria-live="polite" aria-atomic="true" '
                f'style="{SR_ONLY_STYLE}">{esc(step_words(gen))}</div>', unsafe_allow_html=True)
