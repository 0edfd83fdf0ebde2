"""What a screen reader hears and what does not hang on colour: each chart's text alternative says
the numbers the chart draws (the pick, raw and final, a removed token 'cut'); a chip's shading is
said in words beside it; the final bars are striped as well as orange; the live region names the
newest token; panel headings are level 3 under the page's level 2."""

from __future__ import annotations

import json
import re

import pytest

from engine import Candidate, Distribution, Generation, LoadedModel, SamplerSettings, StopSettings
from ui.views.bars import distribution_bars_html
from ui.views.breaking_the_chain import KIND_BORDERS, speculative_chips_html
from ui.views.charts import CUT, FINAL_PATTERN, distribution_figure, distribution_words, figure_words, kv_words
from ui.views.chips import generated_chip
from ui.views.records import heading_html
from ui.views.teaching_charts import kv_memory_figure, ratio_figure
from ui.views.theme import LIGHT
from ui.widgets import panels

SR = re.compile(r'<(?:span|div) class="tbt-sr" style="[^"]*clip-path:inset\(50%\)[^"]*">([^<]*)</(?:span|div)>')


def candidate(token_id: int, text: str, prob: float, final: float, rank: int) -> Candidate:
    return Candidate(token_id=token_id, text=text, logit=10.0 - rank, prob=prob, final_prob=final, rank=rank)


# top-k 2: the third token is removed by the sampler; the pick is the second
DISTRIBUTION = Distribution(
    top=(candidate(11, " Paris", 0.6, 0.75, 1), candidate(12, " Lyon", 0.2, 0.25, 2),
         candidate(13, " Nice", 0.1, 0.0, 3)),
    raw_entropy_bits=1.5, final_entropy_bits=0.8, others_count=997, others_prob=0.1, others_final_prob=0.0)


def test_the_distribution_in_words_names_the_pick_and_every_row_the_chart_draws() -> None:
    words = distribution_words(DISTRIBUTION, pick_id=12, top_n=10)
    assert "The pick is ' Lyon'." in words.replace("␣", " ")
    assert "#1 '␣Paris': raw 60.0%, final 75.0%" in words
    assert "#2 '␣Lyon' (the pick): raw 20.0%, final 25.0%" in words
    assert f"#3 '␣Nice': raw 10.0%, final {CUT}" in words  # removed, said in a word, not by a missing bar
    assert "all other 997 tokens: raw 10.0%, final cut" in words
    chart = distribution_figure(DISTRIBUTION, pick_id=12).to_dict()
    raw, final = chart["data"]
    assert raw["text"] == ["60.0%", "20.0%", "10.0%", "10.0%"] and final["text"] == ["75.0%", "25.0%", CUT, CUT]
    assert final["textfont"]["color"] == [LIGHT.text, LIGHT.text, LIGHT.muted, LIGHT.muted]  # 'cut' quieter
    assert "logit 8.00" in distribution_words(DISTRIBUTION, 12, mode="logit").replace("raw ", "")


def test_the_final_distribution_is_striped_as_well_as_orange_and_the_raw_one_is_not() -> None:
    raw, final = distribution_figure(DISTRIBUTION, pick_id=12).to_dict()["data"]
    assert final["marker"]["pattern"] == FINAL_PATTERN and "pattern" not in raw["marker"]
    bars = distribution_bars_html(DISTRIBUTION, 12)
    fills = re.findall(r'class="tbt-bars-fill" style="[^"]*background:([^"]*)"', bars)
    assert all(f.startswith("repeating-linear-gradient") for f in fills[1::2])  # every final bar
    assert not any("gradient" in f for f in fills[::2])  # no raw bar
    assert re.search(r'tbt-bars-key" style="background:repeating-linear-gradient[^"]*"></span>final', bars)
    assert [m for m in SR.findall(bars)][:2] == ["raw: ", "final: "]  # each value's series, said


def test_a_teaching_chart_in_words_reads_its_rows_top_down_with_their_value_labels_and_axes() -> None:
    from engine.speed import CachePoint

    words = figure_words(ratio_figure([CachePoint(context_tokens=n, cached_ms=1.0, recompute_ms=n / 8)
                                       for n in (16, 64)]))
    assert words.startswith("Chart: Recompute ÷ cached (across: context length (tokens), up: times slower (×))")
    assert "16 2.0×, 64 8.0×" in words
    memory = figure_words(kv_memory_figure([("big", 2**30), ("small", 5 * 2**20)], 4096))
    assert memory.index("big 1.00 GiB") < memory.index("small 5.0 MiB")  # as the rows read, the first on top


def test_a_chip_says_its_shading_in_words_outside_the_chip_and_the_lane_frames_each_kind(lm: LoadedModel) -> None:
    gen = Generation(lm, "The capital of France is", sampler=SamplerSettings(temperature=0),
                     stop=StopSettings(max_new_tokens=2))
    step = gen.step()
    chip = generated_chip(step, newest=True)
    assert SR.findall(chip) == [f"(raw p {step.prob * 100:.1f}%, newest)"]
    assert chip.index("</span>") < chip.index('class="tbt-sr"')  # the chip's own text stays the token's
    assert KIND_BORDERS["replaced"] != KIND_BORDERS["bonus"] and all(KIND_BORDERS[k] for k in ("replaced", "bonus"))


def test_the_speculative_lane_says_each_tokens_kind_except_a_kept_guess(tiny_lm: LoadedModel) -> None:
    from engine import PromptLookup, SpeculativeGeneration

    spec = SpeculativeGeneration(tiny_lm, "abcabcabc", draft=PromptLookup(), sampler=SamplerSettings(temperature=0),
                                 stop=StopSettings(max_new_tokens=8))
    for _ in range(3):
        spec.step()
    lane = speculative_chips_html("", spec)
    kinds = [k for record in spec.rounds for k in record.emitted_kinds]
    spoken = SR.findall(lane)
    assert len(spoken) == sum(k != "accepted" for k in kinds) and spoken


def test_the_live_region_names_the_newest_token_and_when_generation_ended(lm: LoadedModel) -> None:
    gen = Generation(lm, "The capital of France is", sampler=SamplerSettings(temperature=0),
                     stop=StopSettings(max_new_tokens=1))
    assert panels.step_words(gen).startswith("No token generated yet. The prompt is")
    gen.step()
    words = panels.step_words(gen)
    assert words.startswith("Step 1: '␣Paris', raw p 7") and "1 token generated" in words
    assert "Finished: max tokens." in words
    assert kv_words(gen.steps).startswith("Chart of the KV cache after its 1 step: step 1: ")


def test_a_kv_chart_in_words_keeps_the_first_and_the_latest_steps_of_a_long_generation(lm: LoadedModel) -> None:
    gen = Generation(lm, "Count: 1, 2, 3,", sampler=SamplerSettings(temperature=0), stop=StopSettings(max_new_tokens=8))
    for _ in range(8):
        gen.step()
    words = kv_words(gen.steps)
    assert "step 1:" in words and "step 2:" in words and "…" in words and "step 8:" in words
    assert "step 4:" not in words
    assert json.dumps(words)  # plain text


@pytest.mark.parametrize("title", ["Sampler decision", "Next-token distribution at step 3"])
def test_panel_headings_are_level_3_under_the_pages_level_2_title(title: str) -> None:
    assert heading_html(title, "c").startswith(f'<h3 class="tbt-heading">{title}</h3>')
