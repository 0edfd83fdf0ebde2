"""The Breaking the chain page on the real model: Step shows one round beside the plain lane,
Run goes to a stop condition with both texts identical, Reset starts over, the draft method
switches mid-generation with the tokens kept, and bad input leaves a message and the lanes.
The controller (ui/controllers/breaking_the_chain.py) is also tested on its own, without Streamlit."""

from __future__ import annotations

import json
import re

import pytest
from streamlit.testing.v1 import AppTest

import engine
from engine import (
    ModelLoadError,
    PromptLookup,
    SamplerSettings,
    SettingsError,
    SpeculativeGeneration,
    StopSettings,
)
from engine.speculative import speculative_to_trace
from tests.ui.apptest import as_read, open_page
from ui.controllers import breaking_the_chain as bc
from ui.server.deployment import current_deployment
from ui.session.keys import APP, CHAIN

PAGE = "pages/breaking_the_chain.py"


def lanes(at: AppTest) -> bc.Lanes:
    return at.session_state[CHAIN.lanes]


def click(at: AppTest, key: str) -> AppTest:
    at.button(key=key).click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def html_with(at: AppTest, marker: str) -> str:
    return next(h.proto.body for h in at.get("html") if marker in h.proto.body)


@pytest.fixture()
def at() -> AppTest:
    return open_page(PAGE)


def test_step_runs_one_round_and_the_plain_lane_catches_up(at: AppTest) -> None:
    click(at, CHAIN.step)  # round 1: the prefill; the copying preset has nothing to look up yet
    said = " ".join(m.value for m in at.markdown)
    assert "Round 1: no guess, a plain decode step (1 token, one forward pass)" in said
    assert "returned 1 distribution, the one after the context" in said and "last 3 tokens" in said
    assert not re.search(r"(?<!\+ )\b1 (tokens|distributions|positions|were)\b", said)  # (not "k + 1 tokens")
    click(at, CHAIN.step)
    spec = lanes(at).speculative
    assert len(spec.rounds) == 2
    assert len(lanes(at).plain.steps) == len(spec.generated_ids)
    assert metric(at, "forward passes: speculative") == "2"
    assert metric(at, "tokens produced") == str(len(spec.generated_ids))
    assert 'data-rounds="2"' in html_with(at, "data-rounds=")
    assert any(m.value.startswith("### Round 2:") for m in at.markdown)
    assert html_with(at, "<div class=\"bc-guesses\">").count('class="bc-pos') == len(spec.rounds[-1].positions)


def test_run_goes_to_the_stop_condition_with_identical_text_and_fewer_passes(at: AppTest) -> None:
    click(at, CHAIN.run)
    pair = lanes(at)
    assert pair.speculative.finished and pair.speculative.finish_reason == pair.plain.finish_reason == "eos"
    assert pair.speculative.generated_ids == pair.plain.generated_ids
    assert len(pair.speculative.rounds) < len(pair.plain.steps)
    assert any("Identical text" in s.value for s in at.success)
    assert at.button(key=CHAIN.step).disabled
    assert any("finished: eos" in m.value for m in at.markdown)
    assert any("Expected tokens per round" in m.value for m in at.markdown)
    per_token = next(m.value for m in at.markdown if m.value.startswith("**Time per token so far**"))
    assert "× faster" in per_token or "× slower" in per_token or "about as fast as" in per_token
    assert "1.00×" not in per_token


def test_reset_starts_both_lanes_over(at: AppTest) -> None:
    click(at, CHAIN.step)
    click(at, CHAIN.reset)
    assert lanes(at).speculative.rounds == () and lanes(at).plain.steps == ()
    assert metric(at, "tokens produced") == "0"


def test_switching_the_draft_method_mid_generation_keeps_the_tokens(at: AppTest) -> None:
    click(at, CHAIN.step)
    kept = lanes(at).speculative.generated_ids
    at.selectbox(key=CHAIN.method).select(bc.SELF_BF16).run()
    assert not at.exception
    assert lanes(at).speculative.generated_ids == kept
    assert any("From round 2 on" in as_read(i.value) for i in at.info)
    click(at, CHAIN.step)
    record = lanes(at).speculative.rounds[-1]
    assert record.method == "self-draft-bfloat16" and not record.deterministic_draft
    assert lanes(at).identical


def test_a_draft_that_fails_to_load_leaves_a_message_and_the_method(at: AppTest, monkeypatch) -> None:
    def broken(lm, kind):
        raise ModelLoadError(f"Could not make a {kind} copy: out of memory")

    monkeypatch.setattr(engine, "self_draft", broken)
    click(at, CHAIN.step)
    at.selectbox(key=CHAIN.method).select(bc.SELF_INT8).run()
    assert not at.exception
    assert any("out of memory" in as_read(e.value) and "goes on with prompt lookup" in as_read(e.value)
               for e in at.error)
    assert at.selectbox(key=CHAIN.method).value == bc.PROMPT_LOOKUP
    click(at, CHAIN.step)
    assert lanes(at).speculative.rounds[-1].method == "prompt-lookup"


def test_k_outside_one_to_eight_leaves_a_message_and_the_rounds_go_on(at: AppTest) -> None:
    at.number_input(key=CHAIN.k).set_value(12).run()
    assert any("k = 12 is not allowed" in as_read(e.value) and "from 1 to 8" in as_read(e.value) for e in at.error)
    click(at, CHAIN.step)
    assert lanes(at).speculative.k == 4 and len(lanes(at).speculative.rounds) == 1


def test_a_saved_speculative_trace_loads_back_on_the_page(lm, at: AppTest) -> None:
    generation = SpeculativeGeneration(lm, "Once upon a time, once upon a time,", draft=PromptLookup(lm.eos_ids),
                                       k=3, sampler=SamplerSettings(temperature=0.7),
                                       stop=StopSettings(max_new_tokens=12), seed=5)
    list(generation.run())
    data = json.dumps(speculative_to_trace(generation)).encode()
    at.file_uploader(key=CHAIN.trace_upload).set_value(("run.json", data, "application/json")).run()
    assert not at.exception
    assert any(f"Loaded run.json: {len(generation.rounds)} rounds replayed." == as_read(s.value) for s in at.success)
    loaded = lanes(at)
    assert loaded.speculative.generated_ids == generation.generated_ids
    assert len(loaded.plain.steps) == len(generation.generated_ids)
    assert at.text_area(key=CHAIN.prompt).value == generation.prompt and at.number_input(key=CHAIN.k).value == 3
    at.file_uploader(key=CHAIN.trace_upload).set_value(("bad.json", b"{}", "application/json")).run()
    assert any("bad.json" in as_read(e.value) and "not a Token by Token trace" in as_read(e.value) for e in at.error)
    assert lanes(at) is loaded and not at.success  # the earlier "Loaded" note gave way to the error


def test_a_file_name_is_shown_as_written_not_as_markdown(at: AppTest) -> None:
    name = "[click](https://example.com) **now**.json"
    at.file_uploader(key=CHAIN.trace_upload).set_value((name, b"{}", "application/json")).run()
    shown = next(e.value for e in at.error if "not a Token by Token trace" in as_read(e.value))
    assert as_read(shown).startswith(name + ":")
    assert "[click](" not in shown and "**now**" not in shown  # escaped: no link, no bold


# ---- the controller alone -------------------------------------------------------------------


def fresh_state(**values) -> dict:
    state: dict = {}
    bc.init_defaults(state)
    state.update(values)
    return state


def lookup(lm, method: str):
    if method != bc.PROMPT_LOOKUP:
        raise SettingsError("draft model", method, "a model with the target's tokenizer")
    return PromptLookup(lm.eos_ids)


def test_controller_steps_until_finished_and_both_lanes_agree(lm) -> None:
    state = fresh_state(**{CHAIN.max_new_tokens: 10})
    bc.sync(state, lm, lookup)
    while not state[CHAIN.lanes].speculative.finished:
        bc.step(state, lookup)
    pair = state[CHAIN.lanes]
    assert pair.speculative.generated_ids == pair.plain.generated_ids and len(pair.plain.steps) == 10
    bc.step(state, lookup)
    assert "finished" in bc.message(state, "buttons")


def test_controller_refuses_a_draft_with_another_tokenizer_and_keeps_prompt_lookup(lm) -> None:
    state = fresh_state()
    bc.sync(state, lm, lookup)
    state[CHAIN.method] = bc.SELF_BF16
    bc.choose_method(state, lm, lookup)
    assert state[CHAIN.method] == bc.PROMPT_LOOKUP and "tokenizer" in bc.message(state, "method")


def test_controller_starts_over_only_when_the_prompt_changes(lm) -> None:
    state = fresh_state()
    first = bc.sync(state, lm, lookup)
    state[CHAIN.temperature] = 0.5
    assert bc.sync(state, lm, lookup) is first and first.speculative.sampler.temperature == 0.5
    state[CHAIN.prompt] = "Another prompt"
    assert bc.sync(state, lm, lookup) is not first
    state[CHAIN.prompt] = "  "
    kept = bc.sync(state, lm, lookup)
    assert kept is state[CHAIN.lanes] and "prompt is empty" in bc.message(state, "setup")


# ---- the server's caps ----------------------------------------------------------------------


@pytest.fixture()
def capped(monkeypatch):
    """A server that allows 8 new tokens and 1 MB uploads."""
    monkeypatch.setenv("TBT_MAX_NEW_TOKENS", "8")
    monkeypatch.setenv("TBT_MAX_UPLOAD_MB", "1")
    current_deployment.cache_clear()
    yield current_deployment().limits
    current_deployment.cache_clear()


def test_controller_keeps_both_lanes_within_the_servers_cap(lm, capped) -> None:
    state = fresh_state(**{CHAIN.max_new_tokens: 8})
    pair = bc.sync(state, lm, lookup)
    assert pair.speculative.limits == pair.plain.limits == capped
    assert not pair.plain.allow_special and not pair.speculative.allow_special
    state[CHAIN.max_new_tokens] = 9
    assert bc.sync(state, lm, lookup) is pair and "at most 8 on this server" in bc.message(state, "stop")
    assert pair.speculative.stop.max_new_tokens == pair.plain.stop.max_new_tokens == 8
    state[CHAIN.prompt] = "Another prompt"
    assert bc.sync(state, lm, lookup) is pair and "at most 8 on this server" in bc.message(state, "setup")


def test_controller_refuses_a_trace_beyond_the_servers_cap_or_the_widgets(lm, capped) -> None:
    state = fresh_state(**{CHAIN.max_new_tokens: 8})
    pair = bc.sync(state, lm, lookup)
    generation = SpeculativeGeneration(lm, "Once upon a time,", draft=PromptLookup(lm.eos_ids), k=2,
                                       stop=StopSettings(max_new_tokens=12))
    list(generation.run(max_rounds=1))
    trace = speculative_to_trace(generation)
    bc.load_trace(state, lm, lookup, json.dumps(trace), "long.json")
    assert "long.json" in bc.message(state, "trace_error") and "at most 8" in bc.message(state, "trace_error")
    hot = trace | {"stop": trace["stop"] | {"max_new_tokens": 8}, "sampler": trace["sampler"] | {"temperature": 5.0}}
    bc.load_trace(state, lm, lookup, json.dumps(hot), "hot.json")
    assert "temperature = 5.0 is outside" in bc.message(state, "trace_error")
    assert state[CHAIN.lanes] is pair and state[CHAIN.temperature] == 0.0


def test_the_page_caps_max_new_tokens_and_the_upload_size(capped) -> None:
    at = open_page(PAGE, {CHAIN.prompt: "Repeat: one two three", CHAIN.max_new_tokens: 8})
    assert at.number_input(key=CHAIN.max_new_tokens).max == 8
    big = b" " * (capped.max_upload_bytes + 1)
    at.file_uploader(key=CHAIN.trace_upload).set_value(("big.json", big, "application/json")).run()
    assert any(as_read(e.value).startswith("big.json: The file is 1.0 MB; this server takes files up to 1.0 MB")
               for e in at.error), [e.value for e in at.error]


# ---- presentation mode ------------------------------------------------------------------------


def test_presentation_mode_shows_the_round_on_one_line_and_folds_the_setup_away() -> None:
    at = open_page(PAGE, {APP.presentation: True})
    assert not at.header and at.expander[-1].label == "Prompt and settings"  # below the workspace
    keys = html_with(at, "tbt-keys")
    assert all(f"&quot;{k}&quot;: &quot;{CHAIN.step}&quot;" in keys for k in ("PageDown", "ArrowRight", " "))
    assert f"&quot;.&quot;: &quot;{CHAIN.run}&quot;" in keys and "PageUp" not in keys
    for _ in range(3):
        click(at, CHAIN.step)
    record = lanes(at).speculative.rounds[-1]
    line = html_with(at, 'class="bc-line"')
    assert f'data-round="3" data-accepted="{record.accepted}" data-drafted="{len(record.drafted)}"' in line
    assert line.count("bc-mark bc-ok") == record.accepted
    assert line.count("bc-mark bc-bad") == (record.rejection is not None)
    assert "tbt-chip-window" in html_with(at, "data-rounds=") and "tbt-chip-window" in html_with(at, "data-steps=")


def test_lanes_put_away_while_the_tab_sat_idle_come_back_exactly_on_the_next_click(at: AppTest) -> None:
    for _ in range(3):
        click(at, CHAIN.step)
    before = lanes(at)
    tokens, rounds = before.speculative.generated_ids, before.speculative.rounds
    before.speculative.close()  # what the idle releaser does to both lanes
    before.plain.close()
    assert before.speculative.kv.positions == 0
    click(at, CHAIN.step)
    after = lanes(at)
    assert after is not before and not after.speculative.closed and not after.plain.closed
    assert after.speculative.generated_ids[:len(tokens)] == tokens
    assert [r.emitted_ids for r in after.speculative.rounds[:3]] == [r.emitted_ids for r in rounds]
    assert [r.positions for r in after.speculative.rounds[:3]] == [r.positions for r in rounds]  # same q and p
    assert len(after.speculative.rounds) == 4 and after.identical
    assert any(as_read(info.value).startswith("Welcome back. Your two lanes") for info in at.info)


def test_a_closed_speculative_generation_refuses_to_step_and_frees_its_draft_models_cache(lm) -> None:
    draft = engine.DraftModel(lm, lm, name="self-draft-test")
    spec = SpeculativeGeneration(lm, "The capital of France is", draft=draft, k=2,
                                 stop=StopSettings(max_new_tokens=8, ignore_eos=True))
    spec.step()
    spec.step()
    assert draft._cached_ids and spec.kv.positions > 0
    spec.close()
    assert spec.closed and spec.kv.positions == 0 and not draft._cached_ids
    assert len(spec.rounds) == 2  # the page can still show them
    with pytest.raises(engine.GenerationFinished, match="closed to free its memory"):
        spec.step()


@pytest.mark.parametrize("method", [bc.LOOKAHEAD, bc.EARLY_EXIT, bc.HEADS, bc.MTP])
def test_each_new_method_drafts_on_the_page_and_says_how_it_guessed(at: AppTest, method: str) -> None:
    at.selectbox(key=CHAIN.method).set_value(method).run()
    for _ in range(3):
        click(at, CHAIN.step)
    assert not at.exception
    spec = lanes(at).speculative
    names = {bc.EARLY_EXIT: "early-exit-", bc.LOOKAHEAD: "lookahead", bc.HEADS: "medusa-heads", bc.MTP: "mtp"}
    assert spec.draft.name.startswith(names[method])
    assert spec.generated_ids == lanes(at).plain.generated_ids[:len(spec.generated_ids)]
    if any(r.drafted for r in spec.rounds[-1:]):
        words = ("Lookahead guessed from", "Early exit:", "Parallel decoding heads:", "Multi-token prediction:")
        assert any(any(w in as_read(c.value) for w in words) for c in at.caption)


def test_the_race_runs_every_method_on_the_prompt_and_checks_each_text(at: AppTest, monkeypatch) -> None:
    monkeypatch.setattr(bc, "RACE_TOKENS", 8)
    monkeypatch.setattr(bc, "RACE_METHODS", (bc.PROMPT_LOOKUP, bc.LOOKAHEAD, bc.EARLY_EXIT))
    at.run()
    assert "4 runs of 8 new tokens" in " ".join(as_read(c.value) for c in at.caption)  # its cost, said first
    click(at, CHAIN.race)
    assert not at.exception
    job = at.session_state[CHAIN.race_job]  # on its own thread: the page is drawn meanwhile
    assert job.labels[1:] == (bc.PROMPT_LOOKUP, bc.LOOKAHEAD, bc.EARLY_EXIT)
    assert at.get("progress") or job.done  # the live view (unless the race already ended)
    assert job.wait(300)
    at.run()
    assert not at.exception and CHAIN.race_job not in at.session_state
    rows = at.session_state[CHAIN.race_rows]
    assert [row.label for row in rows][1:] == [bc.PROMPT_LOOKUP, bc.LOOKAHEAD, bc.EARLY_EXIT]
    assert all(row.same_text for row in rows) and all(row.tokens == rows[0].tokens for row in rows)
    table = at.dataframe[-1].value
    assert list(table["same text"]) == ["✓"] * 4 and table["speed-up"].iloc[0] == "1.00×"
    assert list(table["k"]) == ["–", "4", "4", "4"]
    verdict = next(m.value for m in at.markdown if "fastest here" in m.value or "No method beat" in m.value)
    assert all(row.label in verdict for row in rows[1:] if row.ms_per_token > rows[0].ms_per_token)
    assert "8 new tokens" in " ".join(as_read(c.value) for c in at.caption)  # the next race's cost: this one's
