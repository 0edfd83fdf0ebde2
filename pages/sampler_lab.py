"""Sampler lab: one frozen next-token distribution, several samplers side by side.

The page is layout only: which step is frozen, the sliders' settings and the remembered
results are ui/controllers/sampler_lab.py, plain functions over the visitor's state; the numbers are
ui/domain/sampler_lab.py's, from the engine's own sampler.
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
import torch

from engine import CHAINS, LoadedModel, SamplerSettings
from ui.controllers import sampler_lab as lab
from ui.domain import (
    FrozenStep,
    Outcome,
    apply,
    chain_outcomes,
    disputed_tokens,
    min_p_sweep,
    nucleus_sweep,
    outcome_distribution,
    temperature_sweep,
)
from ui.server import current_model, current_scheduler
from ui.session import LAB
from ui.views import (
    LINE_CSS,
    chain_name,
    chains_figure,
    cut_figure,
    distribution_bars_html,
    draws_figure,
    esc,
    pct,
    plain,
    quoted,
    settings_figure,
    temperature_figure,
    token_labels,
)
from ui.widgets import EMBED_ROWS, current_theme, described_chart, embedded, ensure_app_frame, html, page_style

S = st.session_state
SHOWN_TOKENS = 10
DISPUTED_ROWS = 8  # tokens listed under "kept by some chains and cut by others"
DECADES = [10.0 ** e for e in range(-3, 1)]  # the min-p sweep's axis: 0.001 to 1
FIFTHS = [i / 5 for i in range(6)]  # the top-p sweep's axis: 0 to 1


def choose_step(lm: LoadedModel) -> tuple[tuple, FrozenStep] | None:
    """The frozen step: the visitor's live generation if there is one, else a preset."""
    choice = st.selectbox("Distribution to study", lab.sources(S, lm), key=LAB.source,
                          label_visibility="collapsed" if embedded() else "visible",
                          help="Take a step on the Step-through page to bring its distribution here.")
    if choice in lab.PRESETS and not embedded():
        st.caption(lab.PRESETS[choice].about)
    with st.spinner("Running the model once…"):
        chosen = lab.frozen_step(S, lm, choice, current_scheduler())
    if chosen is None:
        st.error(plain(lab.lab_message(S, "source") or ""))
    return chosen


def column_settings(column: lab.Column, vocab_size: int, *, penalty: bool = True) -> SamplerSettings | None:
    """Sliders for one column; None (with the reason shown) when the settings are invalid.
    Without `penalty`, the repetition penalty keeps the column's default (off)."""
    d = column.defaults
    k = column.key
    st.slider("temperature", 0.0, 3.0, d.temperature, 0.05, key=f"{k}_temperature",
              help="0 = greedy (always the most probable token)")
    st.number_input("top-k (0 = off)", 0, vocab_size, d.top_k, key=f"{k}_top_k")
    st.slider("top-p (1 = off)", 0.0, 1.0, d.top_p, 0.01, key=f"{k}_top_p")
    st.slider("min-p (0 = off)", 0.0, 1.0, d.min_p, 0.01, key=f"{k}_min_p")
    if penalty:
        st.slider("repetition penalty (1 = off)", 0.5, 2.0, d.repetition_penalty, 0.05, key=f"{k}_penalty")
    settings = lab.column_sampler(S, column)
    if settings is None:
        st.error(plain(lab.lab_message(S, column.name) or ""))
    return settings


def show_outcome(lm: LoadedModel, outcome: Outcome) -> None:
    """The pick and the size and spread of the final distribution."""
    decision = outcome.decision
    st.metric("picks", quoted(lm.texts.piece(decision.token_id).text))
    rank = f" · its rank **#{decision.draw.rank}**" if decision.draw is not None else " · greedy: the top token"
    st.markdown(f"final probability **{pct(decision.final_prob)}**{rank} · tokens kept **{decision.final_kept:,}** "
                f"· entropy **{decision.final_entropy_bits:.2f} bits**")


def shown_tokens(step: FrozenStep, outcomes: list[Outcome]) -> list[int]:
    """The most probable tokens, plus every pick, most probable first."""
    ids = torch.topk(step.logits, SHOWN_TOKENS).indices.tolist()
    for token_id in (o.decision.token_id for o in outcomes):
        if token_id not in ids:
            ids.append(token_id)
    return sorted(ids, key=lambda i: -float(step.logits[i]))


def texts(lm: LoadedModel, ids: list[int]) -> dict[int, str]:
    """Each token's visible text, by id."""
    return {i: lm.texts.piece(i).text for i in ids}


def kept_table(lm: LoadedModel, step: FrozenStep, ids: list[int], named: dict[str, Outcome]) -> pd.DataFrame:
    """Token by token: the raw probability, then each setting's final probability or 'cut'."""
    raw = step.logits.softmax(dim=-1)
    rows = []
    for label, token_id in zip(token_labels(texts(lm, ids), step.logits, ids), ids, strict=True):
        row = {"token": label, "raw softmax": pct(float(raw[token_id]))}
        for name, outcome in named.items():
            p = float(outcome.chain.final_probs[token_id])
            row[name] = ("★ " if token_id == outcome.decision.token_id else "") + (pct(p) if p > 0 else "cut")
        rows.append(row)
    return pd.DataFrame(rows)


def side_by_side(lm: LoadedModel, step: FrozenStep, u: float | None) -> dict[str, Outcome]:
    """Three sampler columns on the frozen logits: their picks, a chart and the kept sets."""
    st.header("Three samplers on the same logits")
    draw = "the step's own random draw" if u is None else f"the random number u = {u:.3f}"
    st.markdown(f"Each column reshapes **the same raw logits** with its own settings, then picks with **{draw}**. "
                "Only the settings differ, so any difference in the pick comes from them. A draw near 1 reaches "
                "far down the list: a sampler that cuts nothing can then pick a rare token.")
    named: dict[str, Outcome] = {}
    for column, slot in zip(lab.COLUMNS, st.columns(len(lab.COLUMNS)), strict=True):
        with slot:
            st.subheader(f"Sampler {column.name}")
            settings = column_settings(column, lm.vocab_size)
            if settings is not None:
                named[f"Sampler {column.name}"] = outcome = apply(step, settings, u)
                show_outcome(lm, outcome)
    if not named:
        return named
    ids = shown_tokens(step, list(named.values()))
    labels = token_labels(texts(lm, ids), step.logits, ids)
    picks = [quoted(lm.texts.piece(o.decision.token_id).text) for o in named.values()]
    described_chart(settings_figure(labels, step.logits.softmax(dim=-1), ids, list(named.items()), picks,
                                    theme=current_theme()),
                    key=LAB.settings_chart)
    st.markdown("**Kept sets.** ‘cut’ means the sampler set that token's probability to zero; ★ marks the pick.")
    st.dataframe(kept_table(lm, step, ids, named), hide_index=True, height="content")
    return named


@st.fragment
def sweeps(step: FrozenStep, step_key: tuple) -> None:
    """Temperature, top-p and min-p swept one at a time over the frozen logits."""
    st.header("Sweeps: one knob at a time")
    t_tab, p_tab, m_tab = st.tabs(["Temperature", "Top-p (nucleus)", "Min-p"])
    with t_tab:
        marked = st.slider("temperature to read off", 0.1, 3.0, 0.7, 0.05, key=LAB.sweep_temperature)
        temps = [round(0.1 * i, 2) for i in range(1, 31)]
        points = lab.memo(S, (*step_key, "temperature"), lambda: temperature_sweep(step, temps))
        here = temperature_sweep(step, [marked])[0]
        st.markdown(f"At **T = {marked:g}**: entropy **{here.entropy_bits:.2f} bits**, top token "
                    f"**{pct(here.top_prob)}**. Below 1 the top token takes more of the mass and the entropy "
                    "falls towards 0 (greedy); above 1 the mass spreads over more tokens.")
        figure = lab.rebuildable(S, (*step_key, "temperature_chart", marked, current_theme()),
                                 lambda: temperature_figure(points, marked, theme=current_theme()))
        described_chart(figure, key=LAB.temperature_chart)
    with p_tab:
        marked = st.slider("top-p to read off", 0.05, 1.0, 0.9, 0.01, key=LAB.sweep_top_p)
        ps = [round(0.05 * i, 2) for i in range(1, 20)] + [0.97, 0.99, 1.0]
        points = lab.memo(S, (*step_key, "top_p"), lambda: nucleus_sweep(step, ps))
        here = nucleus_sweep(step, [marked])[0]
        st.markdown(f"Top-p **{marked:g}** keeps **{here.kept:,}** token{'' if here.kept == 1 else 's'}: the fewest "
                    "most-probable tokens whose probabilities add up to at least p (at temperature 1). A confident "
                    "step needs few tokens to reach p; an uncertain one needs many.")
        figure = lab.rebuildable(S, (*step_key, "top_p_chart", marked, current_theme()),
                                 lambda: bounded_axes(cut_figure(points, "top-p", marked, theme=current_theme()),
                                                      FIFTHS))
        described_chart(figure, key=LAB.top_p_chart)
    with m_tab:
        marked = st.slider("min-p to read off", 0.01, 1.0, 0.1, 0.01, key=LAB.sweep_min_p)
        ms = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0]
        points = lab.memo(S, (*step_key, "min_p"), lambda: min_p_sweep(step, ms))
        here = min_p_sweep(step, [marked])[0]
        st.markdown(f"Min-p **{marked:g}** cuts every token below **{marked:g} × the top token's probability = "
                    f"{here.threshold:.3g}** and keeps **{here.kept:,}** token{'' if here.kept == 1 else 's'} (at "
                    "temperature 1). The cut moves with the model's confidence: a sure top token raises it.")
        figure = lab.rebuildable(S, (*step_key, "min_p_chart", marked, current_theme()),
                                 lambda: bounded_axes(cut_figure(points, "min-p", marked, log_x=True,
                                                                 theme=current_theme()), DECADES))
        described_chart(figure, key=LAB.min_p_chart)


def bounded_axes(figure: go.Figure, x_ticks: list[float]) -> go.Figure:
    """A sweep's axes end where its setting does (0 to 1, 0.001 to 1 for min-p), and the log
    axes label only powers of ten: no 2s and 5s between them."""
    log_x = figure.layout.xaxis.type == "log"
    low, high = x_ticks[0], x_ticks[-1]
    figure.update_xaxes(range=[math.log10(low), math.log10(high)] if log_x else [low, high],
                        tickvals=x_ticks, ticktext=[f"{t:g}" for t in x_ticks])
    if log_x:  # add_vline puts its label at the data value, where a log axis reads log10 of it
        figure.for_each_annotation(lambda note: note.update(x=math.log10(note.x)))
    figure.update_yaxes(dtick=1, tickformat=",d")
    figure.update_traces(cliponaxis=False)  # the points at the axis' ends are drawn whole
    return figure


def chain_settings(vocab_size: int) -> SamplerSettings | None:
    """One set of settings for the chain-order comparison; None (reason shown) if invalid."""
    cols = st.columns(4)
    cols[0].slider("temperature", 0.05, 3.0, 1.5, 0.05, key=LAB.chain_temperature)
    cols[1].number_input("top-k (0 = off)", 0, vocab_size, 40, key=LAB.chain_top_k)
    cols[2].slider("top-p", 0.0, 1.0, 0.9, 0.01, key=LAB.chain_top_p)
    cols[3].slider("min-p", 0.0, 1.0, 0.05, 0.01, key=LAB.chain_min_p)
    settings = lab.chain_sampler(S)
    if settings is None:
        st.error(plain(lab.lab_message(S, "chain") or ""))
    return settings


@st.fragment
def chain_orders(lm: LoadedModel, step: FrozenStep, step_key: tuple) -> None:
    """The same settings under transformers', vLLM's and llama.cpp's stage orders."""
    st.header("Same settings, three engines' chain orders")
    st.markdown("Engines apply the same stages in different orders. **transformers**: temperature → top-k → "
                "top-p → min-p. **vLLM**: temperature → min-p → top-k → top-p. **llama.cpp**: top-k → top-p → "
                "min-p → temperature last. A filter sees the distribution left by the stages before it, "
                "so the kept sets can differ.")
    settings = chain_settings(lm.vocab_size)
    if settings is None:
        return
    outcomes = lab.rebuildable(S, (*step_key, "chains", settings), lambda: chain_outcomes(step, settings))
    st.dataframe(pd.DataFrame([{
        "chain": chain_name(name),
        "order": " → ".join(s.replace("_", "-") for s in CHAINS[name] if s != "repetition_penalty"),
        "tokens kept": o.decision.final_kept, "picks": quoted(lm.texts.piece(o.decision.token_id).text),
        "pick's final probability": pct(o.decision.final_prob),
        "entropy (bits)": o.decision.final_entropy_bits} for name, o in outcomes.items()]),
        hide_index=True, column_config={"entropy (bits)": st.column_config.NumberColumn(format="%.3f")})
    disputed = disputed_tokens(step, outcomes)
    if disputed:
        shown = disputed[:DISPUTED_ROWS]
        which = f" (the {len(shown)} most probable shown)" if len(shown) < len(disputed) else ""
        st.markdown(f"**{len(disputed):,} token{'s are' if len(disputed) > 1 else ' is'} kept by some chains and "
                    f"cut by others{which}:**")
        st.dataframe(pd.DataFrame([{"token": label, **{name: "kept" if i in o.kept_ids else "cut"
                                                        for name, o in outcomes.items()}}
                                   for label, i in zip(token_labels(texts(lm, shown), step.logits, shown), shown,
                                                       strict=True)]),
                     hide_index=True, height="content")
    else:
        st.markdown("**All three orders keep exactly the same tokens here.** Try a temperature further from 1 "
                    "with top-p below 1, or min-p together with top-p.")
    kept_any = sorted(frozenset().union(*(o.kept_ids for o in outcomes.values())), key=lambda i: -float(step.logits[i]))
    ids = kept_any[:SHOWN_TOKENS]
    picks = {name: quoted(lm.texts.piece(o.decision.token_id).text) for name, o in outcomes.items()}
    described_chart(lab.rebuildable(S, (*step_key, "chains_chart", settings, current_theme()),
                          lambda: chains_figure(token_labels(texts(lm, ids), step.logits, ids), ids, outcomes, picks,
                                                theme=current_theme())),
                    key=LAB.chain_chart)


def empirical_check(lm: LoadedModel, step: FrozenStep, step_key: tuple, named: dict[str, Outcome]) -> None:
    """1,000 draws with the engine's own draw, against the final distribution."""
    st.header(f"Check: {lab.DRAWS:,} draws from the engine's sampler")
    st.markdown(f"The engine draws one uniform number u from a seeded generator and picks the token whose band "
                f"of the cumulative distribution contains u. Done {lab.DRAWS:,} times, the share of draws each token "
                "gets should sit close to its final probability: typically within 1–3 percentage points at this count.")
    cols = st.columns([2, 1])
    # B (top-k 10) by default: a few kept tokens draw fast, since each draw sorts only those
    name = cols[0].selectbox("Sampler", list(named), index=min(1, len(named) - 1), key=LAB.draw_sampler)
    seed = int(cols[1].number_input("seed", 0, 2**31 - 1, 0, key=LAB.draw_seed))
    if name is None:
        return
    outcome = named[name]
    if st.button(f"Draw {lab.DRAWS:,} times", key=LAB.draw_button, type="primary"):
        with st.spinner(f"Drawing {lab.DRAWS:,} tokens…"):
            lab.draw(S, step_key, outcome, seed)
    key, counts = lab.draws(S, step_key, outcome, seed)
    if counts is None:
        st.info(f"Press **Draw {lab.DRAWS:,} times** to sample from {name}'s final distribution.")
        return
    ids = torch.topk(outcome.chain.final_probs, min(12, outcome.decision.final_kept)).indices.tolist()
    labels = token_labels(texts(lm, ids), step.logits, ids)
    shown = sum(counts.get(i, 0) for i in ids)
    figure = lab.rebuildable(S, (*key, "chart", current_theme()),
                             lambda: draws_figure(labels, ids, counts, lab.DRAWS, outcome.chain.final_probs,
                                                  theme=current_theme()))
    described_chart(figure, key=LAB.draws_chart)
    worst = max(abs(counts.get(i, 0) / lab.DRAWS - float(outcome.chain.final_probs[i])) for i in ids)
    came_up = f"{len(counts):,} different tokens came up" if len(counts) > 1 else "Only one token came up"
    st.markdown(f"{came_up}; the {len(ids)} shown took {shown:,} draws. "
                f"Largest gap between share and probability: **{100 * worst:.1f} percentage points**.")


@st.fragment
def compact_lab(lm: LoadedModel, step: FrozenStep, step_key: tuple) -> None:
    """Inside a course page's frame (embed): one sampler's sliders beside what they do to the
    distribution, the pick marked; the sweeps, the chain orders and the draws below, and the three
    columns side by side in the full lab."""
    column = lab.COLUMNS[0]
    left, right = st.columns([2, 3], gap="medium")
    with left:
        settings = column_settings(column, lm.vocab_size, penalty=False)
    if settings is None:
        return
    outcome = apply(step, settings)
    pick = outcome.decision
    with right:
        html(LINE_CSS + f'<div class="tbt-title">Picks {esc(quoted(lm.texts.piece(pick.token_id).text))} · final '
             f"{pct(pick.final_prob)} · {pick.final_kept:,} token{'' if pick.final_kept == 1 else 's'} kept</div>"
             + distribution_bars_html(outcome_distribution(lm, step, outcome, EMBED_ROWS), pick.token_id,
                                      EMBED_ROWS))
    st.page_link(st.context.url.split("?")[0], label="Three samplers side by side: open the full lab",
                 icon=":material/open_in_new:")
    sweeps(step, step_key)
    chain_orders(lm, step, step_key)
    empirical_check(lm, step, step_key, {f"Sampler {column.name}": outcome})


# Each section is a fragment: a slider reruns (and the browser redraws) only its own section.


@st.fragment
def samplers_section(lm: LoadedModel, step: FrozenStep, step_key: tuple, u: float | None) -> None:
    """The three samplers side by side, then 1,000 draws from one of them."""
    named = side_by_side(lm, step, u)
    if named:
        empirical_check(lm, step, step_key, named)


def main() -> None:
    """The page, top to bottom."""
    ensure_app_frame()
    page_style()
    st.title("Sampler lab")
    if not embedded():
        st.markdown("The model's forward pass ends in one score (logit) per vocabulary token. Here that output is "
                    "**frozen**: every control below only changes the sampler, never the model's numbers.")
    lm = current_model()
    chosen = choose_step(lm)
    if chosen is None:
        return
    step_key, step = chosen
    if embedded():
        compact_lab(lm, step, step_key)
        return
    top = int(step.logits.argmax())
    st.markdown(f"**Frozen step:** {step.source}. The model read {step.context_ids.numel():,} tokens; its most "
                f"probable next token is {quoted(lm.texts.piece(top).text)} at "
                f"{pct(float(step.logits.softmax(dim=-1)[top]))} (raw softmax).")
    with st.expander("What the model read"):
        st.code(step.context_text, language=None, wrap_lines=True)
    own = f"u = {step.u:.6f}" if step.u is not None else "a multinomial draw, no single u"
    own_draw = st.checkbox(f"Use the step's own random draw ({own})", True, key=LAB.own_draw)
    u = None if own_draw else st.slider("random draw u", 0.0, 0.999, 0.5, 0.001, format="%.3f", key=LAB.u)
    samplers_section(lm, step, step_key, u)
    sweeps(step, step_key)
    chain_orders(lm, step, step_key)


if __name__ == "__main__":  # Streamlit runs a page as __main__; an import only defines it
    main()
