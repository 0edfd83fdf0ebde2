"""Lesson: a guided walk through one generation on the real model, one stage per screen,
and a predict-then-reveal exercise.

The page is layout only: what its controls do is ui/controllers/lesson.py, plain functions over
the visitor's state, and every screen is a view of the visitor's generations there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
import streamlit as st

from engine import Candidate, Generation, LoadedModel, StepRecord
from ui.controllers import lesson
from ui.domain import PREDICT_PROMPTS, PRESETS, STAGES, Guess, candidates, tally
from ui.server import current_model, current_scheduler
from ui.session import LESSON, preset_named
from ui.views import (
    FINISH_LABELS,
    LINE_CSS,
    RAW_COLOUR,
    Bar,
    BarRow,
    bars_html,
    chip_window,
    context_html,
    esc,
    pct,
    plain,
    prompt_chips,
    quoted,
    top_values_figure,
)
from ui.views import inside as inside_views
from ui.widgets import (
    BACKWARD,
    FORWARD,
    RUN,
    current_theme,
    described_chart,
    ensure_app_frame,
    page_style,
    presenter_keys,
    presenting,
)

S = st.session_state
PARTS = ("Guided walk", "Predict the next token")


def chips(generation: Generation, steps: tuple[StepRecord, ...] | None = None) -> None:
    """The context as token chips (all steps unless told which)."""
    shown = generation.steps if steps is None else steps
    html = context_html(prompt_chips(generation.prompt_pieces), shown, legend=False)
    st.html(chip_window(html, lines=4) if presenting() else html)


def table(frame: pd.DataFrame, hide_index: bool = False) -> None:
    """A small table: interactive, or in presentation mode static with type that follows the viewport."""
    if presenting():
        st.table(frame, hide_index=hide_index)
    else:
        st.dataframe(frame, hide_index=hide_index, width="stretch")


def idle_notes(read: Callable[[Any, str], str | None]) -> None:
    """Why the generation could not be rebuilt, or the welcome back after it was."""
    if problem := read(S, "buttons"):
        st.warning(plain(problem), icon=":material/back_hand:")
    elif note := read(S, "idle"):
        st.info(plain(note), icon=":material/history:")


# ---- the guided walk ----------------------------------------------------------------------

def top_values(labels: list[str], values: list[float], title: str, x_title: str, key: str,
               colour: str = RAW_COLOUR, text: Callable[[float], str] = "{:.2f}".format) -> None:
    """The leading tokens' values as bars: a Plotly chart, or in presentation mode bars sized
    from the viewport (ui/views/bars.py) so a stage still fits one projector screen."""
    if presenting():
        rows = [BarRow(label, (Bar(value, text(value), colour),))
                for label, value in zip(labels, values, strict=True)]
        st.html(LINE_CSS + f'<div class="tbt-title">{esc(title)} · {esc(x_title)}</div>' + bars_html(rows))
    else:
        described_chart(top_values_figure(labels, values, title, x_title, colour=colour, text=text,
                                          theme=current_theme()), key=key)


def preset_picker() -> str:
    """The preset selector and what to watch for; returns the chosen preset's name."""
    name = st.selectbox("Preset", [p.name for p in PRESETS], key=LESSON.preset,
                        help="Each preset makes one termination condition fire (greedy decoding, so it is "
                             "the same every time).")
    preset = preset_named(PRESETS, name)
    st.caption(f"Prompt{' (through the chat template)' if preset.chat else ''}: “{preset.prompt}” · "
               f"{preset.about}")
    return name


def walk_controls(generation: Generation, stage: int) -> None:
    """Previous / Next / Start over in one row (wrapping, never truncating, in large type), then progress."""
    last = stage == len(STAGES) - 1
    token = f" · token {len(generation.steps)}" if generation.steps else ""
    with st.container(horizontal=True, vertical_alignment="center" if presenting() else "top"):
        st.button("◀ Previous", key=LESSON.previous, on_click=lesson.go_previous, args=(S,), disabled=stage == 0)
        st.button("Next token ▶" if last else "Next ▶", key=LESSON.next, on_click=lesson.go_next, args=(S,),
                  type="primary", disabled=last and generation.finished)
        st.button("Start over", key=LESSON.restart, on_click=lesson.start_over, args=(S,))
        if presenting():  # the stage's name in the row, not in a progress bar and a heading below it
            st.markdown(f"#### Stage {stage + 1} of {len(STAGES)}: {STAGES[stage]}{token}")
    idle_notes(lesson.walk_message)
    if presenting():
        return
    st.progress((stage + 1) / len(STAGES), text=f"Stage {stage + 1} of {len(STAGES)}: **{STAGES[stage]}**"
                + token)


def stage_tokens(lm: LoadedModel, generation: Generation) -> None:
    """Screen 1: the prompt as the model reads it, token by token."""
    st.markdown(
        "A model never sees letters. A **tokenizer** cuts the text into pieces from a fixed vocabulary "
        f"({lm.vocab_size:,} pieces for this model) and the model reads each piece's number, its **token id**. "
        "Common words are one token; rare words are split; a leading space is part of the token (drawn ␣).")
    if not presenting():  # on a projector the chips alone show the prompt
        st.code(generation.prompt_text, language=None, wrap_lines=True)
    chips(generation)
    pieces = generation.prompt_pieces
    st.markdown(f"The prompt is **{len(pieces)} tokens**" + (" (the chat template's special tokens, in yellow, are "
                "tokens too)." if generation.chat else "."))
    start = max(0, len(pieces) - 16)  # the prompt's end, as the chips above show it; the header row is the position
    shown = pieces[start:]
    if start:
        st.caption(f"The last {len(shown)} of the {len(pieces)} tokens, numbered by their position in the context.")
    table(pd.DataFrame({"token": [quoted(p.text) for p in shown], "id": [str(p.token_id) for p in shown]},
                       index=range(start, len(pieces))).T)


def stage_logits(lm: LoadedModel, generation: Generation, step: StepRecord) -> None:
    """Screen 2: the forward pass and the logits it produced."""
    first = step.index == 1
    st.markdown(
        f"The model ran one **forward pass**: the {step.forward_tokens} token"
        f"{'s' if step.forward_tokens != 1 else ''} it had not seen yet "
        f"{'(the whole prompt, all at once)' if first else '(only the newest: the KV cache remembers the rest)'} "
        f"went through all {lm.geometry.layers} layers. At the last position it produces one score, a **logit**, "
        f"for every one of the {lm.vocab_size:,} tokens in the vocabulary: what could come next.")
    logits = generation.raw_logits(step.index)
    top = step.distribution.top[:10]
    cols = st.columns(3)
    cols[0].metric("logits computed", f"{logits.numel():,}")
    cols[1].metric("highest logit", f"{float(logits.max()):.2f}")
    cols[2].metric("lowest logit", f"{float(logits.min()):.2f}")
    top_values([quoted(c.text) for c in top], [c.logit for c in top], "The 10 highest logits",
               "logit (a score, not a probability)", LESSON.logits_chart)
    st.markdown("Logits can be any real number, negative too, and they do not add up to anything yet.")


def stage_inside(lm: LoadedModel, generation: Generation, step: StepRecord) -> None:
    """Screen 3: inside that forward pass: what each layer would predict, where the new token looks."""
    view = lesson.inside(S, generation)
    if isinstance(view, str):
        st.warning(plain(view), icon=":material/back_hand:")
        return
    fed = "the last prompt token" if step.index == 1 else "the newest token"
    st.markdown(
        f"Inside the pass, {fed} is a vector of {view.hidden_size:,} numbers that each of the "
        f"{len(view.layers) - 1} layers adds to. Read that vector after any layer through the model's own final "
        "norm and LM head and you get the distribution the model would give **if it stopped there**: the "
        f"(raw) **logit lens**. {inside_views.lead_text(view, step.token)}")
    st.html(inside_views.lens_cells_html(view, step.token, step.token_id))
    pieces = generation.prompt_pieces + [s.token for s in generation.steps[: step.index - 1]]
    if view.layers[-1].attention is not None:
        st.markdown(inside_views.sink_text(view, pieces) + " Its query meets the cached key of **every** earlier "
                    "position at every layer: that is why the KV cache keeps them.")
        if not presenting():
            described_chart(inside_views.attention_figure(view, pieces, height=420), key=LESSON.inside_chart,
                            words=inside_views.sink_text(view, pieces).replace("**", ""))
    for part in view.unavailable:
        st.caption(plain(f"Not shown for this model: {part}."))
    with st.expander("What this shows"):
        for text in inside_views.lessons(view):
            st.markdown(text)
        st.markdown(inside_views.bytes_text(view))


def stage_softmax(lm: LoadedModel, step: StepRecord) -> None:
    """Screen 4: softmax turns the logits into probabilities."""
    st.markdown("**Softmax** turns the logits into probabilities: raise e to each logit, then divide by the sum "
                "over the whole vocabulary, so every probability is positive and they add up to 1.")
    st.latex(rf"p_i = \frac{{e^{{z_i}}}}{{\sum_{{j=1}}^{{{lm.vocab_size:,}}} e^{{z_j}}}}")
    top = step.distribution.top[:10]
    shown = sum(c.prob for c in top)
    top_values([quoted(c.text) for c in top], [c.prob for c in top], "The 10 most probable next tokens",
               "probability (0–1)", LESSON.probs_chart, text=pct)
    st.markdown(f"These 10 hold **{pct(shown)}** of the probability; the other {lm.vocab_size - 10:,} tokens share "
                f"**{pct(max(0.0, 1 - shown))}**. Entropy **{step.distribution.raw_entropy_bits:.2f} bits**: 0 would "
                "mean the model is certain; each extra bit doubles the number of equally likely choices.")


def stage_sampling(lm: LoadedModel, step: StepRecord) -> None:
    """Screen 5: the decoder picks one token (greedily here)."""
    st.markdown(
        "The **decoder** now picks one token. This lesson decodes **greedily** (temperature 0): it takes the most "
        "probable token, so the same prompt always gives the same text here. With a temperature above 0 it would "
        "instead draw at random from the (reshaped) distribution: see the **Sampler lab**.")
    st.page_link("pages/determinism.py", icon=":material/shuffle:",
                 label="Why can a chat service still answer the same prompt differently at temperature 0? "
                       "Same prompt, different answers")
    cols = st.columns(3)
    cols[0].metric("picked", quoted(step.token.text))
    cols[1].metric("its probability", pct(step.prob))
    cols[2].metric("its rank", f"#{step.rank}")
    st.markdown(f"Token id **{step.token_id}**" + (" is a **special token**." if step.token.special else "."))


def stage_append(lm: LoadedModel, generation: Generation, step: StepRecord) -> None:
    """Screen 6: the pick joins the context; what the KV cache holds."""
    kv = step.kv
    st.markdown(
        f"The pick joins the context, which is now **{len(generation.prompt_ids) + step.index} tokens** (the ringed "
        "chip is the newest). Everything the model has already read keeps its **keys and values** in the **KV "
        "cache**, so the next forward pass only has to read the new token.")
    chips(generation, generation.steps[: step.index])
    cols = st.columns(3)
    cols[0].metric("positions in the cache", f"{kv.positions:,}")
    cols[1].metric("cache size", f"{kv.bytes / 2**20:.2f} MiB", help=f"{kv.bytes:,} bytes, read from the tensors")
    cols[2].metric("layers", kv.layers)
    k_shape = kv.layer_shapes[0][0] if kv.layer_shapes else ()
    st.markdown(
        f"Each layer holds one key tensor and one value tensor of shape **{list(k_shape)}** (batch, KV heads, "
        f"positions, head dim) in {kv.dtype}. Check: {kv.formula} = **{kv.formula_bytes:,} bytes**. "
        f"The newest token {quoted(step.token.text)} is not in the cache yet: its keys and values are computed "
        "when the next forward pass reads it.")


def stage_check(generation: Generation, step: StepRecord) -> None:
    """Screen 7: the four termination conditions, and the result once one fires."""
    term = step.termination
    stops = ", ".join(f"“{s.sequence}”: " + ("found" if s.matched else f"{s.partial} character(s) started")
                      for s in term.stops) or "none set"
    eos = "picked" if term.eos_picked else f"not picked (probability {pct(term.eos_prob)})"
    st.markdown("After every token the server checks four conditions, in this order:")
    table(pd.DataFrame([
        {"condition": "end-of-sequence token", "now": eos + (" · ignored by request" if term.ignore_eos else "")},
        {"condition": "stop sequences", "now": stops},
        {"condition": "max new tokens", "now": f"{term.new_tokens} of {term.max_new_tokens}"},
        {"condition": "context window", "now": f"{term.context_tokens:,} of {term.context_window:,} tokens"},
    ]), hide_index=True)
    if term.eos_picked and term.ignore_eos:
        st.warning(f"The model picked its end token {quoted(step.token.text)}: its answer is over. This preset "
                   "ignores end tokens, so the loop goes on, and the model has to write *something* next.")
    if term.finish_reason is None:
        st.info("Nothing fired: the loop goes round again. Press **Next token**, or **Run to the end**.")
        st.button("Run to the end", key=LESSON.run, on_click=lesson.run_to_end, args=(S,))
        return
    st.success(f"Generation stops: {FINISH_LABELS[term.finish_reason]} (finish reason “{term.finish_reason}”).")
    st.markdown("**Everything the model read and wrote**, token by token (special tokens in yellow):")
    chips(generation)
    st.markdown("**The text returned to the caller** (special tokens left out, cut before any stop sequence):")
    st.code(generation.text or "(empty)", language=None, wrap_lines=True)


def guided_walk(lm: LoadedModel) -> None:
    """The guided walk: preset, controls, and the current stage's screen."""
    # on a projector the preset folds away under the stage, so each stage fits one screen
    name = (S.get(LESSON.preset) or PRESETS[0].name) if presenting() else preset_picker()
    chosen = lesson.walk(S, lm, name, current_scheduler())
    if chosen is None:
        st.error(plain(lesson.walk_message(S, "start") or ""))
    else:
        stage_screen(lm, *chosen)
    if presenting():
        with st.expander("Preset and prompt"):
            preset_picker()


def stage_screen(lm: LoadedModel, generation: Generation, stage: int) -> None:
    """The controls and the current stage's screen."""
    walk_controls(generation, stage)
    if not presenting():  # level 2, under the page's title
        st.header(STAGES[stage], anchor=False)
    step = generation.steps[-1] if generation.steps else None
    if stage == 0 or step is None:
        stage_tokens(lm, generation)
    elif stage == 1:
        stage_logits(lm, generation, step)
    elif stage == 2:
        stage_inside(lm, generation, step)
    elif stage == 3:
        stage_softmax(lm, step)
    elif stage == 4:
        stage_sampling(lm, step)
    elif stage == 5:
        stage_append(lm, generation, step)
    else:
        stage_check(generation, step)


# ---- predict, then reveal -----------------------------------------------------------------

def show_tally(guesses: list[Guess]) -> None:
    """Matches and probability given up, over every round so far."""
    result = tally(guesses)
    cols = st.columns(3)
    cols[0].metric("rounds", result.rounds)
    cols[1].metric("you matched the model", f"{result.matches} of {result.rounds}",
                   delta=pct(result.match_rate, 0), delta_color="off", delta_arrow="off")
    cols[2].metric("probability given up", f"{result.gave_up_total:.2f} in all",
                   delta=f"{result.gave_up_mean:.2f} per round", delta_color="off", delta_arrow="off",
                   help="Each round: the model's probability for its own pick minus its probability for yours.")
    st.dataframe(pd.DataFrame([{"step": g.step_index, "you": quoted(g.guess_text), "your token's p": pct(g.guess_prob),
                                "model": quoted(g.model_text), "model's p": pct(g.model_prob),
                                "match": "✓" if g.matched else "✗", "given up": f"{g.gave_up:.3f}"}
                               for g in guesses]), hide_index=True, width="stretch")


def predict_exercise(lm: LoadedModel) -> None:
    """Predict the next token, then reveal what the model thought."""
    st.markdown("Read the text, choose the token **you** think comes next, then reveal the model's distribution. "
                "The model picks greedily (its most probable token). Over several rounds: how often do you match "
                "it, and how much probability does your choice give up?")
    prompt = st.selectbox("Text to continue", PREDICT_PROMPTS, key=LESSON.predict_prompt)
    generation = lesson.predict_generation(S, lm, prompt, current_scheduler())
    if generation is None:
        st.error(plain(lesson.predict_message(S, "start") or ""))
        return
    idle_notes(lesson.predict_message)
    step = generation.steps[-1]
    chips(generation, generation.steps[:-1])
    options = candidates(step)
    labels = {c.token_id: quoted(c.text) for c in options}
    revealed = lesson.revealed(S)
    st.radio("Your prediction for the next token", list(labels), format_func=labels.__getitem__, index=None,
             horizontal=True, key=lesson.guess_key(step), disabled=revealed)
    if not revealed:
        st.button("Reveal the model's distribution", key=LESSON.reveal, type="primary", on_click=lesson.reveal,
                  args=(S, step), disabled=lesson.choice(S, step) is None)
    else:
        guess = lesson.guesses(S)[-1]
        verdict = ("✓ You matched the model." if guess.matched else
                   f"✗ The model preferred {quoted(guess.model_text)}: your choice gave up {guess.gave_up:.3f} "
                   "of probability.")
        st.markdown(f"**{verdict}** Model: {quoted(guess.model_text)} at {pct(guess.model_prob)}; you: "
                    f"{quoted(guess.guess_text)} at {pct(guess.guess_prob)}.")
        # the way on before the chart, so a 720-pixel projector shows it without scrolling
        if generation.finished:
            st.info(f"The text has ended ({generation.finish_reason}). Choose another text to play again.")
        else:
            st.button("Next round ▶", key=LESSON.next_round, type="primary", on_click=lesson.next_round, args=(S,))
        ranked = step.distribution.top[: len(options)]
        top_values([reveal_label(c, guess) for c in ranked], [c.prob for c in ranked],
                   "The model's raw softmax over the choices", "raw probability (0–1)", LESSON.reveal_chart, text=pct)
    if guesses := lesson.guesses(S):
        show_tally(guesses)


def reveal_label(candidate: Candidate, guess: Guess) -> str:
    """A choice's row in the reveal: the student's own guess and the model's pick marked in words."""
    marks = [mark for mark, token in (("▶ the model", guess.model_id), ("◆ your guess", guess.guess_id))
             if candidate.token_id == token]
    return quoted(candidate.text) + (f"  {' · '.join(marks)}" if marks else "")


def main() -> None:
    """The page, top to bottom."""
    ensure_app_frame()
    page_style()
    # a remote's "next" moves each part on: the walk's next stage, or the exercise's reveal, then its next round
    walking = (S.get(LESSON.mode) or PARTS[0]) == PARTS[0]
    forward = LESSON.next if walking else LESSON.next_round if lesson.revealed(S) else LESSON.reveal
    presenter_keys({forward: FORWARD, LESSON.previous: BACKWARD, LESSON.run: RUN})
    if not presenting():  # a projector's screen goes to the stage
        st.title("Lesson: one generation, stage by stage")
        st.markdown("A language model writes by repeating one loop: **read** the context, **score** every possible "
                    "next token, **pick** one, **append** it, **check** whether to stop. Walk through it on the real "
                    "model.")
    lm = current_model()
    lesson.open_link(S, lm, {key: st.query_params[key] for key in st.query_params}, current_scheduler())
    if problem := lesson.walk_message(S, "link"):
        st.warning(plain(problem), icon=":material/link:")
    # on a projector the part switch sits at the bottom, under the screen it chose
    mode = (S.get(LESSON.mode) or PARTS[0]) if presenting() else part_switch()
    if mode == PARTS[0]:
        guided_walk(lm)
    else:
        predict_exercise(lm)
    if presenting():
        part_switch()


def part_switch() -> str:
    """Guided walk or the prediction exercise."""
    return st.radio("Part", PARTS, horizontal=True, key=LESSON.mode, label_visibility="collapsed")


if __name__ == "__main__":  # Streamlit runs a page as __main__; an import only defines it
    main()
