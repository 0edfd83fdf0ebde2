"""The sampler's single-thread window: one thread inside, the caller's count back after,
also when two visitors' windows overlap."""

from __future__ import annotations

import threading

import torch

from engine import Generation, LoadedModel, SamplerSettings
from engine.cpu_threads import one_cpu_thread
from engine.sampling import decide


def test_one_cpu_thread_inside_and_the_previous_count_after() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with one_cpu_thread():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_overlapping_windows_on_two_threads_restore_the_count_once_both_have_left() -> None:
    """Thread A enters, B enters, A leaves (B still inside: still one thread), B leaves."""
    seen: dict[str, int] = {}
    a_inside, b_inside, a_left = threading.Event(), threading.Event(), threading.Event()

    def visitor_a() -> None:
        with one_cpu_thread():
            a_inside.set()
            b_inside.wait(5)
        a_left.set()

    def visitor_b() -> None:
        a_inside.wait(5)
        with one_cpu_thread():
            b_inside.set()
            a_left.wait(5)
            seen["b after a left"] = torch.get_num_threads()
        seen["b after both left"] = torch.get_num_threads()

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        threads = [threading.Thread(target=visitor_a), threading.Thread(target=visitor_b)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert seen == {"b after a left": 1, "b after both left": 2}
    finally:
        torch.set_num_threads(before)


def test_a_step_and_a_resample_leave_the_thread_count_as_they_found_it(lm: LoadedModel) -> None:
    before = torch.get_num_threads()
    gen = Generation(lm, "The capital of France is", sampler=SamplerSettings(temperature=0.8, top_p=0.9), seed=3)
    gen.step()
    gen.resample(SamplerSettings(temperature=1.3, top_k=20))
    assert torch.get_num_threads() == before


def test_a_decision_has_the_same_last_digits_whatever_the_callers_thread_count(lm: LoadedModel) -> None:
    """A sum over the vocabulary splits by thread count; on two threads the draw's CDF band
    here came out one bit off the one-thread value the step itself records."""
    gen = Generation(lm, "Once upon a time", seed=11)
    gen.step()
    gen.step()
    logits, context = gen.raw_logits(), torch.tensor(gen.context_ids[:-1])
    before = torch.get_num_threads()
    try:
        decisions = []
        for threads in (2, 1):
            torch.set_num_threads(threads)
            decisions.append(decide(logits, context, SamplerSettings(temperature=1.0), 0.3)[0])
    finally:
        torch.set_num_threads(before)
    assert decisions[0] == decisions[1]
