"""Same prompt, different answers (engine/serving/determinism.py): exact batching gives every
run the lone run's logits bit for bit, whatever its company; fast batching moves them, and
flips a pick exactly where the lone run's top two are closer than that move."""

from __future__ import annotations

import random
import threading

import pytest
import torch

from engine import LoadedModel, SamplerSettings
from engine.errors import SettingsError
from engine.prompt import build_prompt
from engine.serving import (
    CompanyRun,
    DeterminismResult,
    ForwardScheduler,
    Sampling,
    decode_alone,
    decode_in_company,
    exact_rows_kernel_in_use,
    near_ties,
    product_in_two_shapes,
    random_company,
    repeated_experiment,
    sum_in_two_orders,
)
from engine.serving.determinism import _prefilled
from tests.planted import PLANTED_PROMPT, PLANTED_STEP, planted_near_tie


@pytest.fixture(scope="module")
def planted() -> LoadedModel:
    return planted_near_tie()


@pytest.fixture(scope="module")
def real_experiment(lm) -> DeterminismResult:
    """The experiment on the real model, run directly: one run for the test of its digits and
    for the test that runs it again through the server's queue (whose checks hold for any seed)."""
    return repeated_experiment(lm, "The capital of France is", runs=2, tokens=6, batch=4, seed=0, timing_repeats=1)


def test_exact_batching_gives_the_lone_logits_bit_for_bit_on_the_real_model(real_experiment) -> None:
    result = real_experiment
    exact = result.exact
    assert exact.max_abs_logit_diff == 0.0
    assert exact.distinct_completions == 1 and exact.first_divergence == (None, None)
    assert exact.texts == (result.lone.text, result.lone.text)
    assert all(step.max_abs_logit_diff == 0.0 for run in exact.runs for step in run.steps)
    # the comparison sees a change where there is one: fast rows are MKL's batched product
    assert result.fast.max_abs_logit_diff > 0.0
    assert result.speed.batch == 4 and result.speed.exact_ms > 0 and result.speed.fast_ms > 0


def test_exact_batching_never_moves_a_logit_over_many_companies_on_the_tiny_model(tiny_lm) -> None:
    result = repeated_experiment(tiny_lm, "Once upon a time", runs=8, tokens=24, batch=8, seed=3)
    assert result.exact.max_abs_logit_diff == 0.0
    assert result.exact.distinct_completions == 1
    assert result.exact.first_divergence == (None,) * 8
    assert {run.batch for run in result.exact.runs} != {result.exact.runs[0].batch}  # the company's size varied
    # on this CPU a batched product adds a row up in another order than a 1-row product at every
    # batch from 2, tiny shapes included: the fast rows' last digits move
    assert result.fast.max_abs_logit_diff > 0.0


def test_fast_batching_flips_greedy_at_the_planted_near_tie_and_nowhere_else(planted) -> None:
    result = repeated_experiment(planted, PLANTED_PROMPT, runs=6, tokens=8, batch=8, seed=0)
    margins = [step.margin for step in result.lone.steps]
    fast = result.fast
    assert margins[PLANTED_STEP] < 1e-5 and min(margins[:PLANTED_STEP]) > 0.1  # the tie is planted where it should be
    assert result.exact.first_divergence == (None,) * 6 and result.exact.max_abs_logit_diff == 0.0
    # batch 2 sums in another order than batches of 3 and more on this CPU, and moves the tied
    # logits the other way: the seed draws none of it, so every run flips
    assert fast.first_divergence == (PLANTED_STEP,) * 6
    assert all(run.token_ids[:PLANTED_STEP] == result.lone.token_ids[:PLANTED_STEP] for run in fast.runs)
    assert margins[PLANTED_STEP] < 2 * fast.max_abs_logit_diff  # a flip needs the change to reach the margin
    assert near_ties(result.lone, 2 * fast.max_abs_logit_diff) == (PLANTED_STEP,)
    assert all(run.steps[PLANTED_STEP + 1].max_abs_logit_diff is None for run in fast.runs)  # no comparison past it
    assert len(fast.runs[0].steps) == 8 and fast.texts[0] != result.lone.text  # decoding went on after the flip


def test_a_sampled_run_with_the_same_draws_flips_at_the_near_tie_too(planted) -> None:
    """At a low temperature the tied tokens share nearly all the mass in equal bands; the fast
    pass reorders them, so the same u lands in another token's band."""
    result = repeated_experiment(planted, PLANTED_PROMPT, runs=6, tokens=8, batch=8, seed=0,
                                 sampler=SamplerSettings(temperature=0.01))
    assert result.lone.sampling == Sampling(SamplerSettings(temperature=0.01), seed=0)
    assert all(step.u is not None and 0 <= step.band_gap <= 1 for step in result.lone.steps)
    assert result.exact.max_abs_logit_diff == 0.0 and result.exact.distinct_completions == 1
    assert result.exact.texts == (result.lone.text,) * 6
    assert set(result.fast.first_divergence) == {PLANTED_STEP}


def test_the_lone_sampled_run_draws_what_a_generation_seeded_alike_draws(tiny_lm) -> None:
    from engine.sampling import draw_uniform

    prompt = build_prompt(tiny_lm, "abc", chat=False).ids
    lone = decode_alone(tiny_lm, prompt, 5, Sampling(SamplerSettings(temperature=0.8), seed=11))
    generator = torch.Generator().manual_seed(11)
    assert [step.u for step in lone.steps] == [draw_uniform(generator) for _ in range(5)]


def test_a_run_in_company_keeps_numbers_not_logits_and_seats_the_visitor_where_asked(tiny_lm) -> None:
    prompt = build_prompt(tiny_lm, "The sea", chat=False).ids
    company = random_company(tiny_lm, 4, random.Random(1))
    run = decode_in_company(tiny_lm, prompt, 5, company, exact=True, row=2)
    assert isinstance(run, CompanyRun) and run.batch == 4 and run.row == 2
    assert run.company_lengths == tuple(len(c) for c in company)
    assert run.token_ids == decode_alone(tiny_lm, prompt, 5).token_ids
    assert not any(isinstance(value, torch.Tensor) for step in run.steps for value in vars(step).values())
    assert all(step.max_abs_logit_diff == 0.0 and not step.differs for step in run.steps)


def test_random_company_is_seeded_and_of_varied_lengths_within_its_limits(tiny_lm) -> None:
    first = random_company(tiny_lm, 16, random.Random(5))
    assert first == random_company(tiny_lm, 16, random.Random(5))
    assert len(first) == 15 and len({len(ids) for ids in first}) > 3
    assert all(4 <= len(ids) <= 48 for ids in first)


def test_near_ties_lists_the_steps_whose_margin_is_below_the_threshold(tiny_lm) -> None:
    lone = decode_alone(tiny_lm, build_prompt(tiny_lm, "near", chat=False).ids, 6)
    margins = [step.margin for step in lone.steps]
    middle = sorted(margins)[3]
    assert near_ties(lone, 0.0) == ()
    assert near_ties(lone, middle) == tuple(i for i, m in enumerate(margins) if m < middle)
    assert near_ties(lone, max(margins) + 1) == tuple(range(6))
    with pytest.raises(SettingsError, match="threshold"):
        near_ties(lone, -1.0)


@pytest.mark.parametrize(("options", "named"), [
    ({"runs": 0}, "runs = 0"), ({"runs": 65}, "runs = 65"), ({"tokens": 0}, "tokens = 0"),
    ({"tokens": 129}, "tokens = 129"), ({"batch": 1}, "batch size = 1"), ({"batch": 17}, "batch size = 17"),
    ({"runs": True}, "runs = True"), ({"seed": -1}, "seed = -1"),
    ({"sampler": SamplerSettings(temperature=0.0)}, "temperature = 0.0"), ({"timing_repeats": 0}, "timing repeats = 0"),
])
def test_the_experiments_limits_name_the_setting_and_what_is_allowed(tiny_lm, options, named) -> None:
    settings = {"runs": 2, "tokens": 4, "batch": 4, "seed": 0, **options}
    with pytest.raises(SettingsError, match=named):
        repeated_experiment(tiny_lm, "Hello", **settings)


def test_decodes_refuse_prompts_and_companies_they_cannot_run(tiny_lm) -> None:
    with pytest.raises(SettingsError, match=r"prompt length = 1 .*from 2"):
        decode_alone(tiny_lm, [72], 4)
    with pytest.raises(SettingsError, match=r"prompt length = 250 .*the context window is 256"):
        decode_alone(tiny_lm, [72] * 250, 8)
    with pytest.raises(SettingsError, match="token ids from 0 to 258"):
        decode_alone(tiny_lm, [72, 10_000], 4)
    with pytest.raises(SettingsError, match=r"company = \[\] .*1 to 15"):
        decode_in_company(tiny_lm, [72, 73], 4, [], exact=True)
    with pytest.raises(SettingsError, match="row = 3"):
        decode_in_company(tiny_lm, [72, 73], 4, [[1, 2]], exact=True, row=3)
    with pytest.raises(SettingsError, match="lone"):
        decode_in_company(tiny_lm, [72, 73], 4, [[1, 2]], exact=False, lone=decode_alone(tiny_lm, [72, 74], 4))


def test_a_job_runs_on_the_schedulers_worker_and_its_error_comes_back(tiny_lm) -> None:
    scheduler = ForwardScheduler(tiny_lm)
    try:
        assert scheduler.call(lambda: threading.current_thread().name) == "forward-scheduler"

        def broken() -> None:
            raise ValueError("a job's own error")

        with pytest.raises(ValueError, match="a job's own error"):
            scheduler.call(broken)
        assert scheduler.call(lambda: 7) == 7  # the worker goes on
    finally:
        scheduler.close()


def test_the_experiment_through_the_servers_queue_leaves_a_class_stepping_meanwhile_its_digits(
        lm, real_experiment) -> None:
    """Three visitors step greedily through the server's exact scheduler while the experiment
    runs its passes through the same queue: each visitor's logits are its lone run's bit for bit,
    and the experiment's own numbers are the ones it gets run directly."""
    prompts = [build_prompt(lm, text, chat=False).ids for text in ("Once upon a time", "The sea is", "1, 2, 3,")]
    steps = 10
    lone = [decode_alone(lm, ids, steps) for ids in prompts]
    scheduler = ForwardScheduler(lm, batching="exact")
    got: dict[int, list[torch.Tensor]] = {}

    def visitor(index: int) -> None:
        ids = prompts[index]
        cache = _prefilled(lm, ids)
        token, kept = ids[-1], []
        for _ in range(steps):
            logits = scheduler.forward([token], cache)
            kept.append(logits)
            token = int(logits.argmax())
        got[index] = kept

    try:
        threads = [threading.Thread(target=visitor, args=(i,)) for i in range(len(prompts))]
        for thread in threads:
            thread.start()
        queued = repeated_experiment(lm, "The capital of France is", runs=2, tokens=6, batch=4, seed=0,
                                     timing_repeats=1, run=scheduler.call)
        for thread in threads:
            thread.join()
    finally:
        scheduler.close()
    for index, run in enumerate(lone):
        assert torch.equal(torch.stack(got[index]), run.logits)
    direct = real_experiment
    assert torch.equal(queued.lone.logits, direct.lone.logits)
    assert queued.exact.max_abs_logit_diff == 0.0 and queued.fast.texts == direct.fast.texts
    assert [s.max_abs_logit_diff for r in queued.fast.runs for s in r.steps] == \
        [s.max_abs_logit_diff for r in direct.fast.runs for s in r.steps]


def test_progress_is_told_after_the_lone_run_and_each_run_in_company(tiny_lm) -> None:
    told: list[tuple[int, int]] = []
    repeated_experiment(tiny_lm, "abc", runs=3, tokens=2, batch=3, seed=0, timing_repeats=1,
                        progress=lambda done, total: told.append((done, total)))
    assert told == [(done, 7) for done in range(1, 8)]


def test_the_why_examples_are_computed_in_the_float_type_named() -> None:
    float32 = sum_in_two_orders(1e8, -1e8, 0.1)
    assert (float32.left, float32.right) == (float(torch.tensor(0.1)), 0.0) and float32.dtype == "float32"
    bf16 = sum_in_two_orders(1.0, 0.003, 0.003, torch.bfloat16)
    assert (bf16.left, bf16.right) == (1.0, 1.0078125)


def test_one_row_in_a_batch_differs_from_alone_in_the_librarys_product_and_not_in_the_exact_kernel(lm) -> None:
    example = product_in_two_shapes(lm, rows=8)
    assert example.weight.endswith("q_proj") and example.inputs == lm.model.config.hidden_size
    assert 0 < example.batched_outputs_differing <= example.outputs and example.batched_max_diff > 0
    if exact_rows_kernel_in_use(lm):
        assert example.exact_max_diff == 0.0
