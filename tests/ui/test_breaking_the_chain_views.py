"""The Breaking the chain page's views on a tiny random model (tests/tiny.py), without Streamlit:
a round with no guess reads as a plain decode step, greedy cards show the model's raw softmax
(the plain lane's, at the same position after the same tokens), counts agree with their nouns,
and the cost's words fit the measured figures. (The page on the real model:
tests/ui/test_breaking_the_chain.py; the cards' fit on screen: tests/browser/.)"""

from __future__ import annotations

import re

import pytest

from engine import Generation, PromptLookup, SamplerSettings, SpeculativeGeneration
from engine.speculative import RaceRow
from ui.controllers import breaking_the_chain as bc
from ui.views.breaking_the_chain import (
    KIND_COLOURS,
    counted,
    no_guess_reason,
    positions_html,
    rejection_html,
    round_kinds,
    round_line_html,
    speculative_chips_html,
    speed_verdict,
    times_a_step,
    verify_cost_text,
    verify_path_text,
)
from ui.views.chain_story import race_cost_text, race_table, race_verdict
from ui.views.format import pct

NO_REPEAT = "xyzw"  # no token occurs twice: prompt lookup finds nothing to copy
REPEATING = "abc abc abc abc"  # lookup copies " abc" onwards


def body(html: str) -> str:
    """The HTML after its style sheets (whose class names would match words)."""
    return html.split("</style>")[-1]


def lanes_after(lm, prompt: str, rounds: int = 1, sampler: SamplerSettings | None = None) -> bc.Lanes:
    """Both lanes on `prompt` (greedy unless told), `rounds` speculative rounds, plain caught up."""
    sampler = sampler or SamplerSettings(temperature=0.0)
    pair = bc.Lanes(SpeculativeGeneration(lm, prompt, draft=PromptLookup(lm.eos_ids), k=4, sampler=sampler),
                    Generation(lm, prompt, sampler=sampler))
    for _ in range(rounds):
        pair.speculative.step()
        bc.catch_up(pair)
    return pair


def test_a_round_without_a_guess_reads_as_a_plain_decode_step_in_words_and_colour(tiny_lm) -> None:
    pair = lanes_after(tiny_lm, NO_REPEAT)
    record = pair.speculative.rounds[-1]
    assert record.drafted == () and record.emitted_kinds == ("plain",)  # the engine says so itself
    assert round_kinds(record) == ("plain",)
    cards = body(positions_html(record))
    assert "no guess" in cards and "bonus" not in cards and "every guess was kept" not in cards
    assert "q draft" not in cards  # no draft existed at this position: no q column, no "q 0%"
    said = rejection_html(record, tiny_lm.texts)
    assert "plain decode step" in said and "Every guess was kept" not in said and "bonus" not in said
    chips = speculative_chips_html("", pair.speculative)
    chip = re.search(r'background:(#\w+);color:#\w+" title="round 1 · ([^"]*)"', chips)
    assert chip is not None and chip[1] == KIND_COLOURS["plain"] and "no guess" in chip[2]
    line = body(round_line_html(record))
    assert "a plain step" in line and "bonus" not in line


def test_a_round_with_no_guess_says_which_tokens_prompt_lookup_looked_for(tiny_lm) -> None:
    pair = lanes_after(tiny_lm, NO_REPEAT)
    reason = no_guess_reason(pair.speculative.rounds[-1], pair.speculative.draft)
    assert "last 3 tokens (failing that, its last 2)" in reason  # drafting.py MAX_NGRAM, MIN_NGRAM


def test_greedy_cards_show_the_models_raw_softmax_not_the_one_hot(tiny_lm) -> None:
    """The raw p on a greedy card is the verify pass's own softmax at that position (the
    sampler's p is a one-hot there), and equals a plain decoding pass there to float rounding."""
    pair = lanes_after(tiny_lm, REPEATING)
    record = pair.speculative.rounds[-1]
    assert record.drafted and record.sampler.greedy
    first = record.positions[0]
    leader = max(first.top, key=lambda r: r.p_raw)
    assert leader.p_raw < 0.5  # a random model: far from the sampler's one-hot
    plain = pair.plain.steps[record.first_position - len(pair.plain.prompt_ids)].distribution
    plain_p = {c.token_id: c.prob for c in plain.top}
    assert all(abs(r.p_raw - plain_p[r.token_id]) < 1e-4 for r in first.top if r.token_id in plain_p)
    assert sum(r.p_raw for r in first.top) + first.others_p_raw == pytest.approx(1.0, abs=1e-5)
    cards = positions_html(record)
    first_card = cards.split('class="bc-pos')[1]
    assert "raw p" in first_card and pct(leader.p_raw) in first_card and "100.0%" not in first_card


def test_sampled_cards_keep_the_ps_and_qs_the_rule_used(tiny_lm) -> None:
    pair = lanes_after(tiny_lm, REPEATING, sampler=SamplerSettings(temperature=1.0))
    record = pair.speculative.rounds[-1]
    cards = positions_html(record)
    assert "q draft" in cards and "p target" in cards and "raw p" not in cards


@pytest.mark.parametrize(("count", "noun", "words"), [(1, "token", "1 token"), (2, "token", "2 tokens"),
                                                      (1, "guess", "1 guess"), (0, "distribution", "0 distributions"),
                                                      (1_234, "position", "1,234 positions")])
def test_counts_agree_with_their_nouns(count, noun, words) -> None:
    assert counted(count, noun, "guesses" if noun == "guess" else None) == words


def test_no_singular_count_on_the_round_reads_as_a_plural(tiny_lm) -> None:
    pair = lanes_after(tiny_lm, NO_REPEAT, rounds=2)
    for record in pair.speculative.rounds:
        text = re.sub("<[^>]+>", " ", round_line_html(record) + rejection_html(record, tiny_lm.texts))
        assert not re.search(r"(?<![\d.,])1 (tokens|guesses|distributions|positions|were)\b", text), text


def test_the_verify_cost_is_worded_from_the_measured_ratio() -> None:
    text = verify_cost_text(31.0, 17.0, 4.6)
    assert "about 1.8× as long as one decode step" in text and "less than the 4.6 steps" in text
    assert "little more" not in text
    assert times_a_step(1.02) == "about as long as one decode step"
    assert "no less than the 1.5 steps" in verify_cost_text(40.0, 10.0, 1.5)


@pytest.mark.parametrize(("spec_ms", "plain_ms", "words"), [
    (10.0, 10.0, "about as fast as"), (10.0, 10.3, "about as fast as"), (10.3, 10.0, "about as fast as"),
    (5.0, 10.0, "2.00× faster"), (20.0, 10.0, "2.00× slower")])
def test_the_speed_verdict_never_says_one_times_slower(spec_ms, plain_ms, words) -> None:
    verdict = speed_verdict(spec_ms, plain_ms)
    assert words in verdict and "1.00×" not in verdict


def test_the_verify_path_says_which_pass_this_server_takes_and_why() -> None:
    assert "bit for bit" in verify_path_text(True, "probed equal") and "last bit" in verify_path_text(True, "x")
    slow = verify_path_text(False, "the lone pass is not in use (TBT_LONE_PASS=eager)")
    assert "transformers' multi-token pass" in slow and "TBT_LONE_PASS=eager" in slow and "float rounding" in slow


def race_row(label: str, ms: float, tokens_per_pass: float, acceptance: float | None, k: int | None = 4,
             same: bool = True) -> RaceRow:
    """A row of 48 tokens at `ms` a token after the first pass, made in 48 / tokens_per_pass passes."""
    passes = round(48 / tokens_per_pass)
    checked = 0 if acceptance is None else 100
    return RaceRow("m", label, k, 48, passes, checked, 0 if acceptance is None else round(100 * acceptance), 1.0,
                   47 * ms / 1e3, 47, 0.1, (), (1,) * 48, same)


def test_the_race_table_puts_k_and_the_text_check_beside_the_method_and_shows_the_run_under_way() -> None:
    rows = [race_row("plain decoding", 40.0, 1.0, None, k=None), race_row("prompt lookup", 20.0, 2.5, 0.6)]
    table = race_table(rows, running="early exit")
    assert list(table[0])[:4] == ["method", "k", "same text", "ms / token"]
    assert [r["k"] for r in table] == ["–", "4", ""] and [r["speed-up"] for r in table[:2]] == ["1.00×", "2.00×"]
    assert table[-1]["method"] == "early exit" and table[-1]["same text"] == "running…"


def test_the_race_verdict_names_the_winner_and_says_why_each_slower_method_was_slower_in_its_figures() -> None:
    rows = [race_row("plain decoding", 40.0, 1.0, None, k=None), race_row("prompt lookup", 20.0, 2.4, 0.6),
            race_row("early exit", 80.0, 1.05, 0.1, k=2), race_row("bfloat16 draft", 50.0, 1.8, 0.7)]
    verdict = race_verdict(rows)
    assert verdict.startswith("**prompt lookup** (k = 4) was fastest here: 20.0 ms a token against plain "
                              "decoding's 40.0, 2.40 tokens a pass, 60% of its guesses kept.")
    assert ("\n\nSlower than plain decoding:\n- early exit (0.50× its speed): its guesses were seldom kept "
            "(1.04 tokens a pass, 10% of its guesses kept).\n") in verdict
    assert "- bfloat16 draft (0.80× its speed): its guesses were kept, but making them cost more than" in verdict
    all_slower = race_verdict([rows[0], rows[2]])
    assert all_slower.startswith("No method beat plain decoding here (40.0 ms a token).")
    wrong = race_verdict([rows[0], race_row("broken", 10.0, 3.0, 0.9, same=False)])
    assert wrong.startswith("Not plain decoding's text: broken.")


def test_the_race_says_what_it_will_cost_before_it_starts() -> None:
    last = (("plain decoding", 8.0), ("early exit", 47.0), ("prompt lookup", 5.0))
    assert race_cost_text(3, 48, last, 40.0).startswith(
        "3 runs of 48 new tokens, one after another on this server: about 60 s, what the last race here took "
        "(the longest run: early exit, 47 s).")
    floor = race_cost_text(3, 48, (), 40.0)
    assert "at least 6 s (plain decoding takes 40 ms a token here, in your plain lane)" in floor
    assert race_cost_text(3, 48, (), None).startswith("3 runs of 48 new tokens, one after another on this server.")
