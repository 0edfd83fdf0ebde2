"""catch_up: a replayed generation brought to a later version of its trace (another process's
room) steps only what is new and ends with the same steps as the original, or as a whole replay."""

from __future__ import annotations

import pytest

from engine import Generation, SamplerSettings, StopSettings, TraceError, catch_up, replay, to_trace


def recorded(trace: dict) -> list[dict]:
    """A trace's steps without their timings (which differ from run to run)."""
    return [{k: v for k, v in step.items() if k != "timing"} for step in trace["steps"]]


def presenter(tiny_lm) -> Generation:
    return Generation(tiny_lm, "hello there", seed=3, sampler=SamplerSettings(temperature=0.9),
                      stop=StopSettings(max_new_tokens=12, ignore_eos=True))


def test_a_follower_steps_only_the_new_steps_and_ends_as_the_original(tiny_lm, monkeypatch) -> None:
    original = presenter(tiny_lm)
    for _ in range(3):
        original.step()
    follower = replay(tiny_lm, to_trace(original)).generation
    for _ in range(4):
        original.step()
    taken = []
    step = Generation.step
    monkeypatch.setattr(Generation, "step", lambda self, *a, **k: taken.append(1) or step(self, *a, **k))
    assert catch_up(follower, to_trace(original))
    assert len(taken) == 4  # the three shared steps are kept, not taken again
    assert recorded(to_trace(follower)) == recorded(to_trace(original))


def test_back_and_a_changed_sampler_rewind_to_the_shared_steps(tiny_lm) -> None:
    original = presenter(tiny_lm)
    for _ in range(6):
        original.step()
    follower = replay(tiny_lm, to_trace(original)).generation
    original.rewind(4)
    original.sampler = SamplerSettings(temperature=0.3)
    original.step()
    assert catch_up(follower, to_trace(original))
    assert recorded(to_trace(follower)) == recorded(to_trace(original)) and len(follower.steps) == 5
    assert follower.sampler == original.sampler and follower.stop == original.stop


def test_another_prompt_or_seed_is_not_a_continuation_and_changes_nothing(tiny_lm) -> None:
    original = presenter(tiny_lm)
    original.step()
    follower = replay(tiny_lm, to_trace(original)).generation
    before = to_trace(follower)
    for other in (Generation(tiny_lm, "other words", seed=3), Generation(tiny_lm, "hello there", seed=4)):
        assert not catch_up(follower, to_trace(other))
    assert recorded(to_trace(follower)) == recorded(before)
    broken = to_trace(original) | {"steps": [{**to_trace(original)["steps"][0], "token_id": 10**9}]}
    with pytest.raises(TraceError, match="not a token of this model"):
        catch_up(follower, broken)
