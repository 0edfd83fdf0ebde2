"""Traces round-trip and replay; bad settings are rejected with messages that name the
parameter, its value and the allowed range; token pieces stay visible; the CLI works;
the engine never imports Streamlit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from engine import (
    Generation,
    SamplerSettings,
    SettingsError,
    StopSettings,
    TraceError,
    parse_trace,
    replay,
    save_trace,
    to_trace,
)

ROOT = Path(__file__).resolve().parents[2]
SAMPLED = SamplerSettings(temperature=0.8, top_k=50, top_p=0.9)


def test_trace_round_trips_through_json_and_replays_to_the_same_tokens(lm, tmp_path) -> None:
    generation = Generation(lm, "A short poem about rain:", sampler=SAMPLED, seed=21,
                            stop=StopSettings(max_new_tokens=6, stop_sequences=("\n\n",)))
    generation.step()
    generation.sampler = SamplerSettings(temperature=0)  # settings may change between steps
    generation.step(force_token_id=lm.tokenizer.convert_tokens_to_ids("ĠThe"))
    generation.sampler = SAMPLED
    list(generation.run())
    path = save_trace(generation, tmp_path / "trace.json")
    trace = parse_trace(path.read_text())
    assert trace == json.loads(json.dumps(to_trace(generation)))
    assert trace["steps"][1]["forced"] and trace["steps"][1]["sampler"]["temperature"] == 0.0
    again = replay(lm, trace)
    assert again.mismatched_steps == ()
    assert again.generation.generated_ids == generation.generated_ids
    assert again.generation.text == generation.text == trace["text"]
    assert again.generation.stop == generation.stop


def test_trace_has_the_documented_fields(lm) -> None:
    generation = Generation(lm, "Hello", sampler=SamplerSettings(temperature=0), stop=StopSettings(max_new_tokens=2))
    list(generation.run())
    trace = to_trace(generation)
    assert {"prompt_token_ids", "steps", "finish_reason", "text", "timing"} <= trace.keys()
    assert {"load_s", "prefill_s", "decode_s"} <= trace["timing"].keys()
    step = trace["steps"][0]
    assert {"index", "token_id", "text", "prob", "final_prob", "top", "kv_cache"} <= step.keys()
    assert {"token_id", "text", "logit", "prob", "final_prob"} <= step["top"][0].keys()
    assert [c["prob"] for c in step["top"]] == sorted((c["prob"] for c in step["top"]), reverse=True)
    assert step["kv_cache"]["tokens"] == len(trace["prompt_token_ids"])
    assert step["kv_cache"]["bytes"] == 2 * 30 * 3 * 64 * step["kv_cache"]["tokens"] * 4


def test_each_trace_step_carries_the_output_decoded_up_to_it(lm) -> None:
    generation = Generation(lm, "The capital of France is", sampler=SamplerSettings(temperature=0),
                            stop=StopSettings(max_new_tokens=6, ignore_eos=True))
    list(generation.run())
    texts = [step["output_text"] for step in to_trace(generation)["steps"]]
    assert texts == [lm.tokenizer.decode(generation.generated_ids[:n], skip_special_tokens=True) for n in range(1, 7)]
    assert texts[-1] == generation.output_text


@pytest.mark.parametrize(("text", "message"), [
    ("not json", "not valid JSON"),
    ('{"format": "other"}', "not a Token by Token trace"),
    ('{"format": "token-by-token/trace", "version": 99}', "version 99"),
    ('{"format": "token-by-token/trace", "version": 1, "prompt": "x"}', "missing"),
    ('{"format": "token-by-token/trace", "version": 1, "prompt": "x", "chat": false, "seed": 0, "stop": {},'
     ' "prompt_token_ids": [], "steps": [{"index": 1}], "finish_reason": null, "text": ""}', "Step 1"),
])
def test_malformed_traces_are_rejected_with_a_reason(text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        parse_trace(text)


@pytest.mark.parametrize(("make", "parameter", "allowed"), [
    (lambda: SamplerSettings(temperature=-0.5), "temperature", "from 0 to 100"),
    (lambda: SamplerSettings(temperature=float("nan")), "temperature", "from 0 to 100"),
    (lambda: SamplerSettings(top_k=-1), "top_k", "from 0 to 10,000,000"),
    (lambda: SamplerSettings(top_k=2.5), "top_k", "whole number"),
    (lambda: SamplerSettings(top_p=1.5), "top_p", "from 0 to 1"),
    (lambda: SamplerSettings(min_p=-0.1), "min_p", "from 0 to 1"),
    (lambda: SamplerSettings(repetition_penalty=0), "repetition_penalty", "from 0.01 to 100"),
    (lambda: SamplerSettings(chain="mine"), "chain", "transformers, vllm, llama.cpp"),
    (lambda: StopSettings(max_new_tokens=0), "max_new_tokens", "from 1 to 1,000,000"),
    (lambda: StopSettings(stop_sequences=("a", "b", "c", "d", "e")), "stop_sequences", "at most 4"),
    (lambda: StopSettings(stop_sequences=("",)), "stop_sequences", "non-empty"),
])
def test_bad_settings_name_the_parameter_value_and_range(make, parameter: str, allowed: str) -> None:
    with pytest.raises(SettingsError) as error:
        make()
    assert error.value.parameter == parameter
    assert str(error.value).startswith(parameter) and allowed in str(error.value)


def test_bad_seed_and_forced_token_are_rejected(lm) -> None:
    with pytest.raises(SettingsError, match="seed"):
        Generation(lm, "Hi", seed=-1)
    with pytest.raises(SettingsError, match=r"force_token_id = 49152 .* 0 to 49151"):
        Generation(lm, "Hi").step(force_token_id=49152)


def test_special_and_partial_byte_tokens_are_shown_visibly(lm) -> None:
    texts = lm.texts
    assert texts.piece(2).text == "<|im_end|>" and texts.piece(2).special
    ids = lm.tokenizer("naïve café ✓", add_special_tokens=False)["input_ids"]
    pieces = [texts.piece(i) for i in ids]
    partial = [p for p in pieces if p.partial_bytes]
    assert partial, "the check mark should span several byte tokens"
    assert all("<0x" in p.text and "\ufffd" not in p.text for p in partial)
    assert lm.tokenizer.decode(ids) == "naïve café ✓"


@pytest.mark.model  # the command line loads the real model in its own process
def test_cli_prints_a_step_table_and_writes_the_trace(tmp_path) -> None:
    path, page, slide = tmp_path / "cli.json", tmp_path / "cli.html", tmp_path / "cli.png"
    out = subprocess.run(
        [sys.executable, "-m", "engine", "--prompt", "The capital of France is", "--temperature", "0",
         "--max-new-tokens", "5", "--stop", "\\n", "--json", str(path), "--html", str(page), "--slide", str(slide),
         "--slide-size", "1280x720", "--slide-theme", "dark"],
        capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.split()[:2] == ["1", "Paris"] for line in lines)
    assert "finish_reason: stop_sequence" in out.stdout
    trace = parse_trace(path.read_text())
    assert trace["text"] == " Paris." and trace["finish_reason"] == "stop_sequence"
    assert f"recording: {page}" in out.stdout and parse_trace(page.read_text()) == trace  # the page carries it
    with Image.open(slide) as picture:  # the last step, for a 720p slide, dark
        assert picture.size == (1280, 720) and picture.getpixel((5, 5)) == (23, 22, 20)


def test_cli_rejects_bad_settings_with_the_reason_before_loading_a_model(monkeypatch, capsys) -> None:
    from engine import cli

    monkeypatch.setattr(cli, "load_model", lambda *args, **options: pytest.fail("loaded a model"))
    assert cli.main(["--prompt", "x", "--top-p", "2"]) == 2
    assert "top_p = 2.0 is not allowed: a number from 0 to 1" in capsys.readouterr().err


def test_a_replay_records_each_steps_conditions_under_the_traces_own_stop_settings(tiny_lm) -> None:
    """A replay steps with EOS ignored and the cap raised; its records must not say so."""
    generation = Generation(tiny_lm, "abc", sampler=SamplerSettings(temperature=0), stop=StopSettings(max_new_tokens=3))
    list(generation.run())
    again = replay(tiny_lm, to_trace(generation)).generation
    assert [s.termination for s in again.steps] == [s.termination for s in generation.steps]
    assert again.termination == again.steps[-1].termination  # the page's "stop settings changed" stays silent


def test_a_trace_text_kept_between_saves_loads_as_to_trace_and_encodes_only_the_steps_that_changed(
        tiny_lm, monkeypatch) -> None:
    """A class room saves its trace after every Step: the kept text must equal `to_trace` after
    steps, a rewind, a forced token, a change of sampler and records rewritten in place, while
    encoding each standing step once."""
    from engine import TraceText
    from engine import trace as trace_module

    encoded: list[int] = []
    step_to_dict = trace_module._step_to_dict
    monkeypatch.setattr(trace_module, "_step_to_dict", lambda step, text: (encoded.append(step.index),
                                                                           step_to_dict(step, text))[1])
    generation = Generation(tiny_lm, "abc", sampler=SAMPLED, seed=3, stop=StopSettings(max_new_tokens=8))
    text = TraceText()

    def same_as_to_trace() -> None:
        kept = json.loads(text.of(generation))
        assert kept == json.loads(json.dumps(to_trace(generation)))
        assert parse_trace(kept) == kept
        encoded.clear()  # to_trace encodes every step

    same_as_to_trace()  # no step yet
    for _ in range(3):
        generation.step()
    same_as_to_trace()
    generation.step()
    assert json.loads(text.of(generation))["steps"][-1]["index"] == 4 and encoded == [4]
    generation.rewind(2)
    generation.sampler = SamplerSettings(temperature=0)
    generation.step(force_token_id=5)
    same_as_to_trace()
    generation.step()
    text.of(generation)
    assert encoded == [4]  # steps 1-3 stand: only the new one is encoded
    generation.recheck_terminations()  # every record replaced
    encoded.clear()
    text.of(generation)
    assert encoded == [1, 2, 3, 4]
    same_as_to_trace()
