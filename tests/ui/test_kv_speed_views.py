"""The KV cache & speed page's words about what bounds a decode step follow what was measured on
the device: a CPU's step that reads at most of its memory speed is memory-bound; a GPU's small
step that reaches a few per cent of its bandwidth is not, and the page must not say it is.
The figures are the shapes measured on the project's CPUs and on an H200 (docs/gpu.md)."""

from __future__ import annotations

from engine.speed import DecodeIntensity, DecodeReads, DeviceSpeed
from ui.views.kv_speed import batch_one_text, bound_text, memory_bound, reads_text

WEIGHTS, CACHE = 538_000_000, 2_900_000
CPU = DeviceSpeed("cpu", "float32", 1024, 150e9, 2 * 256 * 2**20, 20e9)
GPU = DeviceSpeed("cuda", "float32", 4096, 50e12, 2 * 1024 * 2**20, 4.2e12)


def step(ms: float) -> DecodeIntensity:
    return DecodeIntensity(64, 2 * WEIGHTS / 4, WEIGHTS, CACHE, ms)


def reads(device_step: DecodeIntensity) -> DecodeReads:
    return DecodeReads("the fast lone pass", "proven", 2**30, 60.0, WEIGHTS, 211, 30.0, 3.0, device_step)


def test_a_cpu_step_reading_near_its_memory_speed_is_called_memory_bound() -> None:
    cpu_step = step(40.0)  # 13.5 GB/s of the device's 20
    assert memory_bound(CPU, cpu_step)
    text = bound_text(CPU, cpu_step)
    assert "bound by **memory bandwidth**" in text and "does not, here" not in text
    assert "shared out among the CPU's threads" in reads_text(reads(cpu_step), "cpu")
    assert "mostly **reading the weights**" in batch_one_text(memory_bound(CPU, cpu_step))


def test_a_gpu_step_far_slower_than_its_bytes_is_not_called_memory_bound_and_says_where_its_time_goes() -> None:
    gpu_step = step(19.4)  # the H200's eager step: 140 times its memory floor
    assert not memory_bound(GPU, gpu_step)
    text = bound_text(GPU, gpu_step)
    assert "bound by **memory bandwidth**" not in text and "**It does not, here**" in text
    assert "would take 0.13 ms, and the step takes **19.4 ms**, 1% of that speed" in text
    assert "launched as a kernel of its own on the GPU" in reads_text(reads(gpu_step), "cuda")
    words = batch_one_text(memory_bound(GPU, gpu_step))
    assert "**the work around the reads**" in words and "bound by memory bandwidth" not in words


def test_a_step_above_the_devices_balance_point_is_compute_bound() -> None:
    heavy = DecodeIntensity(64, 4000 * (WEIGHTS + CACHE), WEIGHTS, CACHE, 40.0)
    assert bound_text(CPU, heavy).endswith("That is above the device's 7.5, so the step is bound by **compute**.")


def test_parts_timed_apart_that_outrun_the_whole_step_are_not_shown_as_a_split() -> None:
    whole = step(40.0)
    assert "**7.0 ms** of everything else" in reads_text(reads(whole), "cpu")
    busy = step(31.0)  # the products' 30 ms and attention's 3 ms are more than the step's best run
    text = reads_text(reads(busy), "cpu")
    assert "of everything else" not in text and "the machine may be busy, press Measure again" in text
