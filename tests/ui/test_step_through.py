"""The step-through page driven through Streamlit's AppTest, on the real bundled model."""

from __future__ import annotations

import html
import json
import math
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from streamlit.testing.v1 import AppTest

from engine import Generation, generation_recording, to_trace
from tests.ui.apptest import APP as APP_SCRIPT
from tests.ui.apptest import as_read
from ui.session import run_clock
from ui.session.keys import APP, STEP
from ui.session.share import from_generation, to_params
from ui.views.charts import FINAL_NAME, RAW_NAME
from ui.widgets.presentation import PRESENTATION_CSS

TIMEOUT = 120  # the first run loads the model


def open_app(query: dict[str, str | list[str]] | None = None) -> AppTest:
    """A fresh visitor on the default page (optionally through a share link)."""
    at = AppTest.from_file(APP_SCRIPT, default_timeout=TIMEOUT)
    at.query_params.update(query or {})
    at.run()
    assert not at.exception, at.exception
    return at


def generation(at: AppTest) -> Generation:
    return at.session_state[STEP.generation]


def click(at: AppTest, key: str) -> AppTest:
    at.button(key=key).click().run()
    assert not at.exception, at.exception
    return at


def chips(at: AppTest) -> str:
    return next(h.proto.body for h in at.get("html") if "tbt-chips" in h.proto.body)


def html_with(at: AppTest, marker: str) -> str:
    return next(h.proto.body for h in at.get("html") if marker in h.proto.body)


def chart_spec(at: AppTest, key: str = "st_distribution_chart") -> dict:
    chart = next(c for c in at.get("plotly_chart") if c.proto.id.endswith(key) or key in c.proto.id)
    return json.loads(chart.proto.spec)


def slide(at: AppTest, key: str, value: float) -> AppTest:
    """Move a sampler control, then rerun the page: the control's own rerun covers only the
    sampler view, and AppTest then holds only that view's elements."""
    at.slider(key=key).set_value(value).run()
    assert not at.exception, at.exception
    at.run()
    return at


def branch_pills(at: AppTest):
    """The branch pills the page drew (keyed st_force_<step>_<pick>), or None."""
    return next((p for p in at.pills if p.key and p.key.startswith(STEP.force_prefix)), None)


def branch(at: AppTest, token_id: int) -> AppTest:
    branch_pills(at).set_value(token_id).run()
    assert not at.exception, at.exception
    return at


def use_preset(at: AppTest, name: str) -> AppTest:
    at.selectbox(key=STEP.preset).select(name).run()
    assert not at.exception, at.exception
    return at


@contextmanager
def counting_forward_passes(at: AppTest) -> Iterator[list[int]]:
    """Count the forward passes run for the page while the block runs: every pass goes through
    the server's scheduler, which counts each (plain, packed or scripted: a scripted pass never
    calls the model's own forward, so a hook on it would miss it)."""
    scheduler = generation(at).scheduler
    assert scheduler is not None
    calls: list[int] = []
    before = scheduler.stats().passes
    try:
        yield calls
    finally:
        calls.extend([1] * (scheduler.stats().passes - before))


@pytest.fixture()
def at() -> AppTest:
    return open_app()


def test_default_page_is_step_through_with_prompt_chips_and_no_steps(at: AppTest) -> None:
    assert at.header[0].value == "Step through"
    body = chips(at)
    assert 'data-steps="0"' in body and "tbt-prompt" in body and "France" in body
    assert [b.label for b in at.button][:4] == ["Step", "Run", "Back", "Reset"]
    assert at.button(key="st_back").disabled


def test_step_appends_one_token_shown_as_the_newest_chip(at: AppTest) -> None:
    gen = generation(at)
    assert gen.reading_ahead and gen.kv.positions == 0  # the page queued the prompt's pass as it opened
    gen._ahead.future.result(timeout=30)  # read while the visitor looks at the page
    with counting_forward_passes(at) as calls:
        click(at, "st_step")
    assert len(gen.steps) == 1 and not calls  # step 1 took the pass read ahead: the whole prompt
    assert gen.steps[0].forward_tokens == len(gen.prompt_ids) and gen.kv.positions == len(gen.prompt_ids)
    assert gen.steps[0].token.text == " Paris"  # greedy by default
    body = chips(at)
    assert 'data-steps="1"' in body
    assert 'tbt-newest' in body and "Paris</span>" in body
    assert any("1** token generated" in m.value for m in at.markdown)
    with counting_forward_passes(at) as calls:
        click(at, "st_step")
    assert len(gen.steps) == 2 and len(calls) == 1


def test_a_new_prompt_reads_itself_ahead_and_the_old_read_ahead_is_put_away(at: AppTest) -> None:
    old = generation(at)
    at.text_area(key=STEP.prompt).set_value("The largest ocean on Earth is").run()
    new = generation(at)
    assert new is not old and new.reading_ahead and not old.reading_ahead
    click(at, "st_step")
    assert new.steps[0].forward_tokens == len(new.prompt_ids)


def test_distribution_chart_labels_raw_and_final_and_highlights_the_pick(at: AppTest) -> None:
    click(at, "st_step")
    spec = chart_spec(at)
    names = [trace["name"] for trace in spec["data"]]
    assert names == [RAW_NAME, FINAL_NAME]
    labels = spec["data"][0]["y"]
    assert labels[0] == "▶ #1 '␣Paris'"  # visible space, rank, pick marker
    assert labels[-1].startswith("all other ") and labels[-1].endswith(" tokens")
    raw = spec["data"][0]["x"]
    assert raw[0] == pytest.approx(generation(at).steps[0].prob)
    assert sum(raw) == pytest.approx(1.0, abs=1e-4)  # shown rows + the rest = the whole vocabulary
    assert spec["data"][1]["x"][0] == 1.0  # greedy: all final mass on the pick
    assert spec["layout"]["shapes"][0]["y0"] == -0.5  # the highlight band sits on the pick's row


def test_chart_switches_to_logits_and_log_scale(at: AppTest) -> None:
    click(at, "st_step")
    at.segmented_control(key=STEP.chart_mode).set_value("logit").run()
    logit_spec = chart_spec(at)
    assert [t["name"] for t in logit_spec["data"]] == ["raw logit"]
    assert logit_spec["data"][0]["x"][0] == pytest.approx(generation(at).steps[0].logit)
    at.segmented_control(key=STEP.chart_mode).set_value("log probability").run()
    assert chart_spec(at)["layout"]["xaxis"]["type"] == "log"


def test_slider_change_resamples_the_shown_step_without_a_forward_pass(at: AppTest) -> None:
    click(at, "st_step")
    before = chart_spec(at)["data"][1]["x"]
    with counting_forward_passes(at) as calls:
        at.slider(key=STEP.temperature).set_value(1.5).run()
    gen = generation(at)
    after = chart_spec(at)["data"][1]["x"]
    assert calls == [] and len(gen.steps) == 1  # no forward pass, no new step
    assert after != before and after[0] < 1.0  # the final distribution flattened
    assert after[0] == pytest.approx(gen.resample(gen.sampler).distribution.top[0].final_prob)
    assert any("Re-sampled step 1" in i.value for i in at.info)
    assert "u = " in html_with(at, "tbt-table")  # a draw replaces the argmax


def test_next_step_uses_the_new_sampler_settings(at: AppTest) -> None:
    click(at, "st_step")
    slide(at, STEP.temperature, 0.7)
    slide(at, STEP.top_k, 5)
    click(at, "st_step")
    settings = generation(at).steps[-1].decision.settings
    assert (settings.temperature, settings.top_k) == (0.7, 5)
    stages = html_with(at, "tbt-table")
    assert "top-k 5" in stages and "temperature 0.7" in stages


def test_back_rewinds_one_step_and_reset_starts_over(at: AppTest) -> None:
    click(at, "st_step")
    click(at, "st_step")
    first = generation(at)
    click(at, "st_back")
    assert len(generation(at).steps) == 1 and 'data-steps="1"' in chips(at)
    click(at, "st_reset")
    assert generation(at) is not first and generation(at).steps == ()
    assert 'data-steps="0"' in chips(at)


def test_branch_forces_a_candidate_as_the_latest_token(at: AppTest) -> None:
    click(at, "st_step")
    alternative = generation(at).steps[0].distribution.top[1]
    branch(at, alternative.token_id)
    step = generation(at).steps[-1]
    assert len(generation(at).steps) == 1
    assert step.token_id == alternative.token_id and step.decision.forced
    assert "Forced by you" in html_with(at, "tbt-table")
    assert "tbt-forced" in chips(at)


def test_branch_pills_mark_the_pick_and_choosing_it_again_changes_nothing(at: AppTest) -> None:
    click(at, "st_step")
    step = generation(at).steps[0]
    pills = branch_pills(at)
    assert pills.value == step.token_id  # the pick is marked among the candidates
    assert len(pills.options) == 8 and pills.options[0].endswith("%")
    pills.set_value(None).run()  # clicking the marked pill clears it: the pick stays, still marked
    assert not at.exception, at.exception
    assert generation(at).steps == (step,) and branch_pills(at).value == step.token_id
    other = step.distribution.top[1].token_id if step.token_id == step.distribution.top[0].token_id else \
        step.distribution.top[0].token_id
    branch(at, other)
    assert generation(at).steps[-1].token_id == other and branch_pills(at).value == other


def test_a_sampler_control_beside_the_workspace_resamples_in_the_sampler_view(at: AppTest) -> None:
    """The controls sit outside the fragments (a Step in a real server leaves them out:
    tests/browser/test_step_rerun.py); a move of one reruns the sampler view by name."""
    click(at, "st_step")
    at.slider(key=STEP.temperature).set_value(1.5).run()
    assert not at.exception, at.exception
    assert generation(at).sampler.temperature == 1.5
    assert any("Re-sampled step 1" in as_read(i.value) for i in at.info)


def test_run_steps_until_max_new_tokens_and_disables_step(at: AppTest, monkeypatch) -> None:
    use_preset(at, "The capital of France is")
    monkeypatch.setattr(run_clock, "RUN_FRAME_S", 0.4)  # unpaced, these 12 tokens take ~2.5 s here
    started = time.monotonic()
    click(at, "st_run")
    gen = generation(at)
    assert len(gen.steps) == 12 and gen.finish_reason == "max_tokens"
    # paced: each token stays a frame, so a browser can draw it (a lower bound, not a speed goal)
    assert time.monotonic() - started >= 11 * 0.4
    assert at.button(key="st_step").disabled
    assert "tbt-fired" in html_with(at, "max new tokens")
    assert any("finished: max tokens" in m.value for m in at.markdown)


def test_chat_preset_runs_to_eos_and_termination_highlights_it(at: AppTest) -> None:
    use_preset(at, "Chat question (ends with EOS)")
    click(at, "st_run")
    gen = generation(at)
    assert gen.finish_reason == "eos" and gen.steps[-1].token.text == "<|im_end|>"
    termination = html_with(at, "fires when picked")
    assert '<tr class="tbt-fired"><td>end of sequence' in termination
    assert "(end of sequence)</span>" in chips(at)  # the badge in the decoded text
    assert "tbt-special" in chips(at)


def test_stop_sequence_across_tokens_cuts_the_text_and_is_highlighted(at: AppTest) -> None:
    use_preset(at, "Stop sequence (Q&A)")
    assert at.text_area(key=STEP.stop_sequences).value == "\\nB:"
    click(at, "st_run")
    gen = generation(at)
    assert gen.finish_reason == "stop_sequence" and gen.text == " 2 + 2 = 4"
    assert "<mark>\nB:</mark>" in chips(at)
    assert "matched at character 10" in html_with(at, "fires on a match")


def test_chat_toggle_shows_the_templated_text(at: AppTest) -> None:
    at.toggle(key=STEP.chat).set_value(True).run()
    assert generation(at).chat
    assert any("<|im_start|>user\nThe capital of France is<|im_end|>" in c.value for c in at.code)
    assert "tbt-special" in chips(at)


def test_empty_prompt_shows_a_message_and_keeps_the_generation(at: AppTest) -> None:
    click(at, "st_step")
    kept = generation(at)
    at.text_area(key=STEP.prompt).set_value("   ").run()
    assert any("The prompt is empty" in as_read(e.value) for e in at.error)
    assert generation(at) is kept and len(kept.steps) == 1


def test_prompt_beyond_the_context_window_shows_a_message(at: AppTest) -> None:
    at.text_area(key=STEP.prompt).set_value("word " * 9000).run()
    assert any("context window is 8,192 tokens" in as_read(e.value) for e in at.error)
    assert generation(at).prompt == "The capital of France is"


def test_five_stop_sequences_show_a_message_and_keep_the_stop_settings(at: AppTest) -> None:
    at.text_area(key=STEP.stop_sequences).set_value("a\nb\nc\nd\ne").run()
    assert any("Stop sequences: 5 sequences is not allowed; at most 4" in as_read(e.value) for e in at.error)
    assert generation(at).stop.stop_sequences == ()


def test_share_link_reproduces_steps_settings_and_forced_tokens(at: AppTest) -> None:
    slide(at, STEP.temperature, 0.9)
    at.number_input(key=STEP.seed).set_value(7).run()
    click(at, "st_step")
    click(at, "st_step")
    slide(at, STEP.top_p, 0.8)
    click(at, "st_step")
    forced = generation(at).steps[-1].distribution.top[2].token_id
    branch(at, forced)
    original = generation(at)
    assert at.query_params == {k: v for k, v in to_params(from_generation(original, "")).items()}

    shared = open_app(dict(at.query_params))
    copy = generation(shared)
    assert copy.seed == 7 and copy.sampler == original.sampler
    assert [s.token_id for s in copy.steps] == [s.token_id for s in original.steps]
    assert [s.decision.forced for s in copy.steps] == [False, False, True]
    assert [s.decision.settings for s in copy.steps] == [s.decision.settings for s in original.steps]
    assert [s.decision.draw for s in copy.steps] == [s.decision.draw for s in original.steps]
    assert shared.slider(key=STEP.top_p).value == 0.8 and shared.slider(key=STEP.temperature).value == 0.9
    assert chips(shared) == chips(at)


def test_broken_share_link_shows_a_message_and_starts_normally() -> None:
    at = open_app({"prompt": "Hello", "tokens": "12,abc"})
    assert any("This link cannot be opened" in as_read(w.value) and "'abc'" in as_read(w.value) for w in at.warning)
    assert generation(at) is not None and generation(at).steps == ()


def test_trace_download_then_upload_replays_the_same_steps(at: AppTest) -> None:
    slide(at, STEP.temperature, 1.0)
    click(at, "st_step")
    click(at, "st_step")
    trace = json.dumps(to_trace(generation(at))).encode()
    tokens = [s.token_id for s in generation(at).steps]
    other = open_app()
    other.session_state[STEP.tabs] = "Share"
    other.run()
    other.file_uploader(key=STEP.trace_upload).set_value(("trace.json", trace, "application/json")).run()
    assert [s.token_id for s in generation(other).steps] == tokens
    assert any("2 steps replayed" in as_read(s.value) for s in other.success)
    at.session_state[STEP.tabs] = "Share"
    at.run()
    labels = [button.proto.label for button in at.get("download_button")]
    assert labels == ["Download trace (JSON)", "Download as a web page", "Step 2 as a slide (1920×1080)",
                      "Step 2 as a slide (1280×720)"]
    page = generation_recording(generation(at)).encode()  # the web page, dropped on another visitor's app
    third = open_app()
    third.session_state[STEP.tabs] = "Share"
    third.run()
    third.file_uploader(key=STEP.trace_upload).set_value(("lesson.html", page, "text/html")).run()
    assert [s.token_id for s in generation(third).steps] == tokens


def test_malformed_trace_file_shows_a_message_and_keeps_the_generation(at: AppTest) -> None:
    click(at, "st_step")
    kept = generation(at)
    at.session_state[STEP.tabs] = "Share"
    at.run()
    at.file_uploader(key=STEP.trace_upload).set_value(("bad.json", b"{not json", "application/json")).run()
    assert any("bad.json" in as_read(e.value) and "not valid JSON" in as_read(e.value) for e in at.error)
    assert generation(at) is kept


def presenter_keys(at: AppTest) -> dict[str, str] | None:
    """The key -> button map the page drew for the key handler (None: no handler)."""
    bodies = [h.proto.body for h in at.get("html") if 'class="tbt-keys"' in h.proto.body]
    if not bodies:
        return None
    return json.loads(html.unescape(re.search(r'data-keys="([^"]*)"', bodies[0]).group(1)))


def test_presentation_mode_enlarges_type_and_drops_the_detail_tabs(at: AppTest) -> None:
    at.toggle(key=APP.presentation).set_value(True).run()
    assert any(h.proto.body == PRESENTATION_CSS for h in at.get("html"))  # viewport-sized type, no sidebar
    at.toggle(key=STEP.chat).set_value(True).run()  # the templated text inside the folded setup
    assert not at.exception and any("<|im_start|>user" in c.value for c in at.code)
    assert [s.key for s in at.slider] == [STEP.temperature, STEP.top_k, STEP.top_p]  # fewer controls
    click(at, "st_step")
    assert not at.get("tab")  # no detail tabs: termination and sequence probability shown directly
    assert any("fires when picked" in h.proto.body for h in at.get("html"))
    assert any(m.label == "log P(sequence)" for m in at.metric)
    assert branch_pills(at) is None  # no branching on the projector


def test_presentation_mode_keeps_its_sliders_in_the_sampler_view_and_they_resample(at: AppTest) -> None:
    at.toggle(key=APP.presentation).set_value(True).run()
    click(at, "st_step")
    at.slider(key=STEP.temperature).set_value(1.2).run()  # reruns the sampler view it sits in
    assert not at.exception, at.exception
    assert any("Re-sampled step 1" in as_read(i.value) for i in at.info)
    assert generation(at).sampler.temperature == 1.2


def test_presentation_mode_wires_the_presenter_keys_to_step_back_and_run(at: AppTest) -> None:
    assert presenter_keys(at) is None  # normal mode: no key handler, no way out of a mode that is off
    assert not [b for b in at.button if b.key == APP.exit_presentation]
    at.toggle(key=APP.presentation).set_value(True).run()
    assert presenter_keys(at) == {"PageDown": STEP.step, "ArrowRight": STEP.step, " ": STEP.step,
                                  "PageUp": STEP.back, "ArrowLeft": STEP.back, ".": STEP.run}
    assert {b.key for b in at.button} >= {STEP.step, STEP.back, STEP.run}  # the map names real buttons
    hints = html_with(at, "tbt-keys")
    assert f'.st-key-{STEP.step} button::after{{content:"PgDn · → · Space"}}' in hints
    assert "window.addEventListener(\"keydown\"" in hints


def test_presentation_mode_draws_the_step_on_one_screen_and_its_exit_turns_it_off(at: AppTest) -> None:
    at.toggle(key=APP.presentation).set_value(True).run()
    assert not at.header  # the title gives its room to the generation
    click(at, "st_step")
    screen = "".join(h.proto.body for h in at.get("html"))
    for part in ("tbt-chip-window", "tbt-bars-pick", "tbt-decision", "tbt-check"):
        assert part in screen, part
    assert "▶ #1 &#x27;␣Paris&#x27;" in screen  # the pick's row, in the viewport-sized bars
    assert not at.get("plotly_chart")
    click(at, APP.exit_presentation)
    assert not at.session_state[APP.presentation]
    assert presenter_keys(at) is None and at.header[0].value == "Step through"
    assert len(generation(at).steps) == 1


def test_sidebar_shows_the_model_device_and_dtype(at: AppTest) -> None:
    info = " ".join(m.value for m in at.sidebar.markdown)
    assert "SmolLM2-135M-Instruct" in info and "device **cpu**" in info and "dtype **float32**" in info


def test_unloadable_model_keeps_the_current_model_and_remembers_why() -> None:
    """(The sidebar's display of the message is checked in the browser test: AppTest reruns
    after the first run skip app.py's sidebar.)"""
    def script() -> None:
        import streamlit as st

        from ui.server.model import current_source, switch_model
        from ui.session.keys import APP

        st.text(f"{switch_model('/no/such/model.gguf')}|{current_source()}|{st.session_state[APP.model_error]}")

    at = AppTest.from_function(script, default_timeout=TIMEOUT)
    at.run()
    assert not at.exception
    loaded, source, message = at.text[0].value.split("|")
    assert loaded == "False" and source == "bundled"
    assert message == "No file or folder at '/no/such/model.gguf'."


def open_tab(at: AppTest, label: str) -> AppTest:
    at.session_state[STEP.tabs] = label
    at.run()
    assert not at.exception, at.exception
    return at


def test_kv_tab_shows_prefill_then_one_position_per_step_and_the_formula_check(at: AppTest) -> None:
    for _ in range(3):
        click(at, "st_step")
    open_tab(at, "KV cache")
    spec = chart_spec(at, "st_kv_chart")
    assert spec["data"][0]["y"] == [5, 6, 7]  # the 5-token prompt at once, then +1 a step
    check = html_with(at, "measured from the tensors")
    kv = generation(at).steps[-1].kv
    assert f"{kv.bytes:,} bytes" in check and "✓ equal" in check and "(1, 3, 7, 64)" in check


def test_history_tab_lists_every_step(at: AppTest) -> None:
    click(at, "st_step")
    click(at, "st_step")
    open_tab(at, "History")
    table = at.dataframe[0].value
    assert list(table["step"]) == [1, 2]
    assert list(table["id"]) == [s.token_id for s in generation(at).steps]


def test_sequence_tab_shows_log_probability_perplexity_and_the_product(at: AppTest) -> None:
    click(at, "st_step")
    click(at, "st_step")
    open_tab(at, "P(sequence)")
    steps = generation(at).steps
    metrics = {m.label: m.value for m in at.metric}
    assert float(metrics["log P(sequence)"]) == pytest.approx(sum(math.log(s.prob) for s in steps), abs=1e-3)
    assert f"{steps[0].prob:.4f} × {steps[1].prob:.4f}" in html_with(at, "tbt-formula")
    at.radio(key=STEP.sequence_basis).set_value("final").run()
    assert float({m.label: m.value for m in at.metric}["log P(sequence)"]) == 0.0  # greedy: every final p is 1


def test_take_step_again_replaces_the_pick_under_the_new_settings(at: AppTest) -> None:
    click(at, "st_step")
    at.slider(key=STEP.temperature).set_value(1.5).run()
    would_pick = generation(at).resample(generation(at).sampler).decision.token_id
    assert would_pick != generation(at).steps[0].token_id
    click(at, "st_repick")
    step = generation(at).steps[-1]
    assert len(generation(at).steps) == 1
    assert step.token_id == would_pick and step.decision.settings.temperature == 1.5


def test_link_with_a_setting_beyond_the_sliders_shows_a_message() -> None:
    at = open_app({"prompt": "Hello", "sampler": "5.0/0/1.0/0.0/1.0/transformers"})
    assert any("temperature = 5.0 is outside what this page's controls allow (0 to 2)" in as_read(w.value)
               for w in at.warning)
    assert generation(at).sampler.temperature == 0.0 and generation(at).prompt == "The capital of France is"


def test_raising_max_tokens_after_a_finish_rechecks_termination_and_allows_a_step(at: AppTest) -> None:
    use_preset(at, "The capital of France is")
    click(at, "st_run")
    assert generation(at).finish_reason == "max_tokens"
    at.number_input(key=STEP.max_new_tokens).set_value(20).run()
    assert not at.exception, at.exception
    assert generation(at).finish_reason is None
    assert not at.button(key="st_step").disabled
    assert any("re-checked under the new settings, and generation can go on" in i.value for i in at.info)
    click(at, "st_step")
    assert len(generation(at).steps) == 13


def test_a_visitor_back_from_an_idle_tab_finds_their_generation_rebuilt() -> None:
    at = open_app()
    for _ in range(3):
        at.button(key=STEP.step).click().run()
    before = generation(at)
    before.close()  # the idle releaser put it away while the tab sat open
    at.button(key=STEP.step).click().run()
    assert not at.exception, at.exception
    after = generation(at)
    assert not after.closed and len(after.steps) == 4
    assert after.generated_ids[:3] == before.generated_ids
    assert any(as_read(info.value).startswith("Welcome back.") for info in at.info)


def test_the_inside_view_opens_the_latest_steps_pass_and_captures_the_next_ones(at: AppTest) -> None:
    click(at, "st_step")
    before = generation(at).raw_logits()
    at.session_state[STEP.tabs] = "Inside the pass"
    at.run()
    assert not at.exception
    gen = generation(at)
    table = at.dataframe[0].value  # the one table on the page: the lens
    assert len(table) == gen.lm.geometry.layers + 1 and table["layer"].iloc[0] == "embeddings"
    assert torch.equal(gen.raw_logits(), before)  # looking inside changed nothing of the step
    assert gen.inside  # open: the next step captures its own pass
    click(at, "st_step")
    assert len(gen.steps) == 2 and gen._captures.get(1) is not None
    spec = json.loads(at.get("plotly_chart")[-2].proto.spec)  # the heatmap: layers × positions
    assert len(spec["data"][0]["z"]) == gen.lm.geometry.layers
    assert len(spec["data"][0]["z"][0]) == gen.steps[-1].position
    at.session_state[STEP.tabs] = "Termination"
    at.run()
    assert not gen.inside  # closed: nothing is captured


def test_presentation_mode_opens_the_pass_in_place_of_the_distribution_with_one_click(at: AppTest) -> None:
    at.toggle(key=APP.presentation).set_value(True).run()
    click(at, "st_step")
    at.toggle(key=STEP.inside_screen).set_value(True).run()
    assert not at.exception
    gen = generation(at)
    screen = "".join(h.proto.body for h in at.get("html"))
    assert screen.count('class="tbt-lens-cell') == gen.lm.geometry.layers + 1  # every layer's guess
    assert "tbt-bars" not in screen and not at.get("plotly_chart")  # the distribution gives way
    assert any("attention sink" in m.value for m in at.markdown)
    assert gen.inside  # each Step's own pass is captured while the screen is on
    click(at, "st_step")
    assert gen._captures.get(1) is not None and "**Step 2**" in "".join(m.value for m in at.markdown)
    at.toggle(key=STEP.inside_screen).set_value(False).run()
    assert not gen.inside and "tbt-bars" in "".join(h.proto.body for h in at.get("html"))
