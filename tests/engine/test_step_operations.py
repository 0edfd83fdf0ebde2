"""Branch, re-pick and the atomic step, on the real bundled model: operations the pages call
on a Generation, each checked against the plain loop it stands for."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import engine.generation as generation_module
import engine.shell as shell_module
from engine import Generation, GenerationFinished, SamplerSettings, SettingsError, StopSettings
from tests.passes import counted_passes

SAMPLED = SamplerSettings(temperature=0.9, top_k=40, top_p=0.95)


def sampled(lm, max_new_tokens: int = 8) -> Generation:
    return Generation(lm, "The old lighthouse keeper", sampler=SAMPLED, seed=5,
                      stop=StopSettings(max_new_tokens=max_new_tokens, ignore_eos=True))


@dataclass(frozen=True)
class Undisturbed:
    """What an undisturbed `sampled` run to its end gives: its tokens and each step's probability."""

    generated_ids: list[int]
    probs: list[float]


@pytest.fixture(scope="module")
def undisturbed(lm) -> Undisturbed:
    """The undisturbed run, once for the module: every test that disturbs a generation compares
    its end with this."""
    reference = sampled(lm)
    list(reference.run())
    return Undisturbed(list(reference.generated_ids), [s.prob for s in reference.steps])


def state_of(generation: Generation) -> tuple:
    """Everything a step may change: records, context, the cache's length and contents' size,
    the generator's state."""
    return (generation.steps, generation.context_ids, generation.kv.positions, generation.kv.bytes,
            generation._generator.get_state().tolist())


def test_branch_forces_the_token_and_keeps_the_samplers_own_choice(lm) -> None:
    generation = sampled(lm)
    list(generation.run(max_steps=3))
    before = generation.steps[-1]
    other = generation.steps[-1].distribution.top[3].token_id
    record = generation.branch(other)
    assert record.index == 3 and record.token_id == other and record.decision.forced
    assert record.decision.sampler_token_id == before.token_id  # same logits, same draw
    assert record.logit == before.distribution.top[3].logit
    assert generation.context_ids[-1] == other and len(generation.steps) == 3


def test_branch_equals_rewinding_and_stepping_with_the_token_forced(lm) -> None:
    branched, stepped = sampled(lm), sampled(lm)
    for generation in (branched, stepped):
        list(generation.run(max_steps=4))
    token = branched.steps[-1].distribution.top[1].token_id
    branched.branch(token)
    stepped.rewind(3)
    stepped.step(force_token_id=token)
    list(branched.run())
    list(stepped.run())
    assert branched.generated_ids == stepped.generated_ids
    assert [s.prob for s in branched.steps] == [s.prob for s in stepped.steps]


def test_repick_takes_the_latest_step_again_under_the_current_sampler(lm) -> None:
    generation = sampled(lm)
    list(generation.run(max_steps=2))
    hot = SamplerSettings(temperature=1.8, top_k=200)
    preview = generation.resample(hot)
    generation.sampler = hot
    with counted_passes(lm) as calls:
        record = generation.repick()
    assert calls == []  # the latest step's kept logits are used again: no forward pass
    assert record.decision == preview.decision and record.index == 2
    assert record.forward_tokens == 1  # reported as the pass that made those logits


def test_repick_of_the_first_step_reports_the_prefill_it_reuses(lm) -> None:
    generation = sampled(lm)
    first = generation.step()
    again = generation.repick()
    assert again.forward_tokens == first.forward_tokens == len(generation.prompt_ids)
    assert again.token_id == first.token_id and again.decision == first.decision


@pytest.mark.parametrize("bad", [1.5, -1, 10**9, "3", True, None])
def test_branch_to_a_token_that_is_no_token_id_is_refused_and_changes_nothing(lm, bad) -> None:
    generation = sampled(lm)
    list(generation.run(max_steps=2))
    before = state_of(generation)
    with pytest.raises(SettingsError, match="token_id"):
        generation.branch(bad)
    assert state_of(generation) == before


def test_branch_and_repick_need_a_step_to_take_again(lm) -> None:
    generation = sampled(lm)
    for operation in (generation.repick, lambda: generation.branch(5)):
        with pytest.raises(SettingsError, match="take a step first"):
            operation()


def test_a_refused_repick_keeps_the_latest_step(lm, undisturbed) -> None:
    """Lowering max new tokens below the steps taken: taking the last one again is refused,
    and the generation is as it was."""
    generation = sampled(lm)
    list(generation.run(max_steps=3))
    generation.stop = StopSettings(max_new_tokens=2, ignore_eos=True)
    before = state_of(generation)
    with pytest.raises(GenerationFinished):
        generation.repick()
    assert state_of(generation) == before
    generation.stop = StopSettings(max_new_tokens=8, ignore_eos=True)
    list(generation.run())
    assert generation.generated_ids == undisturbed.generated_ids


class Injected(RuntimeError):
    pass


def _fail(*args, **kwargs):
    raise Injected("injected")


def _failing_check(original):
    """The check stage fails for the new token only (`finished` also checks the latest step)."""
    def check(self, generated, text, eos_prob):
        if len(generated) > len(self.steps):
            raise Injected("injected")
        return original(self, generated, text, eos_prob)
    return check


# each stage of the loop, and the record, made to fail (patched where the loop looks it up)
STAGES_TO_BREAK = {
    "forward pass": (generation_module, "forward_one", _fail),
    "sample": (generation_module, "decide", _fail),
    "distribution summary": (generation_module, "describe_distribution", _fail),
    "append": (Generation, "_appended", _fail),
    "check": (Generation, "_termination", _failing_check(Generation._termination)),
    "record": (shell_module, "read_kv", _fail),  # the record reads the cache (GenerationShell.kv)
}


@pytest.mark.parametrize("stage", list(STAGES_TO_BREAK))
@pytest.mark.parametrize("steps_before", [0, 2])
def test_a_step_that_fails_at_any_stage_leaves_the_generation_as_it_was(lm, undisturbed, monkeypatch, stage,
                                                                       steps_before) -> None:
    generation = sampled(lm)
    list(generation.run(max_steps=steps_before))
    before = state_of(generation)
    owner, name, replacement = STAGES_TO_BREAK[stage]
    with monkeypatch.context() as patch:
        patch.setattr(owner, name, replacement)
        with pytest.raises(Injected):
            generation.step()
    assert state_of(generation) == before
    list(generation.run())  # and it goes on exactly as an undisturbed run
    assert generation.generated_ids == undisturbed.generated_ids
    assert [s.prob for s in generation.steps] == undisturbed.probs


def test_a_failure_after_the_forward_pass_crops_what_it_wrote_into_the_cache(lm, monkeypatch) -> None:
    generation = sampled(lm)
    generation.step()
    positions = generation.kv.positions
    monkeypatch.setattr(generation_module, "decide", _fail)
    with pytest.raises(Injected):
        generation.step()  # its forward pass wrote one position before the sampler failed
    assert generation.kv.positions == positions
    assert all(layer.keys.shape[-2] == positions for layer in generation._cache.layers)
