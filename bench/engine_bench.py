"""Engine benchmark: the fully instrumented step against transformers' generate().

    .venv/bin/python -m bench.engine_bench [--tokens 128] [--rounds 6]

Measures, on this machine and in one run:
  - per-token time of the engine (every record filled) vs generate() on the same model,
    prompt and token count (greedy), rounds interleaved so both see the same conditions;
  - that every step's pick and its logit are generate()'s, to the last bit (untimed: a
    generate() run that keeps its logits), and which pass the engine's lone steps took;
  - re-sampling one step with new settings vs a full step;
  - cold load (GGUF dequantised into an empty cache) and warm load, each in a fresh process;
  - peak resident memory of this process.
Writes bench/results/engine.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from copy import deepcopy
from pathlib import Path

import torch

from engine import Generation, SamplerSettings, StopSettings, load_model
from engine.forward import lone_pass_decision

PROMPT = "Write a short story about a robot who learns to paint."
RESULTS = Path(__file__).parent / "results"
LOAD_SNIPPET = "import time, engine; t = time.perf_counter(); lm = engine.load_model(); " \
               "print(time.perf_counter() - t, lm.from_cache)"


class _Clock:
    """A generate() streamer that only timestamps each new token."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        pass


def time_generate(lm, prompt_ids: list[int], tokens: int) -> tuple[float, list[float]]:
    """Total seconds and per-token decode intervals of generate(), exactly `tokens` of them
    (min_new_tokens masks the end token, as the engine's ignore-EOS lets it run on)."""
    config = deepcopy(lm.model.generation_config)
    config.update(do_sample=False, max_new_tokens=tokens, min_new_tokens=tokens)
    ids = torch.tensor([prompt_ids])
    clock = _Clock()
    started = time.perf_counter()
    with torch.inference_mode():
        out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config,
                                streamer=clock)
    total = time.perf_counter() - started
    assert out.shape[1] - len(prompt_ids) == tokens
    # the first put() is the prompt, the second the first new token; intervals after it are decode steps
    decode = [b - a for a, b in itertools.pairwise(clock.stamps[1:])]
    return total, decode


def time_engine(lm, tokens: int) -> tuple[float, list[float], Generation]:
    generation = Generation(lm, PROMPT, sampler=SamplerSettings(temperature=0),
                            stop=StopSettings(max_new_tokens=tokens, ignore_eos=True))
    started = time.perf_counter()
    stamps = [time.perf_counter()]
    for _ in generation.run():
        stamps.append(time.perf_counter())
    total = time.perf_counter() - started
    decode = [b - a for a, b in itertools.pairwise(stamps[1:])]
    return total, decode, generation


def picks_match_generate(lm, tokens: int) -> tuple[bool, int]:
    """A greedy chat generation of up to `tokens` tokens against generate() on the same prompt:
    whether every pick and its logit are generate()'s, bit for bit, and how many steps that was.
    (The timed runs ignore the end token and generate() masks it to run on, so their tokens part
    at the first end token; here both stop there.)"""
    generation = Generation(lm, PROMPT, chat=True, sampler=SamplerSettings(temperature=0),
                            stop=StopSettings(max_new_tokens=tokens))
    list(generation.run())
    config = deepcopy(lm.model.generation_config)
    config.update(do_sample=False, max_new_tokens=tokens, output_logits=True, return_dict_in_generate=True)
    ids = torch.tensor([generation.prompt_ids])
    with torch.inference_mode():
        out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    picks = out.sequences[0, len(generation.prompt_ids):].tolist()
    pairs = zip(generation.steps, out.logits, strict=False)
    same = picks == [s.token_id for s in generation.steps] and all(
        step.logit == float(logits[0, step.token_id]) for step, logits in pairs)
    return same, len(picks)


def time_resample(generation: Generation, repeats: int = 20) -> dict[str, float]:
    settings = {
        "greedy": SamplerSettings(temperature=0),
        "temperature 0.7": SamplerSettings(temperature=0.7),
        "T 0.8, top-k 50, top-p 0.9, min-p 0.05, rep 1.2": SamplerSettings(
            temperature=0.8, top_k=50, top_p=0.9, min_p=0.05, repetition_penalty=1.2),
    }
    out = {}
    for name, sampler in settings.items():
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            generation.resample(sampler)
            times.append((time.perf_counter() - started) * 1e3)
        out[name] = statistics.median(times)
    return out


def time_loads() -> dict[str, float]:
    """Cold (empty cache) then warm load, each in a fresh Python process."""
    results = {}
    with tempfile.TemporaryDirectory() as cache:
        env = os.environ | {"TOKEN_BY_TOKEN_CACHE": cache}
        for label in ("cold", "warm"):
            started = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", LOAD_SNIPPET], env=env, capture_output=True,
                                 text=True, check=True)
            seconds, from_cache = out.stdout.split()
            assert (from_cache == "True") == (label == "warm")
            results[f"{label}_load_s"] = float(seconds)
            results[f"{label}_process_s"] = time.perf_counter() - started
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--skip-load", action="store_true", help="skip the cold/warm load timing")
    args = parser.parse_args()

    lm = load_model()
    engine_totals, generate_totals, engine_steps, generate_steps = [], [], [], []
    generation = None
    prompt_ids = Generation(lm, PROMPT).prompt_ids
    for round_index in range(args.rounds):  # interleaved, each going first in turn, so drift hits both alike
        for which in ("engine", "generate") if round_index % 2 == 0 else ("generate", "engine"):
            if which == "engine":
                total, decode, generation = time_engine(lm, args.tokens)
                engine_totals.append(total)
                engine_steps += decode
            else:
                total, decode = time_generate(lm, prompt_ids, args.tokens)
                generate_totals.append(total)
                generate_steps += decode
    assert generation is not None
    step_ms = statistics.median(engine_steps) * 1e3
    results = {
        "tokens": args.tokens,
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "engine_per_token_ms": statistics.median(engine_totals) / args.tokens * 1e3,
        "generate_per_token_ms": statistics.median(generate_totals) / args.tokens * 1e3,
        "engine_decode_step_ms": step_ms,
        "generate_decode_step_ms": statistics.median(generate_steps) * 1e3,
        "resample_ms": time_resample(generation),
        "lone_pass": lone_pass_decision(lm).path,
        "picks_and_logits_equal_generate": picks_match_generate(lm, args.tokens),
        "kv_bytes_at_end": generation.kv.bytes,
    }
    results["ratio_per_token"] = results["engine_per_token_ms"] / results["generate_per_token_ms"]
    results["ratio_decode_step"] = results["engine_decode_step_ms"] / results["generate_decode_step_ms"]
    if not args.skip_load:
        results |= time_loads()
    results["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "engine.json").write_text(json.dumps(results, indent=2))
    print(f"greedy, {args.tokens} tokens, {args.rounds} interleaved rounds, {results['threads']} threads")
    print(f"  per token (prefill included): engine {results['engine_per_token_ms']:.1f} ms, "
          f"generate() {results['generate_per_token_ms']:.1f} ms, ratio {results['ratio_per_token']:.3f}")
    print(f"  decode step (median):         engine {results['engine_decode_step_ms']:.1f} ms, "
          f"generate() {results['generate_decode_step_ms']:.1f} ms, ratio {results['ratio_decode_step']:.3f}")
    same, compared = results["picks_and_logits_equal_generate"]
    print(f"  lone steps: {results['lone_pass']}; every pick and its logit equal to generate()'s "
          f"(a chat reply, {compared} steps): {same}")
    for name, ms in results["resample_ms"].items():
        print(f"  re-sample ({name}): {ms:.2f} ms  vs step {step_ms:.1f} ms")
    if not args.skip_load:
        print(f"  load: cold {results['cold_load_s']:.1f} s, warm {results['warm_load_s']:.1f} s "
              f"(whole process: {results['cold_process_s']:.1f} s / {results['warm_process_s']:.1f} s)")
    print(f"  peak RSS {results['peak_rss_mb']:.0f} MB; KV cache after {args.tokens} tokens: "
          f"{results['kv_bytes_at_end'] / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
