"""The engine on a GPU: parity with transformers there, and what bounds a decode step.

    python -m bench.gpu_bench --device cuda --out DIR          # the whole check (bench/gpu_check.sh)
    python -m bench.gpu_bench --device cpu --tiny --out DIR    # its logic, on the tiny model, here

Each section runs on its own: one that fails is recorded with its error and the rest still run.
Results go to DIR/gpu_results.json (every figure) and DIR/gpu_summary.md (the table docs/gpu.md
quotes); the summary is printed last.

Parity (greedy tokens against `generate()`, the sampler against transformers' logits processors,
the stop conditions, the KV cache's bytes) is checked on the device itself, for the bundled model
and the tiny test architectures. The timings synchronise the device around every timed region;
what bounds a step sets its time against the bytes it must read at this device's own measured
copy speed, counts its kernel launches with torch.profiler, and replays the step as a CUDA graph
where one can be captured (compared token for token with the engine's greedy decoding).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
import traceback
from collections.abc import Callable
from copy import deepcopy
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
import transformers

from engine import Generation, LoadedModel, SamplerSettings, StopSettings, load_model
from engine.forward import crop_cache, forward, new_cache
from engine.sampling import run_chain
from engine.speed import (
    decode_flops,
    linear_weight_bytes,
    measure_batching,
    measure_decode_intensity,
    measure_decode_reads,
    measure_device,
    sample_context,
)

PROMPTS = (("Name three colours of the rainbow.", True), ("Once upon a time, the little robot", False))
SAMPLERS = (
    SamplerSettings(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05, repetition_penalty=1.3),
    SamplerSettings(temperature=1.3, top_k=0, top_p=0.8),
    SamplerSettings(temperature=0.5, min_p=0.2),
    SamplerSettings(temperature=1.0, top_k=7, repetition_penalty=0.8),
)
BATCHES = (1, 8, 32)


# ---- timing ---------------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_ms(run: Callable[[], object], device: torch.device) -> float:
    """Wall time of one call, the device synchronised on both sides."""
    sync(device)
    started = time.perf_counter()
    run()
    sync(device)
    return (time.perf_counter() - started) * 1e3


def median_ms(run: Callable[[], object], device: torch.device, repeats: int,
              reset: Callable[[], object] | None = None) -> float:
    """Median of `repeats` timed calls after two untimed ones; `reset` (untimed) after each."""
    times = []
    for attempt in range(repeats + 2):
        elapsed = timed_ms(run, device)
        if attempt >= 2:
            times.append(elapsed)
        if reset is not None:
            reset()
    return statistics.median(times)


# ---- the machine ----------------------------------------------------------------------------


def machine(device: torch.device) -> dict[str, Any]:
    """What ran the check: the accelerator, its driver, and the library versions."""
    facts: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                             "transformers": transformers.__version__, "device": str(device),
                             "cpu_threads": torch.get_num_threads()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts.update(gpu=props.name, capability=f"{props.major}.{props.minor}",
                     multiprocessors=props.multi_processor_count, memory_gib=round(props.total_memory / 2**30, 1),
                     cuda=torch.version.cuda)
        facts["nvidia_smi"] = _nvidia_smi()
    return facts


def _nvidia_smi() -> str:
    query = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu"
    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=20)
        return f"{query}: {done.stdout.strip()}"
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi failed: {exc}"


def device_speed(device: torch.device, small: bool) -> dict[str, Any]:
    """The device's own ceilings: a large device-to-device copy (bytes read + written) and a
    square float32 and bfloat16 matmul."""
    sizes = dict(matmul_size=256, copy_mib=16) if small else {}
    f32 = measure_device(device, torch.float32, repeats=5, **sizes)
    bf16 = measure_device(device, torch.bfloat16, repeats=5, **sizes)
    return {"copy_bytes": f32.copy_bytes, "copy_GB_s": f32.bytes_per_s / 1e9,
            "matmul_size": f32.matmul_size, "fp32_TFLOP_s": f32.flops_per_s / 1e12,
            "bf16_TFLOP_s": bf16.flops_per_s / 1e12}


# ---- parity ---------------------------------------------------------------------------------


def generate_tokens(lm: LoadedModel, prompt_ids: list[int], count: int) -> tuple[list[int], list[torch.Tensor]]:
    """transformers' own greedy generate() on the model's device: `count` tokens and their logits."""
    config = deepcopy(lm.model.generation_config)
    config.update(do_sample=False, max_new_tokens=count, min_new_tokens=count, output_logits=True,
                  return_dict_in_generate=True, temperature=None, top_p=None, top_k=None)
    ids = torch.tensor([prompt_ids], device=lm.device)
    with torch.inference_mode():
        out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return out.sequences[0, len(prompt_ids):].tolist(), [row[0].float().cpu() for row in out.logits]


def greedy_parity(lm: LoadedModel, count: int) -> dict[str, Any]:
    """The engine's greedy tokens against generate()'s, and the picks' logits to the last bit."""
    rows = []
    for prompt, chat in PROMPTS:
        gen = Generation(lm, prompt, chat=chat, sampler=SamplerSettings(temperature=0), seed=0,
                         stop=StopSettings(max_new_tokens=count, ignore_eos=True))
        records = [gen.step() for _ in range(count)]
        theirs, logits = generate_tokens(lm, list(gen.prompt_ids), count)
        ours = [r.token_id for r in records]
        same_logits = all(r.logit == float(row[r.token_id]) for r, row in zip(records, logits, strict=False))
        differences = [i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b]
        rows.append({"prompt": prompt, "chat": chat, "tokens_equal": ours == theirs, "pick_logits_equal": same_logits,
                     "first_difference": differences[0] if differences else None, "text": gen.text})
    return {"model": lm.name, "tokens": count, "passed": all(r["tokens_equal"] for r in rows), "prompts": rows}


def tiny_architectures(device: torch.device, count: int) -> dict[str, Any]:
    """The tiny test architectures (tests/engine/test_inside.py) on the device, greedy against generate()."""
    from tests.engine.test_inside import tiny_models

    rows = []
    for tiny in tiny_models():
        lm = replace(tiny, model=tiny.model.to(device), device=device)
        gen = Generation(lm, "abcabcab", sampler=SamplerSettings(temperature=0), seed=0,
                         stop=StopSettings(max_new_tokens=count, ignore_eos=True))
        ours = [gen.step().token_id for _ in range(count)]
        theirs, _ = generate_tokens(lm, list(gen.prompt_ids), count)
        rows.append({"model": lm.name, "tokens_equal": ours == theirs})
    return {"passed": all(r["tokens_equal"] for r in rows), "models": rows}


def transformers_chain(lm: LoadedModel, settings: SamplerSettings):
    """The processors generate() itself builds for these settings, in its own order."""
    config = transformers.GenerationConfig(do_sample=True, temperature=settings.temperature, top_k=settings.top_k,
                                           top_p=settings.top_p, min_p=settings.min_p or None,
                                           repetition_penalty=settings.repetition_penalty)
    return lm.model._get_logits_processor(generation_config=config, input_ids_seq_length=1, encoder_input_ids=None,
                                          prefix_allowed_tokens_fn=None,
                                          logits_processor=transformers.LogitsProcessorList(), device="cpu")


def sampler_parity(lm: LoadedModel) -> dict[str, Any]:
    """The engine's sampler chain against generate()'s processors, on logits the device computed:
    kept logits equal and final probabilities equal (torch.equal)."""
    gen = Generation(lm, "Once upon a time, the little robot", sampler=SamplerSettings(temperature=0))
    for _ in range(3):
        gen.step()
    logits = gen.raw_logits()
    context = torch.tensor(gen.prompt_ids + gen.generated_ids[:-1])
    rows = []
    for settings in SAMPLERS:
        ours = run_chain(logits, context, settings)
        theirs = transformers_chain(lm, settings)(context.unsqueeze(0), logits.unsqueeze(0).clone())[0]
        finite = torch.isfinite(theirs)
        same = (torch.equal(torch.isinf(ours.final_logits), torch.isinf(theirs))
                and torch.equal(ours.final_logits[finite], theirs[finite])
                and torch.equal(ours.final_probs, theirs.softmax(dim=-1)))
        rows.append({"settings": asdict(settings), "equal": same})
    return {"passed": all(r["equal"] for r in rows), "cases": rows}


def seeded_draws(lm: LoadedModel, cpu_lm: LoadedModel | None, steps: int) -> dict[str, Any]:
    """The same seed twice on the device gives the same tokens (the draw comes from the
    generation's own CPU generator); against the CPU's run of the same seed, how far apart the
    logits are and whether the picks still agree."""
    settings = SamplerSettings(temperature=0.9, top_p=0.95)

    def run(model: LoadedModel) -> Generation:
        gen = Generation(model, "Tell me a short story about a fox.", chat=True, sampler=settings, seed=1234,
                         stop=StopSettings(max_new_tokens=steps, ignore_eos=True))
        for _ in range(steps):
            gen.step()
        return gen

    first, second = run(lm), run(lm)
    result: dict[str, Any] = {"steps": steps, "same_on_device": first.generated_ids == second.generated_ids,
                              "generator_device": str(first._generator.device)}
    if cpu_lm is not None:
        on_cpu = run(cpu_lm)
        agree = [a == b for a, b in zip(first.generated_ids, on_cpu.generated_ids, strict=True)]
        result.update(same_as_cpu=all(agree), first_cpu_difference=agree.index(False) if False in agree else None,
                      max_logit_diff_first_step=float((first.raw_logits(1) - on_cpu.raw_logits(1)).abs().max()))
    result["passed"] = result["same_on_device"]
    return result


def stop_conditions(lm: LoadedModel) -> dict[str, Any]:
    """Each way a generation ends, on the device: max_tokens, a stop sequence split across
    tokens, and the model's own end token."""
    capped = Generation(lm, "Count from one to twenty:", sampler=SamplerSettings(temperature=0),
                        stop=StopSettings(max_new_tokens=5))
    while not capped.finished:
        capped.step()
    plain = Generation(lm, "Count from one to twenty:", sampler=SamplerSettings(temperature=0),
                       stop=StopSettings(max_new_tokens=16, ignore_eos=True))
    for _ in range(16):
        plain.step()
    text = plain.text
    stop = text[len(text) // 2: len(text) // 2 + 4] or text
    stopped = Generation(lm, "Count from one to twenty:", sampler=SamplerSettings(temperature=0),
                         stop=StopSettings(max_new_tokens=16, stop_sequences=(stop,), ignore_eos=True))
    while not stopped.finished:
        stopped.step()
    ended = Generation(lm, "Say only the word: hello", chat=True, sampler=SamplerSettings(temperature=0),
                       stop=StopSettings(max_new_tokens=48))
    while not ended.finished:
        ended.step()
    result = {"max_tokens": capped.finish_reason, "max_tokens_steps": len(capped.steps),
              "stop_sequence": repr(stop), "stop": stopped.finish_reason, "text_before_stop": stopped.text,
              "eos": ended.finish_reason, "eos_steps": len(ended.steps)}
    result["passed"] = (capped.finish_reason != stopped.finish_reason and len(capped.steps) == 5
                        and stop not in stopped.text and text.startswith(stopped.text))
    return result


def kv_bytes(lm: LoadedModel) -> dict[str, Any]:
    """The KV cache as read from its tensors on the device against the formula, step by step."""
    gen = Generation(lm, "The capital of France is", sampler=SamplerSettings(temperature=0),
                     stop=StopSettings(max_new_tokens=8, ignore_eos=True))
    rows = [(r.kv.positions, r.kv.bytes, r.kv.formula_bytes) for r in (gen.step() for _ in range(8))]
    devices = sorted({str(layer.keys.device) for layer in gen._cache.layers})
    return {"steps": rows, "cache_devices": devices, "passed": all(b == f for _, b, f in rows)}


def packed_parity(lm: LoadedModel, batches: tuple[int, ...], repeats: int) -> dict[str, Any]:
    """The server's packed decode pass (engine/serving/packed.py) at each batch size: its rows
    against each sequence's lone decode step, and its time per pass and per token."""
    from engine.serving import ForwardScheduler
    from engine.serving.packed import packed_pass_path

    rows = [_packed_batch(lm, batch, repeats) for batch in batches]
    modes = {}
    for asked in ("exact", "fast"):
        scheduler = ForwardScheduler(lm, batching=asked)
        modes[asked] = scheduler.stats().batching
        scheduler.close()
    # exact batching must either keep every row's lone digits or not pack at all
    kept = all(r["exact"]["rows_equal_lone"] for r in rows)
    return {"path": packed_pass_path(lm), "fast_path": packed_pass_path(lm, exact=False), "scheduler_modes": modes,
            "batches": rows, "passed": kept or modes["exact"] == "off"}


def _packed_batch(lm: LoadedModel, batch: int, repeats: int) -> dict[str, Any]:
    from engine.serving.packed import forward_packed

    contexts = [sample_context(lm, 24 + 3 * row, offset=5 * row) for row in range(batch)]  # caches of many lengths
    caches, lone = [], []
    for context in contexts:
        cache = new_cache(lm)
        forward(lm, torch.tensor([context[:-1]]), cache)
        lone.append(forward(lm, torch.tensor([context[-1:]]), cache)[0])
        crop_cache(cache, len(context) - 1)
        caches.append(cache)
    last = [c[-1] for c in contexts]

    def reset() -> None:
        for cache, context in zip(caches, contexts, strict=True):
            crop_cache(cache, len(context) - 1)

    entry: dict[str, Any] = {"batch": batch}
    for kind, exact in (("exact", True), ("fast", False)):
        logits = forward_packed(lm, last, caches, exact=exact)
        reset()
        ms = median_ms(lambda exact=exact: forward_packed(lm, last, caches, exact=exact), lm.device, repeats, reset)
        entry[kind] = {"rows_equal_lone": all(torch.equal(a, b) for a, b in zip(logits, lone, strict=True)),
                       "max_logit_diff": max(float((a - b).abs().max()) for a, b in zip(logits, lone, strict=True)),
                       "pass_ms": ms, "per_token_ms": ms / batch}
    return entry


# ---- speed ----------------------------------------------------------------------------------


def decode_vs_generate(lm: LoadedModel, tokens: int) -> dict[str, Any]:
    """A greedy generation of `tokens` tokens through the engine (every step: pass, sampler,
    append, check, record) against generate() making the same tokens, both timed whole."""
    prompt = "Once upon a time, the little robot"

    def engine_run() -> None:
        gen = Generation(lm, prompt, sampler=SamplerSettings(temperature=0),
                         stop=StopSettings(max_new_tokens=tokens, ignore_eos=True))
        for _ in range(tokens):
            gen.step()
        engine_run.steps = [s.timing for s in gen.steps]

    ids = Generation(lm, prompt).prompt_ids
    engine_ms = median_ms(engine_run, lm.device, 3)
    steps = engine_run.steps[1:]  # the first step reads the prompt
    generate_ms = median_ms(lambda: generate_tokens(lm, list(ids), tokens), lm.device, 3)
    return {"tokens": tokens, "engine_ms": engine_ms, "generate_ms": generate_ms,
            "engine_per_token_ms": engine_ms / tokens, "generate_per_token_ms": generate_ms / tokens,
            "ratio": engine_ms / generate_ms,
            "engine_decode_step_median_ms": statistics.median(t.step_ms for t in steps),
            "engine_forward_median_ms": statistics.median(t.forward_ms for t in steps),
            "engine_sampling_median_ms": statistics.median(t.sampling_ms for t in steps)}


def batching(lm: LoadedModel, batches: tuple[int, ...], context: int, repeats: int) -> dict[str, Any]:
    """Equal-length sequences decoded together in one plain pass (engine/speed.py)."""
    points = measure_batching(lm, batches, context, repeats)
    return {"context_tokens": context, "points": [{"batch": p.batch, "step_ms": p.step_ms,
                                                   "per_token_ms": p.per_token_ms, "tokens_per_s": p.tokens_per_s}
                                                  for p in points]}


def decode_bound(lm: LoadedModel, copy_bytes_per_s: float, context: int, repeats: int) -> dict[str, Any]:
    """One decode step against the bytes it must read at the device's own copy speed, where its
    time goes (products alone, attention alone), and its kernel launches."""
    step = measure_decode_intensity(lm, context, repeats)
    reads = measure_decode_reads(lm, step, repeats)
    floor_ms = step.bytes / copy_bytes_per_s * 1e3
    result = {"context_tokens": context, "step_ms": step.step_ms, "weight_bytes": step.weight_bytes,
              "linear_weight_bytes": linear_weight_bytes(lm), "kv_bytes": step.kv_bytes,
              "flops": decode_flops(lm, context), "flops_per_byte": step.flops_per_byte,
              "floor_ms_at_copy_speed": floor_ms, "step_over_floor": step.step_ms / floor_ms,
              "achieved_GB_s": step.achieved_bytes_per_s / 1e9, "plain_read_GB_s": reads.read_bytes_per_s / 1e9,
              "products_ms": reads.products_ms, "product_calls": reads.product_calls,
              "attention_ms": reads.attention_ms, "other_ms": reads.other_ms, "lone_path": reads.path,
              "lone_reason": reads.reason}
    result.update(kernel_launches(lm, context))
    return result


def kernel_launches(lm: LoadedModel, context: int, steps: int = 5) -> dict[str, Any]:
    """torch.profiler over `steps` decode steps: kernels per step, and the GPU's busy time per
    step (the kernels' own durations summed) against the step's wall time."""
    if lm.device.type != "cuda":
        return {"kernels_per_step": None}
    from torch.profiler import ProfilerActivity, profile

    ids = sample_context(lm, context)
    cache = new_cache(lm)
    forward(lm, torch.tensor([ids[:-1]]), cache)
    forward(lm, torch.tensor([ids[-1:]]), cache)  # warm
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            crop_cache(cache, context - 1)
            forward(lm, torch.tensor([ids[-1:]]), cache)
        sync(lm.device)
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels = [e for e in events if "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    busy_us = sum(e.time_range.elapsed_us() for e in kernels)  # one stream: the kernels never overlap
    launches = sum(1 for e in prof.events() if e.name in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC",
                                                          "cuLaunchKernelEx"))
    top: dict[str, int] = {}
    for e in kernels:
        top[e.name[:60]] = top.get(e.name[:60], 0) + 1
    return {"kernels_per_step": len(kernels) / steps, "launch_calls_per_step": launches / steps,
            "copies_per_step": (len(events) - len(kernels)) / steps, "gpu_busy_ms_per_step": busy_us / steps / 1e3,
            "kernel_kinds": sorted(top.items(), key=lambda kv: -kv[1])[:12]}


def cuda_graph(lm: LoadedModel, tokens: int) -> dict[str, Any]:
    """The decode step on a static KV cache, captured once as a CUDA graph and replayed for every
    token: its greedy tokens against the engine's, its logits against the same static-cache steps
    run eagerly (torch.equal) and against the engine's own, and its time per step against the
    eager static step's. Without CUDA, the eager static-cache steps alone (no graph)."""
    prompt = "Once upon a time, the little robot"
    reference = Generation(lm, prompt, sampler=SamplerSettings(temperature=0),
                           stop=StopSettings(max_new_tokens=tokens, ignore_eos=True))
    for _ in range(tokens):
        reference.step()
    ids = list(reference.prompt_ids)
    with torch.inference_mode():
        eager = _StaticSteps(lm, len(ids) + tokens + 8)
        eager_picks, eager_logits, eager_ms = eager.greedy(ids, tokens, eager.step)
        result: dict[str, Any] = {"tokens": tokens, "eager_static_step_ms": statistics.median(eager_ms),
                                  "eager_tokens_equal_engine_greedy": eager_picks == reference.generated_ids}
        if lm.device.type == "cuda":
            graphed = _StaticSteps(lm, len(ids) + tokens + 8)
            replay = graphed.captured(ids)
            picks, logits, replay_ms = graphed.greedy(ids, tokens, replay)
            result.update(captured=True, graph_replay_ms=statistics.median(replay_ms),
                          tokens_equal_engine_greedy=picks == reference.generated_ids,
                          logits_equal_eager_static=all(torch.equal(a, b)
                                                        for a, b in zip(logits, eager_logits, strict=True)))
            result["speedup"] = result["eager_static_step_ms"] / result["graph_replay_ms"]
    engine_logits = [reference.raw_logits(index) for index in range(2, tokens + 1)]
    result["max_logit_diff_vs_engine"] = max(float((a.cpu() - b).abs().max())
                                             for a, b in zip(eager_logits, engine_logits, strict=True))
    result["passed"] = (result["eager_tokens_equal_engine_greedy"] and result.get("tokens_equal_engine_greedy", True)
                        and result.get("logits_equal_eager_static", True))
    return result


class _StaticSteps:
    """One sequence on transformers' StaticCache: a decode step reads `token` at `position`, both
    fixed tensors, so the same call can be captured once and replayed (the cache advances its own
    write index on the device)."""

    def __init__(self, lm: LoadedModel, length: int) -> None:
        self.lm = lm
        self.cache = transformers.StaticCache(config=lm.model.config, max_cache_len=length)
        self.token = torch.zeros((1, 1), dtype=torch.long, device=lm.device)
        self.position = torch.zeros((1,), dtype=torch.long, device=lm.device)

    def step(self) -> torch.Tensor:
        return self.lm.model(input_ids=self.token, past_key_values=self.cache, cache_position=self.position,
                             use_cache=True).logits[0, -1]

    def prefill(self, ids: list[int]) -> int:
        """Read the prompt into the (reset) cache; the first greedy pick."""
        self.cache.reset()
        device = self.lm.device
        logits = self.lm.model(input_ids=torch.tensor([ids], device=device), past_key_values=self.cache,
                               cache_position=torch.arange(len(ids), device=device), use_cache=True).logits[0, -1]
        return int(logits.argmax())

    def captured(self, ids: list[int]) -> Callable[[], torch.Tensor]:
        """The step captured as a CUDA graph, after eager warm-up steps on a side stream (as
        PyTorch's docs ask); the cache is reset afterwards, since the warm-up steps wrote to it."""
        device = self.lm.device
        self.token.fill_(self.prefill(ids))
        self.position.fill_(len(ids))
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(3):
                self.step()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.step()

        def replay() -> torch.Tensor:
            graph.replay()
            return out

        return replay

    def greedy(self, ids: list[int], tokens: int, run: Callable[[], torch.Tensor]
               ) -> tuple[list[int], list[torch.Tensor], list[float]]:
        """`tokens` greedy picks after the prompt, each step by `run`: the picks, each step's
        logits, and each step's time (the device synchronised)."""
        picks, logits, times = [self.prefill(ids)], [], []
        for index in range(tokens - 1):
            self.token.fill_(picks[-1])
            self.position.fill_(len(ids) + index)
            sync(self.lm.device)
            started = time.perf_counter()
            logits.append(run().clone())
            sync(self.lm.device)
            times.append((time.perf_counter() - started) * 1e3)
            picks.append(int(logits[-1].argmax()))
        return picks, logits, times


def step_page(lm: LoadedModel) -> dict[str, Any]:
    """The Step page's controller (ui/controllers/step_through.py, no Streamlit) on a plain dict state,
    with the model on the device: steps, Back, the share link, and the inside view."""
    from ui.controllers import step_through as control
    from ui.session.keys import STEP
    from ui.session.settings import init_defaults, step_generation

    state: dict[str, Any] = {}
    init_defaults(state)
    state[STEP.prompt] = "The capital of France is"
    control.sync_generation(state, lm)
    for _ in range(5):
        control.step(state)
    control.back(state)
    control.step(state)
    gen = step_generation(state)
    view = control.look_inside(state, gen, True)
    layers = getattr(view, "layers", None)
    params = control.share_params(gen, "bundled")
    return {"steps": len(gen.steps), "text": gen.text, "share_params": params,
            "inside_layers": len(layers) if layers else str(view),
            "inside_layer_ms": [round(layer.ms, 4) for layer in layers] if layers else None,
            "inside_forward_ms": getattr(view, "forward_ms", None), "passed": len(gen.steps) == 5}


# ---- the run --------------------------------------------------------------------------------


def run_section(results: dict[str, Any], name: str, work: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    """Run one section, keep its result (or its error) under `name`, and say how it went."""
    started = time.perf_counter()
    try:
        results[name] = work()
    except Exception as exc:  # a section's failure is a result: the others still run
        results[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
    results[name]["seconds"] = round(time.perf_counter() - started, 2)
    verdict = "ERROR " + results[name]["error"] if "error" in results[name] else "ok"
    print(f"[{name}] {results[name]['seconds']} s {verdict}", flush=True)
    return results[name] if "error" not in results[name] else None


def summary(results: dict[str, Any]) -> str:
    """The figures docs/gpu.md quotes, as Markdown."""
    lines = ["| check | result |", "| --- | --- |"]
    for name in ("greedy_parity", "tiny_architectures", "sampler_parity", "seeded_draws", "stop_conditions",
                 "kv_bytes", "packed_parity", "cuda_graph", "step_page"):
        if name not in results:
            continue
        entry = results[name]
        verdict = "error: " + entry["error"] if "error" in entry else ("passed" if entry.get("passed") else "FAILED")
        lines.append(f"| {name} | {verdict} |")
    figures = ["", "| figure | value |", "| --- | --- |"]

    def add(label: str, section: str, key: str, fmt: str = "{:.3f}") -> None:
        value = results.get(section, {}).get(key)
        if value is not None:
            figures.append(f"| {label} | {fmt.format(value) if isinstance(value, float) else value} |")

    add("copy bandwidth (GB/s, read + written)", "device_speed", "copy_GB_s", "{:.0f}")
    add("fp32 matmul (TFLOP/s)", "device_speed", "fp32_TFLOP_s", "{:.1f}")
    add("engine, ms per token (greedy, whole step)", "decode_vs_generate", "engine_per_token_ms")
    add("generate(), ms per token", "decode_vs_generate", "generate_per_token_ms")
    add("engine / generate()", "decode_vs_generate", "ratio")
    add("engine forward pass, median ms", "decode_vs_generate", "engine_forward_median_ms")
    add("engine sampler, median ms", "decode_vs_generate", "engine_sampling_median_ms")
    add("decode step (ms)", "decode_bound", "step_ms")
    add("floor at copy speed (ms)", "decode_bound", "floor_ms_at_copy_speed", "{:.4f}")
    add("step / floor", "decode_bound", "step_over_floor", "{:.0f}")
    add("kernels per step", "decode_bound", "kernels_per_step", "{:.0f}")
    add("GPU busy per step (ms)", "decode_bound", "gpu_busy_ms_per_step")
    add("CUDA graph replay (ms)", "cuda_graph", "graph_replay_ms", "{:.4f}")
    add("eager static step (ms)", "cuda_graph", "eager_static_step_ms")
    add("graph tokens = engine greedy", "cuda_graph", "tokens_equal_engine_greedy")
    add("graph logits = eager static step", "cuda_graph", "logits_equal_eager_static")
    for point in results.get("batching", {}).get("points", []):
        figures.append(f"| plain batch {point['batch']}: ms per step / per token | "
                       f"{point['step_ms']:.3f} / {point['per_token_ms']:.4f} |")
    for entry in results.get("packed_parity", {}).get("batches", []):
        figures.append(f"| packed batch {entry['batch']} exact / fast: ms per token | "
                       f"{entry['exact']['per_token_ms']:.4f} / {entry['fast']['per_token_ms']:.4f} |")
    return "\n".join(lines + figures) + "\n"


def save(out: Path, results: dict[str, Any]) -> None:
    (out / "gpu_results.json").write_text(json.dumps(results, indent=1, default=str))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_results.json and gpu_summary.md")
    parser.add_argument("--tiny", action="store_true", help="the tiny random Llama instead of the bundled model")
    parser.add_argument("--tokens", type=int, default=24, help="greedy tokens compared with generate()")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--no-cpu-copy", action="store_true", help="skip the CPU run the seeded draws compare with")
    parser.add_argument("--sections", default="", help="comma-separated sections to run (all when empty)")
    args = parser.parse_args(argv)
    wanted = set(filter(None, args.sections.split(",")))
    device = torch.device(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    sections: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("machine", lambda: machine(device)), ("device_speed", lambda: device_speed(device, args.tiny))]
    for name, work in sections:
        if not wanted or name in wanted:
            run_section(results, name, work)
            save(args.out, results)
    if args.tiny:
        from tests.tiny import tiny_lm

        base = tiny_lm()
        lm = replace(base, model=base.model.to(device), device=device)
        cpu_lm = None if args.no_cpu_copy else tiny_lm()
    else:
        lm = load_model(device=device)
        cpu_lm = None if args.no_cpu_copy or device.type == "cpu" else load_model(device="cpu")
    results["model"] = {"name": lm.name, "dtype": str(lm.dtype), "parameters": lm.parameters}
    copy_speed = results.get("device_speed", {}).get("copy_GB_s", 1.0) * 1e9
    later: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("greedy_parity", lambda: greedy_parity(lm, args.tokens)),
        ("tiny_architectures", lambda: tiny_architectures(device, min(args.tokens, 12))),
        ("sampler_parity", lambda: sampler_parity(lm)),
        ("seeded_draws", lambda: seeded_draws(lm, cpu_lm, 16)),
        ("stop_conditions", lambda: stop_conditions(lm)),
        ("kv_bytes", lambda: kv_bytes(lm)),
        ("decode_vs_generate", lambda: decode_vs_generate(lm, 64)),
        ("decode_bound", lambda: decode_bound(lm, copy_speed, 64, args.repeats)),
        ("batching", lambda: batching(lm, BATCHES, 64, max(3, args.repeats // 4))),
        ("packed_parity", lambda: packed_parity(lm, BATCHES, max(3, args.repeats // 4))),
        ("step_page", lambda: step_page(lm)),
        ("cuda_graph", lambda: cuda_graph(lm, 32)),  # last: a device-side assert would end the CUDA context
    ]
    for name, work in later:
        if not wanted or name in wanted:
            run_section(results, name, work)
            save(args.out, results)  # after every section: a run cut short keeps what it measured
    text = summary(results)
    (args.out / "gpu_summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
