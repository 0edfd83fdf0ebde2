"""The step-through page's pure pieces: share links, stop-sequence fields, chips, views."""

from __future__ import annotations

import itertools
import json
import math

import plotly.graph_objects as go
import plotly.io as pio
import pytest
import torch

import ui.views.chips as chips
from engine import Generation, LoadedModel, PromptReading, SamplerSettings, StopSettings, Termination, replay
from engine.generation import describe_distribution
from engine.sampling import InverseCdf, decide
from engine.speed import fit_prefill_cost
from engine.stopping import StopSequenceState
from ui.session.presets import load_presets
from ui.session.settings import format_stop_sequences, parse_stop_sequences
from ui.session.share import SharedState, SharedStep, ShareError, from_generation, from_params, replay_trace, to_params
from ui.views.charts import FINAL_NAME, MODES, bar_rows, distribution_figure, kv_figure
from ui.views.chips import context_html, generated_chip, prompt_chips
from ui.views.format import esc, pct, quoted, visible
from ui.views.prefill import duration, long_prompt_warning, reading_progress
from ui.views.records import (
    cdf_bands,
    cdf_strip_html,
    decision_html,
    factorisation_html,
    sequence_stats,
    termination_html,
)
from ui.views.theme import CLEAR, DARK, LIGHT, ChartTheme
from ui.widgets.panels import draw_text

GREEDY = SamplerSettings(temperature=0.0)
WARM = SamplerSettings(temperature=0.8, top_k=40, top_p=0.95, chain="vllm")


def as_lists(params: dict[str, str | list[str]]) -> dict[str, list[str]]:
    """What st.query_params.get_all gives back for each key."""
    return {k: v if isinstance(v, list) else [v] for k, v in params.items()}


@pytest.fixture(scope="module")
def sampled(lm: LoadedModel) -> Generation:
    gen = Generation(lm, "Once upon a time", sampler=SamplerSettings(temperature=0.9), seed=3)
    for _ in range(5):
        gen.step()
    return gen


def test_share_params_round_trip_settings_changes_forced_tokens_and_newline_stops() -> None:
    state = SharedState(model="/models/tiny", draw="multinomial", prompt="Q: 1+1?\nA:", chat=True, allow_special=True,
                        seed=11,
                        sampler=WARM, stop=StopSettings(max_new_tokens=9, stop_sequences=("\nQ:", "."),
                                                        ignore_eos=True),
                        steps=(SharedStep(5, False, GREEDY), SharedStep(6, True, GREEDY),
                               SharedStep(7, False, WARM)))
    params = to_params(state)
    assert params["tokens"] == "5,6!,7" and params["s"] == ["1:0.0/0/1.0/0.0/1.0/transformers",
                                                              "3:0.8/40/0.95/0.0/1.0/vllm"]
    assert from_params(as_lists(params)) == state


def test_share_params_without_sampler_changes_stay_short() -> None:
    state = SharedState(model="", draw="cdf", prompt="Hi", chat=False, allow_special=False, seed=0, sampler=GREEDY,
                        stop=StopSettings(), steps=(SharedStep(1, False, GREEDY),))
    params = to_params(state)
    assert set(params) == {"prompt", "chat", "seed", "sampler", "max", "tokens"}
    assert from_params(as_lists(params)) == state


@pytest.mark.parametrize(("params", "message"), [
    ({}, "no 'prompt'"),
    ({"prompt": ["x"], "chat": ["yes"]}, "'chat' must be 0 or 1"),
    ({"prompt": ["x"], "tokens": ["4,x!"]}, "token 'x!'"),
    ({"prompt": ["x"], "sampler": ["hot"]}, "sampler settings 'hot'"),
    ({"prompt": ["x"], "seed": ["one"]}, "'seed' must be a whole number"),
])
def test_malformed_share_params_raise_a_message_naming_the_parameter(params, message) -> None:
    with pytest.raises(ShareError, match=message):
        from_params(params)


def test_share_params_out_of_range_carry_the_engines_settings_message() -> None:
    with pytest.raises(ShareError, match=r"top_p = 1\.5 is not allowed"):
        from_params({"prompt": ["x"], "sampler": ["1.0/0/1.5/0.0/1.0/transformers"]})


def test_replay_trace_from_a_link_rebuilds_the_same_generation(lm: LoadedModel, sampled: Generation) -> None:
    rebuilt = replay(lm, replay_trace(from_generation(sampled, ""))).generation
    assert [s.token_id for s in rebuilt.steps] == [s.token_id for s in sampled.steps]
    assert [s.decision.draw for s in rebuilt.steps] == [s.decision.draw for s in sampled.steps]


def test_stop_sequence_field_escapes_round_trip() -> None:
    sequences = ("\nB:", "a\\nb", "tab\there")
    text = format_stop_sequences(sequences)
    assert text.splitlines() == ["\\nB:", "a\\\\nb", "tab\\there"]
    assert parse_stop_sequences(text) == sequences
    assert parse_stop_sequences("x\n\ny\n") == ("x", "y")  # blank lines are not stop sequences


def test_each_engine_is_named_as_it_spells_itself() -> None:
    from engine import CHAINS
    from ui.views.format import chain_name

    assert [chain_name(c) for c in CHAINS] == ["transformers", "vLLM", "llama.cpp"]


def test_whitespace_is_drawn_and_tiny_probabilities_keep_digits() -> None:
    assert visible(" Paris\n\t") == "␣Paris↵⇥"
    assert visible("") == "∅"
    assert pct(0.5) == "50.0%" and pct(0.0312) == "3.1%"
    assert pct(0.0004) == "0.04%" and pct(1.7e-7 * 100) == "0.0017%" and pct(0.0) == "0%"
    # below a thousandth of a percent, odds a student can read, never "5.0e-15%"
    assert pct(1.6e-7) == "1 in 6.2 million" and pct(3e-9) == "1 in 330 million"
    assert pct(1e-39) == "under 1 in a billion trillion"
    assert pct(5e-17) == "1 in 20,000 trillion" and pct(1.5e-6) == "1 in 670,000"
    assert all("e-" not in pct(10.0 ** -k) for k in range(1, 40))


def test_chips_mark_prompt_special_newest_and_whitespace(lm: LoadedModel) -> None:
    chat = Generation(lm, "Hi", chat=True, sampler=GREEDY)
    html = prompt_chips(chat.prompt_pieces)
    assert html.count("tbt-prompt") == len(chat.prompt_ids)
    assert 'tbt-special' in html and "&lt;|im_start|&gt;" in html
    assert '<span class="tbt-br"></span>' in html  # a newline token breaks the line
    step = chat.step()
    chip = generated_chip(step, newest=True)
    assert "tbt-newest" in chip and f"id {step.token_id}" in chip and "raw p" in chip


def test_each_earlier_chip_is_drawn_once_and_only_the_newest_is_drawn_on_every_step(sampled: Generation,
                                                                                     monkeypatch) -> None:
    steps = sampled.steps
    expected = "".join(generated_chip(step, newest=i == len(steps) - 1) for i, step in enumerate(steps))
    assert expected in context_html("", steps)
    drawn = []
    monkeypatch.setattr(chips, "generated_chip", lambda step, newest=False: drawn.append(step.index) or "")
    context_html("", steps)
    assert drawn == [steps[-1].index]  # the earlier chips came from the records' own cache


def test_distribution_rows_cover_the_whole_vocabulary(sampled: Generation) -> None:
    distribution = sampled.steps[-1].distribution
    rows = bar_rows(distribution, top_n=5)
    assert len(rows.shown) == 5
    assert len(rows.shown) + rows.others_count == sampled.lm.vocab_size
    assert sum(c.prob for c in rows.shown) + rows.others_prob == pytest.approx(1.0, abs=1e-5)
    assert sum(c.final_prob for c in rows.shown) + rows.others_final_prob == pytest.approx(1.0, abs=1e-5)


def test_distribution_chart_shows_a_low_ranked_pick_and_rejects_unknown_modes(sampled: Generation) -> None:
    distribution = sampled.steps[-1].distribution
    low = distribution.top[20]
    figure = distribution_figure(distribution, low.token_id, top_n=3)
    assert figure.data[0].y[3].startswith("▶ #")  # the pick is added after the top 3
    with pytest.raises(ValueError, match="mode"):
        distribution_figure(distribution, mode="odds")


def test_a_chart_is_its_json_until_something_asks_for_more(sampled: Generation) -> None:
    """st.plotly_chart reads a figure through to_dict() only: that must not build Plotly's
    objects (the time this saves), and everything else must still work on a real Figure."""
    record = sampled.steps[-1]
    figure = distribution_figure(record.distribution, record.token_id)
    sent = json.loads(pio.to_json(figure, validate=False))
    assert not figure._built
    assert sent["layout"]["template"] == json.loads(pio.to_json(go.Figure(), validate=False))["layout"]["template"]
    assert figure.data[1].name == FINAL_NAME and figure._built
    figure.update_layout(height=123)
    assert figure.to_dict()["layout"]["height"] == 123
    assert {**figure.to_dict(), "layout": {**figure.to_dict()["layout"], "height": sent["layout"]["height"]}} == sent


def _validated_json(figure: go.Figure) -> dict:
    """The figure as Plotly itself would write it after checking every property."""
    return json.loads(pio.to_json(go.Figure(figure.to_dict()), validate=True))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("font_size", "theme"), [(13, LIGHT), (20, DARK)])
def test_unvalidated_charts_are_exactly_what_plotly_validation_would_send(sampled: Generation, mode: str,
                                                                          font_size: int, theme: ChartTheme) -> None:
    """The charts skip Plotly's validation for speed: a misspelt property, a bare-string title
    (plotly.js 3 ignores it) or a None would make the validated JSON differ (or raise)."""
    record = sampled.steps[-1]
    figure = distribution_figure(record.distribution, record.token_id, mode=mode, font_size=font_size, theme=theme)
    assert json.loads(pio.to_json(figure, validate=False)) == _validated_json(figure)
    assert figure.layout.shapes, "the pick's row is highlighted"
    assert figure.layout.plot_bgcolor == CLEAR and figure.data[0].textfont.color == theme.text
    assert figure.layout.xaxis.title.font.color == theme.text
    kv = kv_figure(sampled.steps, theme=theme)
    assert json.loads(pio.to_json(kv, validate=False)) == _validated_json(kv)


def test_a_pick_far_below_the_recorded_leaders_is_named_by_its_text_not_its_id(lm: LoadedModel) -> None:
    """At temperature 2 a draw near 1 lands far down the list, outside the recorded leaders;
    the decision still names the token (it used to say 'id 14344')."""
    gen = Generation(lm, "The capital of France is", sampler=SamplerSettings(temperature=2.0))
    gen.step()
    logits, context = gen.raw_logits(), torch.tensor(gen.context_ids[:-1])
    decision, chain = decide(logits, context, SamplerSettings(temperature=2.0), InverseCdf(0.9999))
    distribution = describe_distribution(lm, logits, logits.softmax(dim=-1), chain)
    assert decision.token_id not in {c.token_id for c in distribution.top}
    html = decision_html(decision, distribution, lm.texts)
    assert esc(quoted(lm.texts.piece(decision.token_id).text)) in html
    assert f"id {decision.token_id}" not in html


def test_a_far_pick_has_its_marked_row_and_the_strip_fills_zero_to_one(lm: LoadedModel) -> None:
    """The teacher's T = 2 demo: a pick far down the tail gets its own ▶ row in the chart, and
    the random-draw strip lays every token end to end over [0, 1): the leaders, the tail summed
    and labelled with its count, the pick's own band where u fell."""
    gen = Generation(lm, "Once upon a time, in a small village by the sea,", seed=3,
                     sampler=SamplerSettings(temperature=2.0), stop=StopSettings(max_new_tokens=40))
    record = next(step for step in (gen.step() for _ in range(8)) if step.rank > 50)
    figure = distribution_figure(record.distribution, record.token_id)
    labels = list(figure.data[0].y)
    assert labels[-2] == f"▶ #{record.rank} {quoted(record.token.text)}" and figure.layout.shapes
    bands = cdf_bands(record.decision, record.distribution)
    assert bands[0].start == 0.0 and sum(b.width for b in bands) == pytest.approx(1.0, abs=1e-5)
    for before, after in itertools.pairwise(bands):
        assert after.start == pytest.approx(before.start + before.width, abs=1e-5)  # no gap, no overlap
    pick = next(b for b in bands if b.kind == "pick")
    draw = record.decision.draw
    assert pick.start == draw.cdf_low and pick.start <= draw.u < pick.start + pick.width
    tails = [b for b in bands if b.kind == "tail"]
    kept = record.decision.final_kept
    assert sum(int(b.text.split()[0].replace(",", "")) for b in tails) == kept - 10 - 1
    html = cdf_strip_html(record.decision, record.distribution)
    assert "other tokens" in html and f"rank {draw.rank:,}" in html


def test_sequence_stats_are_the_sum_of_log_probabilities(sampled: Generation) -> None:
    stats = sequence_stats(sampled.steps, "raw")
    expected = sum(math.log(s.prob) for s in sampled.steps)
    assert stats.total == pytest.approx(expected)
    assert stats.perplexity == pytest.approx(math.exp(-expected / 5))
    final = sequence_stats(sampled.steps, "final")
    assert final.total == pytest.approx(sum(math.log(s.final_prob) for s in sampled.steps))


def test_factorisation_writes_the_last_tokens_probabilities(sampled: Generation) -> None:
    stats = sequence_stats(sampled.steps, "raw")
    html = factorisation_html(sampled.steps, stats, "raw", last=2)
    assert "P(t<sub>1</sub>…t<sub>5</sub> | prompt)" in html
    assert "P(t<sub>1</sub>…t<sub>3</sub>)" in html  # the first three folded into one factor
    assert f"{sampled.steps[-1].prob:.4f}" in html or f"{sampled.steps[-1].prob:.3e}" in html


def test_one_token_is_written_p_of_t1_never_t1_to_t1(lm: LoadedModel) -> None:
    gen = Generation(lm, "The capital of France is", sampler=GREEDY)
    gen.step()
    html = factorisation_html(gen.steps, sequence_stats(gen.steps), "raw")
    assert "P(t<sub>1</sub> | prompt)" in html and "…t<sub>1</sub>" not in html
    for _ in range(5):
        gen.step()
    html = factorisation_html(gen.steps, sequence_stats(gen.steps), "raw", last=5)
    assert html.count("P(t<sub>1</sub>)") == 1 and "P(t<sub>1</sub>…t<sub>6</sub> | prompt)" in html


def test_the_history_names_a_missing_draw_instead_of_none(lm: LoadedModel, sampled: Generation) -> None:
    greedy = Generation(lm, "The capital of France is", sampler=GREEDY)
    assert draw_text(greedy.step().decision) == "greedy"
    record = sampled.steps[-1]
    assert draw_text(record.decision) == f"{record.decision.draw.u:.4f}"
    multinomial = Generation(lm, "Hello", sampler=SamplerSettings(temperature=0.9), draw="multinomial")
    assert draw_text(multinomial.step().decision) == "multinomial"


def test_termination_view_highlights_the_condition_that_fired() -> None:
    full = Termination(eos_ids=(2,), eos_prob=0.01, eos_picked=False, ignore_eos=False,
                       stops=(StopSequenceState("END", False, None, 2),), new_tokens=3, max_new_tokens=10,
                       context_tokens=8192, context_window=8192, finish_reason="context_window")
    html = termination_html(full, "<|im_end|>")
    assert '<tr class="tbt-fired"><td>context window' in html
    assert "text ends with 2 of 3 characters: &#x27;EN&#x27;" in html
    assert "the context window is full" in html


def test_presets_are_valid_and_cover_chat_sampling_and_stop_sequences() -> None:
    presets = load_presets()
    assert len(presets) >= 5
    assert any(p.chat for p in presets)
    assert any(not p.sampler.greedy for p in presets)
    assert any(p.stop.stop_sequences for p in presets)


def test_partial_byte_tokens_get_their_own_chip_style(lm: LoadedModel) -> None:
    pieces = Generation(lm, "I love 🍕").prompt_pieces
    html = prompt_chips(pieces)
    assert html.count("tbt-bytes") == sum(p.partial_bytes for p in pieces) >= 2
    assert "&lt;0x8D&gt;" in html  # a stray byte is written out, not dropped


def test_a_long_prompts_chips_fold_their_middle_and_keep_every_token() -> None:
    from engine import TokenPiece

    pieces = [TokenPiece(token_id=i, text=f"t{i}", special=False, partial_bytes=False) for i in range(1_000)]
    html = chips.prompt_chips(pieces)
    outside = html.split("<details", 1)[0] + html.split("</details>", 1)[1]
    assert outside.count("tbt-prompt") == chips.KEEP_HEAD + chips.KEEP_TAIL
    assert html.count("tbt-prompt") == 1_000 and "960 more prompt tokens" not in html
    assert f"{1_000 - chips.KEEP_HEAD - chips.KEEP_TAIL:,} more prompt tokens (positions 40 to 839)" in html
    short = chips.prompt_chips(pieces[: chips.FOLD_OVER])
    assert "<details" not in short and short.count("tbt-prompt") == chips.FOLD_OVER


def test_a_long_prompts_first_step_is_announced_with_its_estimate_and_shows_its_progress() -> None:
    cost = fit_prefill_cost((128, 512), (1_000.0, 5_000.0))
    warning = long_prompt_warning(4_250, cost)
    assert warning.startswith("This prompt is 4,250 tokens.") and duration(cost.estimate_s(4_250)) in warning
    assert "128 tokens in 1.00 s, 512 in 5.00 s" in warning
    assert duration(5) == "5 s" and duration(130.4) == "2 min 10 s" and duration(0.2) == "1 s"
    expected = cost.estimate_s(1_000)
    share, label = reading_progress(PromptReading(1_000, expected / 2, False), cost)
    assert share == pytest.approx(0.5) and label.startswith("Reading the 1,000-token prompt")
    share, label = reading_progress(PromptReading(1_000, expected * 2, False), cost)
    assert share == 0.99 and "longer than estimated" in label  # never full before the pass is done
    assert reading_progress(PromptReading(1_000, 3.0, True), cost) == (1.0, "Read 1,000 prompt tokens in 3 s.")
