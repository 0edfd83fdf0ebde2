"""The KV cache & speed page: it shows the engine's measurements, and a rerun redraws them
without measuring again."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from streamlit.testing.v1 import AppTest

from engine.forward import lone_pass_decision
from engine.serving import exact_rows_kernel_in_use, sum_order
from engine.speed import KNOWN_CONFIGS, QUICK, Sizes, loaded_kv_config
from tests.ui.apptest import open_page
from ui.controllers import kv_speed as kv
from ui.server.measurements import shared_board
from ui.session.keys import KV
from ui.views.format import nbytes
from ui.views.kv_speed import SUM_ORDER_WORDS

# The page's first visit measures the "quick" tier; here at smaller sizes, since what is tested is
# what the page shows of its measurements (the measurements themselves: tests/engine/test_speed.py).
SMALL = Sizes(cache_lengths=(16, 32), prompt_tokens=16, decode_steps=2, batch_context=8, repeats=QUICK.repeats)


@pytest.fixture(scope="module")
def page() -> Iterator[AppTest]:
    """The page after its first (quick, here SMALL) measurements: taken once for this module.
    The server's board forgets them after, so no later test reads them as the quick tier's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(kv.TIERS, "quick", SMALL)
        yield open_page("pages/kv_speed.py", timeout=300)
    shared_board.clear()


def results(at: AppTest) -> dict:
    return at.session_state[KV.results]


def test_page_measures_every_section_once(page):
    measured = {key[-1] for key in results(page)}
    assert measured == {"cache vs recompute", "prefill vs decode", "KV cache size",
                        "device compute and bandwidth", "one decode step", "how the step reads", "batched decode",
                        "packed vs lone passes"}
    cache_points = next(v for k, v in results(page).items() if k[-1] == "cache vs recompute")
    assert [p.context_tokens for p in cache_points] == list(SMALL.cache_lengths)
    last = cache_points[-1]
    assert any(f"**{last.ratio:.1f}× slower**" in m.value for m in page.markdown)
    batch = next(v for k, v in results(page).items() if k[-1] == "batched decode")
    assert [p.batch for p in batch] == [1, 4, 16]
    assert [m.value for m in page.metric if m.label.startswith("batch ")] == [f"{p.step_ms:.1f} ms" for p in batch]


def test_the_servers_own_scheduler_and_the_packed_passes_differences_are_shown(lm, page):
    exact, fast = next(v for k, v in results(page).items() if k[-1] == "packed vs lone passes")
    assert exact.exact and not fast.exact and exact.max_logit_diff == 0.0 and 0 < fast.max_logit_diff < 1e-4
    assert any(f"largest difference in any logit was **{exact.max_logit_diff:.1g}**" in m.value
               and f"**{fast.max_logit_diff:.1e}** in a logit" in m.value for m in page.markdown)
    # how exact batching keeps each row's lone digits: the exact rows kernel in the order this CPU's
    # 1-row product sums in (probed when it was built), else each row on its own
    said = SUM_ORDER_WORDS[sum_order()] if exact_rows_kernel_in_use(lm) else "multiplies each row on its own"
    assert any(said in m.value for m in page.markdown)
    labels = {m.label for m in page.metric}
    assert {"visitors, last 10 s", "tokens / s, last 10 s", "mean visitors per pass", "waiting now"} <= labels


def test_kv_bytes_shown_are_read_from_the_real_cache(lm, page):
    snapshot = next(v for k, v in results(page).items() if k[-1] == "KV cache size")
    per_position = loaded_kv_config(lm).bytes_per_position
    assert snapshot.bytes == snapshot.positions * per_position
    assert any(f"**{per_position:,} bytes per position**" in m.value for m in page.markdown)
    table = page.dataframe[0].value
    assert list(table["model"])[1:] == [c.name for c in KNOWN_CONFIGS]
    assert table["model"].iloc[0].endswith("loaded here")
    assert table["per position"].iloc[0] == nbytes(per_position)
    assert table["4,096 positions"].iloc[2] == nbytes(KNOWN_CONFIGS[1].bytes_for(4096))


def test_intensity_metrics_are_the_measured_steps(page):
    step = next(v for k, v in results(page).items() if k[-1] == "one decode step")
    shown = {m.label: m.value for m in page.metric}
    assert shown["arithmetic intensity (FLOP/byte)"] == f"{step.flops_per_byte:.2f}"
    assert shown["achieved bandwidth"] == f"{step.achieved_bytes_per_s / 1e9:.1f} GB/s"


def test_the_step_is_set_against_a_plain_read_and_its_own_products_and_the_path_is_named(lm, page):
    reads = next(v for k, v in results(page).items() if k[-1] == "how the step reads")
    step = next(v for k, v in results(page).items() if k[-1] == "one decode step")
    assert reads.step is step
    shown = {m.label: m for m in page.metric}
    assert shown["a plain read of memory"].value == f"{reads.read_bytes_per_s / 1e9:.1f} GB/s"
    assert shown["the step's products alone"].value == f"{reads.products_bytes_per_s / 1e9:.1f} GB/s"
    assert shown["the whole step"].delta == f"{100 * reads.achieved_fraction:.0f}% of the plain read"
    parts = page.dataframe[1].value
    assert list(parts["ms"]) == [f"{reads.products_ms:.1f}", f"{reads.attention_ms:.2f}", f"{reads.other_ms:.1f}"]
    assert reads.products_ms > 0 and reads.products_bytes > 0.9 * step.weight_bytes
    # timed apart, the parts can outrun the step on a busy machine: the page then says so
    said = "the rest of its" if reads.parts_add_up else "the split above is no measurement"
    assert any(said in m.value for m in page.markdown)
    decision = lone_pass_decision(lm)
    assert reads.path == decision.path
    assert any(f"take **{decision.path}**" in c.value for c in page.caption)


def test_changing_the_context_length_redraws_without_measuring_again(page):
    before = dict(results(page))
    page.number_input(key=KV.positions).set_value(8192).run()
    assert not page.exception
    after = results(page)
    assert after.keys() == before.keys()
    assert all(after[key] is before[key] for key in before)  # the same objects: nothing re-measured
    assert "8,192 positions" in page.dataframe[0].value.columns
