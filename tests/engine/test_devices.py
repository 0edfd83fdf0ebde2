"""What differs on a GPU, tested where it can be on the CPU (a model marked as on CUDA runs no
pass here), and on CUDA itself where the machine has it (the device check, bench/gpu_check.sh,
runs the rest there)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engine import Generation, SamplerSettings, StopSettings, other_device_note
from engine import inside as inside_module
from engine.inside import Capture
from engine.serving import ForwardScheduler, packed_pass_path
from engine.serving.packed import scripted_plan, scripted_prefill
from tests.tiny import tiny_lm

CUDA = torch.device("cuda")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_inside_marks_wait_for_a_cuda_device_and_never_for_the_cpu(monkeypatch) -> None:
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    capture = Capture(device=CUDA)
    monkeypatch.setattr(inside_module._capturing, "capture", capture, raising=False)
    inside_module._mark("attention_start", 1)(None, ())
    assert synced == [CUDA] and capture.marks[0][:2] == ("attention_start", 1)
    capture.device = torch.device("cpu")
    inside_module._mark("attention_end", 1)(None, (), None)
    assert synced == [CUDA] and len(capture.marks) == 2


def test_on_a_gpu_exact_batching_runs_every_pass_alone_and_fast_packs_on_the_eager_twin() -> None:
    gpu = replace(tiny_lm(seed=3), device=CUDA)  # a model of its own: the probes' verdicts are kept per model
    assert scripted_plan(gpu) is None and scripted_plan(gpu, exact=False) is None and scripted_prefill(gpu) is None
    assert packed_pass_path(gpu).startswith("no packed pass: on cuda")
    assert packed_pass_path(gpu, exact=False).startswith("the eager twin: the model runs on cuda")
    modes = {}
    for asked in ("exact", "fast"):
        scheduler = ForwardScheduler(gpu, batching=asked)
        modes[asked] = scheduler.stats().batching
        scheduler.close()
    assert modes == {"exact": "off", "fast": "fast"}


def test_a_trace_made_on_another_kind_of_device_is_explained_and_the_same_kind_is_not() -> None:
    cpu = tiny_lm()
    note = other_device_note("cuda:0", cpu)
    assert note is not None and "made on cuda and is replayed here on cpu" in note and "same" in note
    assert other_device_note("cpu", cpu) is None
    assert other_device_note(None, cpu) is None and other_device_note(7, cpu) is None


@needs_cuda
def test_a_seed_draws_the_same_numbers_on_cuda_as_on_the_cpu() -> None:
    settings, stop = SamplerSettings(temperature=1.0), StopSettings(max_new_tokens=8, ignore_eos=True)
    base = tiny_lm()
    on_gpu = replace(base, model=tiny_lm().model.to(CUDA), device=CUDA)
    runs = [Generation(lm, "abcabc", sampler=settings, stop=stop, seed=11) for lm in (base, on_gpu)]
    for gen in runs:
        for _ in range(8):
            gen.step()
    cpu_draws, gpu_draws = ([step.decision.draw.u for step in gen.steps] for gen in runs)
    assert cpu_draws == gpu_draws  # the generator is the generation's own, on the CPU, either way


@needs_cuda
def test_inside_layer_times_on_cuda_fall_within_the_pass() -> None:
    base = tiny_lm()
    lm = replace(base, model=base.model.to(CUDA), device=CUDA)
    gen = Generation(lm, "abcabc", sampler=SamplerSettings(temperature=0))
    gen.inside = True
    for _ in range(3):
        gen.step()
    view = gen.inside_view()
    assert all(layer.ms >= 0 for layer in view.layers)
    assert sum(layer.ms for layer in view.layers) <= view.forward_ms
