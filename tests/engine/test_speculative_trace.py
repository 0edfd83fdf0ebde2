"""Speculative decoding from the command line (one row per round) and in the JSON trace: a saved
speculative trace loads back round for round, old traces still load, bad ones are refused."""

from __future__ import annotations

import json

import pytest

from engine import Generation, SamplerSettings, StopSettings, TraceError, parse_trace, replay, to_trace
from engine.cli import ROUND_HEADER, main
from engine.limits import Limits
from engine.speculative import replay_speculative, speculative_to_trace
from engine.speculative.drafting import PromptLookup
from engine.speculative.generation import SpeculativeGeneration
from engine.speculative.methods import draft_for
from engine.trace import ReplayCancelled

COPY_PROMPT = ("Fix the spelling in this sentence and write it out again: The wether in Lndon was cold and rainy, "
               "so we stayed insid and read books all afternon.")


def speculative(lm, sampler: SamplerSettings, tokens: int = 16, seed: int = 0) -> SpeculativeGeneration:
    generation = SpeculativeGeneration(lm, COPY_PROMPT, chat=True, draft=PromptLookup(lm.eos_ids), k=4,
                                       sampler=sampler, stop=StopSettings(max_new_tokens=tokens), seed=seed)
    list(generation.run())
    return generation


def test_cli_prints_one_row_per_round_and_writes_a_trace_with_the_rounds(lm, cli_on_lm, tmp_path, capsys) -> None:
    path = tmp_path / "trace.json"
    code = main(["--prompt", COPY_PROMPT, "--chat", "--temperature", "0", "--max-new-tokens", "16",
                 "--speculative", "prompt-lookup", "--draft-k", "4", "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    header = lines.index(ROUND_HEADER)
    trace = json.loads(path.read_text())
    rows = lines[header + 1:header + 1 + len(trace["rounds"])]
    assert [int(row.split()[0]) for row in rows] == list(range(1, len(trace["rounds"]) + 1))
    assert f"tokens: 16 in {len(trace['rounds'])} forward passes" in out
    assert trace["speculative"] == {"method": "prompt-lookup", "k": 4}
    assert [s["token_id"] for s in trace["steps"]] == [i for r in trace["rounds"] for i in r["emitted_ids"]]


@pytest.mark.parametrize(("options", "message"), [
    (["--draft-k", "9"], "k = 9 is not allowed"),
    (["--speculative", "draft-model"], "--draft-model"),
    (["--speculative", "draft-model", "--draft-model", "./no/such/model"], "No file or folder"),
])
def test_cli_bad_speculative_options_say_what_is_wrong(cli_on_lm, capsys, options, message) -> None:
    argv = ["--prompt", "Hi", "--max-new-tokens", "2", *options]
    if "--speculative" not in options:
        argv += ["--speculative", "prompt-lookup"]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("sampler", [SamplerSettings(temperature=0), SamplerSettings(temperature=0.8, top_p=0.9)],
                         ids=["greedy", "sampled"])
def test_a_saved_speculative_trace_replays_round_for_round(lm, sampler) -> None:
    original = speculative(lm, sampler, seed=3)
    trace = parse_trace(json.dumps(speculative_to_trace(original)))
    result = replay_speculative(lm, trace, lambda name: draft_for(lm, name))
    assert result.mismatched_rounds == ()
    assert result.generation.generated_ids == original.generated_ids
    assert [r.emitted_ids for r in result.generation.rounds] == [r.emitted_ids for r in original.rounds]
    assert result.generation.finish_reason == original.finish_reason


def test_a_speculative_trace_also_replays_as_plain_decoding(lm) -> None:
    original = speculative(lm, SamplerSettings(temperature=0))
    result = replay(lm, speculative_to_trace(original))
    assert result.generation.generated_ids == original.generated_ids and result.mismatched_steps == ()


def test_an_old_trace_without_rounds_still_loads_and_is_not_taken_for_a_speculative_one(lm) -> None:
    generation = Generation(lm, "Hello", sampler=SamplerSettings(temperature=0), stop=StopSettings(max_new_tokens=2))
    list(generation.run())
    trace = parse_trace(json.dumps(to_trace(generation)))
    assert "rounds" not in trace
    with pytest.raises(TraceError, match="no speculative rounds"):
        replay_speculative(lm, trace, lambda name: draft_for(lm, name))


def test_a_round_missing_its_tokens_is_refused(lm) -> None:
    trace = speculative_to_trace(speculative(lm, SamplerSettings(temperature=0), tokens=4))
    del trace["rounds"][0]["emitted_ids"]
    with pytest.raises(TraceError, match="Round 1 of the trace lacks"):
        parse_trace(trace)


def test_a_speculative_replay_keeps_to_the_servers_caps(lm) -> None:
    trace = speculative_to_trace(speculative(lm, SamplerSettings(temperature=0)))  # 16 new tokens

    def replayed(limits: Limits):
        return replay_speculative(lm, trace, lambda name: draft_for(lm, name), limits)

    with pytest.raises(TraceError, match="max_new_tokens = 16 is not allowed: at most 8"):
        replayed(Limits(max_new_tokens=8))
    with pytest.raises(TraceError, match="this server replays at most 4"):
        replayed(Limits(max_replay_steps=4))
    with pytest.raises(ReplayCancelled, match="stopped after 1 of"):
        replayed(Limits(replay_seconds=1e-9))
