"""The inside-the-pass views (ui/views/inside.py) on a made-up InsideView: what they mark and
say follows the numbers given, for any model (tied head or not, a sliding window or not)."""

from __future__ import annotations

import re

import pytest

from engine import InsideView, LayerView, TokenPiece
from ui.views import inside as inside_views

PICK = 7


def layer(index: int, top: int, attention: tuple[tuple[float, ...], ...] | None, weight_bytes: int = 1000
          ) -> LayerView:
    return LayerView(layer=index, top_token_id=top, top_text=f"t{top}", top_prob=0.5, pick_prob=0.25, pick_rank=2,
                     entropy_bits=1.0, attention_ms=None if index == 0 else 1.0, mlp_ms=None if index == 0 else 2.0,
                     ms=4.0, weight_bytes=weight_bytes, kv_bytes=0 if index == 0 else 64, attention=attention)


def view(heads_per_layer: list[tuple[tuple[float, ...], ...]], tops: list[int], head_bytes: int = 1000,
         first_lead: int | None = None) -> InsideView:
    layers = (layer(0, tops[0], None), *(layer(i + 1, tops[i + 1], heads) for i, heads in enumerate(heads_per_layer)))
    return InsideView(step=1, position=len(heads_per_layer[0][0]) - 1, hidden_size=8, layers=layers,
                      first_lead=first_lead, kv_head_of=(0, 0, 1, 1), head_ms=3.0, head_bytes=head_bytes,
                      forward_ms=30.0, unavailable=())


SINK = ((0.7, 0.1, 0.2),) * 4
SPREAD = ((0.1, 0.3, 0.6),) * 4


def pieces() -> list[TokenPiece]:
    return [TokenPiece(token_id=i, text=f"p{i}", special=False, partial_bytes=False) for i in range(3)]


def test_lens_cells_mark_the_picks_layers_and_its_lead_in_text() -> None:
    shown = view([SINK, SINK], tops=[3, PICK, PICK], first_lead=1)
    html = inside_views.lens_cells_html(shown, pieces()[0], PICK)
    marks = re.findall(r'role="listitem" aria-label="([^"]*)">(★ )?(▶ )?', html)
    assert [bool(pick) for _, _, pick in marks] == [False, True, True]
    assert [bool(lead) for _, lead, _ in marks] == [False, True, False]
    assert "the pick leads from here" in marks[1][0] and "the step&#x27;s pick" in marks[2][0]


def test_attention_is_averaged_over_heads_and_layers_and_a_sink_is_named_only_where_it_is() -> None:
    assert inside_views.attention_by_position(view([SINK, SPREAD], tops=[1, 2, 3])) == pytest.approx([0.4, 0.2, 0.4])
    assert "attention sink" in inside_views.sink_text(view([SINK, SINK], tops=[1, 2, 3]), pieces())
    assert "attention sink" not in inside_views.sink_text(view([SPREAD, SPREAD], tops=[1, 2, 3]), pieces())
    assert "4 query heads read 2 KV heads" in inside_views.sink_text(view([SINK], tops=[1, 2]), pieces())


def test_what_the_view_teaches_is_true_of_the_model_shown() -> None:
    tied = inside_views.lessons(view([SINK], tops=[1, 2], head_bytes=1000))  # the embeddings' bytes: 1000 too
    untied = inside_views.lessons(view([SINK], tops=[1, 2], head_bytes=3000))
    assert "tied embeddings" in tied[0] and "separate matrix" in untied[0]
    # the head's share: its bytes over the layers' weights, the cached keys and values, and itself
    share = f"{3000 / (1000 + 64 + 3000):.0%}"
    assert f"{share} of the bytes" in untied[-1]
    assert f"(**{share}**" in inside_views.reading_text(view([SINK], tops=[1, 2], head_bytes=3000))


def test_the_time_chart_splits_each_layer_and_adds_up_to_its_measured_time() -> None:
    figure = inside_views.times_figure(view([SINK, SINK], tops=[1, 2, 3]))
    attention, mlp, rest = (list(trace.y) for trace in figure.data)
    totals = [a + m + r for a, m, r in zip(attention, mlp, rest, strict=True)]
    assert totals == [4.0, 4.0, 4.0, 3.0]  # embeddings, two layers, the head
    assert attention[1:3] == [1.0, 1.0] and mlp[1:3] == [2.0, 2.0]
