"""The checker for a student's own sampler and stop rule, on the real model: a right student
passes, each known mistake is caught and named, and the command line's exit codes say which."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import torch

from engine import (
    CheckReport,
    LoadedModel,
    SamplerSettings,
    StudentCodeError,
    check_sampler,
    check_stop,
    checker,
    load_student,
    on_sampler_thread,
    run_chain,
)
from engine.checker import stop_lists, top_p_boundaries
from engine.cli import main
from engine.stopping import first_match, stop_sequence_states

STUDENTS = Path(__file__).parent / "students"
GOOD_SAMPLER = STUDENTS / "good_sampler.py"
T = TypeVar("T")


def once_per_model(compute: Callable[[LoadedModel], list[T]]) -> Callable[[LoadedModel], list[T]]:
    """`compute(lm)` run once per model, a fresh list of its items handed out each call."""
    kept: dict[int, tuple[LoadedModel, list[T]]] = {}  # id(lm): (lm, its items); lm kept so its id stays its own

    def memo(lm: LoadedModel) -> list[T]:
        if id(lm) not in kept:
            kept[id(lm)] = (lm, compute(lm))
        return list(kept[id(lm)][1])

    return memo


@pytest.fixture(scope="module", autouse=True)
def real_runs_once() -> Iterator[None]:
    """Every check here reads the same greedy runs of the model (the sampler's logits, the stop
    rule's texts): each is run once for this module. The checker hands a student clones of the
    logits and strings are immutable, so no check can change them for the next."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checker, "greedy_logits", once_per_model(checker.greedy_logits))
        patch.setattr(checker, "greedy_texts", once_per_model(checker.greedy_texts))
        yield


def wrong_sampler(mistake: str):
    return load_student(STUDENTS / "wrong_samplers.py", mistake)


def stop_student(name: str):
    return load_student(STUDENTS / "stops.py", name)


# ---- the sampler -----------------------------------------------------------------------------


def test_a_correct_sampler_agrees_with_the_engine_on_every_case(lm) -> None:
    report = check_sampler(GOOD_SAMPLER, lm)
    assert isinstance(report, CheckReport)
    assert report.passed and report.difference is None
    assert report.cases == report.total > 250
    assert str(report).startswith(f"final_distribution agrees with the engine's sampler on all {report.total}")


def test_a_correct_sampler_in_float64_returning_numpy_agrees_too(lm) -> None:
    good = load_student(GOOD_SAMPLER, "final_distribution")
    report = check_sampler(lambda logits, *settings: good(logits.double(), *settings).numpy(), lm)
    assert report.passed, report.text()


@pytest.mark.parametrize(("mistake", "hint"), [
    ("top_p_off_by_one", "one token fewer than the engine at the top-p boundary: the token that crosses p is kept"),
    ("temperature_after_filters", "applying temperature after the filters"),
    ("top_k_drops_ties", "top-k keeps every token tied with the k-th logit"),
    ("min_p_before_temperature", "min-p cut is the one measured on the probabilities before temperature"),
    ("temperature_zero_not_greedy", "temperature 0 means greedy"),
])
def test_each_known_sampler_mistake_is_caught_and_named(lm, mistake: str, hint: str) -> None:
    student = wrong_sampler(mistake)
    report = check_sampler(student, lm)
    difference = report.difference
    assert not report.passed and difference is not None
    assert hint in difference.hint
    text = report.text()
    assert f"differs from the engine's sampler at case {report.cases} of {report.total}" in text
    # every setting, where the logits come from, the token, and the engine's stage table
    s = difference.settings
    assert f"temperature={s.temperature!r}, top_k={s.top_k!r}, top_p={s.top_p!r}, min_p={s.min_p!r}" in text
    assert "greedy step" in text and difference.where in text
    token = difference.token
    assert token is not None and f"token {token.token_id} {lm.texts.piece(token.token_id).text!r}" in text
    assert f"raw rank {token.raw_rank:,}" in text
    assert all(stage.label in text for stage in difference.stages)
    # the counts are the engine's (on its sampler thread, as the checker runs it) and the
    # student's own, on the logits the report carries
    settings = SamplerSettings(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p)
    engine = on_sampler_thread(run_chain)(difference.logits, torch.tensor([0]), settings)
    assert difference.reference_kept == int((engine.final_probs > 0).sum())
    assert difference.stages == engine.stages
    answer = student(difference.logits.clone(), s.temperature, s.top_k, s.top_p, s.min_p)
    assert difference.student_kept == int((answer > 0).sum()) != difference.reference_kept


def test_a_greedy_pick_of_another_tied_maximum_is_named_as_the_tie(lm) -> None:
    good = load_student(GOOD_SAMPLER, "final_distribution")

    def last_of_tied_maxima(logits, temperature, top_k, top_p, min_p):
        if temperature != 0:
            return good(logits, temperature, top_k, top_p, min_p)
        probs = torch.zeros_like(logits)
        probs[int((logits == logits.max()).nonzero()[-1])] = 1.0
        return probs

    report = check_sampler(last_of_tied_maxima, lm)
    assert not report.passed and "(a tie)" in report.difference.where
    assert "on a tie of the maximum the engine takes the first tied token" in report.difference.hint


def test_at_an_exact_top_p_boundary_either_side_of_the_tie_is_accepted(lm) -> None:
    """Keeping the token whose mass before it equals p exactly (<= instead of <) differs from the
    engine only where float rounding decides, and passes; just below and above, the engine's
    own answers are one token apart, so an off-by-one there is caught."""
    source = checker.greedy_logits(lm)[0]
    below, at, above = top_p_boundaries(source, 1.0, (1,))
    kept = [int((run_chain(source.values, source.context_ids, s).final_probs > 0).sum()) for s in (below, above)]
    assert below.top_p < at.top_p < above.top_p and kept == [1, 2]

    good = load_student(GOOD_SAMPLER, "final_distribution")

    def keeps_the_token_at_p(logits, temperature, top_k, top_p, min_p):
        if temperature == 0 or top_k or min_p or top_p >= 1:
            return good(logits, temperature, top_k, top_p, min_p)
        probs = torch.softmax(logits / temperature, dim=-1)
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.zeros(probs.numel(), dtype=torch.bool)
        keep[order] = torch.cumsum(sorted_probs, dim=0) - sorted_probs <= top_p
        return torch.softmax((logits / temperature).masked_fill(~keep, float("-inf")), dim=-1)

    assert check_sampler(keeps_the_token_at_p, lm).passed


def test_a_sampler_that_raises_is_refused_naming_the_case_and_its_line(lm, tmp_path) -> None:
    path = tmp_path / "student.py"
    path.write_text("def final_distribution(logits, temperature, top_k, top_p, min_p):\n"
                    "    return logits.softmax(-1) / (1 / temperature)\n")
    with pytest.raises(StudentCodeError, match=r"ZeroDivisionError.* at student\.py, line 2, on case 1 of \d+: "
                                               r"temperature=0, top_k=0"):
        check_sampler(path, lm)


def test_an_answer_that_is_not_a_distribution_is_reported_in_words(lm) -> None:
    report = check_sampler(lambda logits, *settings: logits, lm)
    assert "your probabilities sum to" in report.difference.problem or "negative" in report.difference.problem
    report = check_sampler(lambda logits, *settings: logits.softmax(-1)[None], lm)
    assert "shape (1, 49152)" in report.difference.problem


# ---- stop sequences --------------------------------------------------------------------------


def test_a_correct_stop_rule_agrees_with_the_engine_on_every_case(lm) -> None:
    report = check_stop(stop_student("find_stop"), lm)
    assert report.passed and report.cases == report.total > 100
    assert "agrees with the engine's stop-sequence rule" in report.text()


def test_the_stop_cases_cover_the_hard_places_in_a_real_text(lm) -> None:
    texts = checker.greedy_texts(lm)
    kinds = dict(stop_lists(texts))
    assert len(kinds) == 8 and all(len(texts[i]) > len(texts[i - 1]) for i in range(1, len(texts)))
    full = texts[-1]
    starts = [0, *(len(t) for t in texts[:-1])]
    across = next(stops[0] for what, stops in kinds.items() if what.startswith("a stop sequence across"))
    at = full.find(across)
    assert any(at < start < at + len(across) for start in starts)  # it spans a token boundary
    inside = next(stops[0] for what, stops in kinds.items() if what.startswith("a stop sequence inside"))
    assert not any(full.find(inside) < start < full.find(inside) + len(inside) for start in starts)
    positions = {what: first_match(stop_sequence_states(full, stops)) for what, stops in kinds.items()}
    assert positions["a stop sequence at the very start"].position == 0
    assert positions["no stop sequence present"] is None
    several = kinds["several at once: the earliest in the text wins, not the first listed"]
    assert positions["several at once: the earliest in the text wins, not the first listed"].sequence != several[0]


def test_no_stop_case_asks_about_a_character_still_incomplete() -> None:
    """A text that ends inside a character (U+FFFD) is held back from matching, a rule the
    exercise does not teach: the cases leave it out."""
    texts = ["The", "The cat", "The cat sat", "The cat sat on", "The cat sat on the", "The cat sat on the \ufffd"]
    kinds = dict(stop_lists(texts))
    assert kinds and not any("\ufffd" in stop for stops in kinds.values() for stop in stops)
    assert not any(what.startswith("a stop sequence begun at the end") for what in kinds)


@pytest.mark.parametrize(("name", "hint"), [
    ("returns_the_end", "you returned where the stop sequence ends"),
    ("first_listed", "the stop sequence that begins earliest in the text"),
    ("newest_token_only", "search the whole text, not only the newest token"),
])
def test_each_known_stop_mistake_is_caught_and_named(lm, name: str, hint: str) -> None:
    report = check_stop(stop_student(name), lm)
    difference = report.difference
    assert not report.passed and hint in difference.hint
    text = report.text()
    assert f"find_stop(text, [{', '.join(repr(s) for s in difference.stops)}])" in text
    assert f"the engine: {difference.reference!r}; your code: {difference.answer!r}" in text
    assert "around the engine's index:" in text and repr(difference.text) in text
    assert difference.reference == first_match(stop_sequence_states(difference.text, difference.stops)).position


def test_a_stop_rule_returning_minus_one_is_told_to_return_none(lm) -> None:
    report = check_stop(lambda text, stops: min((text.find(s) for s in stops if s in text), default=-1), lm)
    assert report.difference.answer == -1 and report.difference.reference is None
    assert "not -1" in report.difference.hint


# ---- loading the student's file --------------------------------------------------------------


@pytest.mark.parametrize(("source", "message"), [
    (None, "no such file"),
    ("def final_distribution(logits:\n", "line 1: syntax error"),
    ("import no_such_module_here\n", "ModuleNotFoundError"),
    ("def sample(logits):\n    return logits\n", "has no function final_distribution(logits, temperature, top_k, "
                                                 "top_p, min_p) (it defines sample)"),
])
def test_a_file_that_cannot_give_the_function_is_refused_by_name(tmp_path, source, message) -> None:
    path = tmp_path / "student.py"
    if source is not None:
        path.write_text(source)
    with pytest.raises(StudentCodeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_student(path, "final_distribution")


# ---- the command line ------------------------------------------------------------------------


def test_the_check_command_exits_0_when_it_agrees_and_1_when_it_differs(cli_on_lm, capsys) -> None:
    assert main(["check", "stop", str(STUDENTS / "stops.py")]) == 0
    assert "find_stop agrees" in capsys.readouterr().out
    assert main(["check", "sampler", str(STUDENTS / "wrong_samplers.py"), "--function", "top_k_drops_ties"]) == 1
    out = capsys.readouterr().out
    assert "top_k_drops_ties differs" in out and "hint: top-k keeps every token tied" in out


def test_the_check_command_exits_2_naming_what_is_wrong(cli_on_lm, capsys, tmp_path) -> None:
    assert main(["check", "sampler", str(tmp_path / "missing.py")]) == 2
    assert "missing.py: no such file" in capsys.readouterr().err
    assert main(["check", "stop", str(GOOD_SAMPLER)]) == 2
    assert "has no function find_stop(text, stop_sequences)" in capsys.readouterr().err
    raising = tmp_path / "raising.py"
    raising.write_text("def find_stop(text, stop_sequences):\n    raise NotImplementedError('todo')\n")
    assert main(["check", "stop", str(raising)]) == 2
    err = capsys.readouterr().err
    assert "find_stop raised NotImplementedError: todo at raising.py, line 2, on case 1" in err
    assert "Traceback" not in err


def test_the_check_command_runs_a_students_file_and_prints_the_report(cli_on_lm, capsys) -> None:
    """`python -m engine` as a command (its own interpreter and load) is run by
    test_cli_prints_a_step_table_and_writes_the_trace; here its `check sampler` in this process."""
    assert main(["check", "sampler", str(GOOD_SAMPLER)]) == 0
    captured = capsys.readouterr()
    assert "final_distribution agrees with the engine's sampler on all" in captured.out, captured.err[-2000:]
