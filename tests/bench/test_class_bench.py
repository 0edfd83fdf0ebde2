"""The class benchmark's client side, without a server: a fragment timer's rerun, a typed guess and
the follow element's trigger are sent as the browser sends them, and a follower's screen is read
for its token count and the version its follow element drew."""

from __future__ import annotations

from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

from bench.class_bench import MOVED, SIGNAL, shown_steps
from bench.streamlit_client import Visitor, component_in, rerun_message, text_field_in, text_in


def test_a_timer_rerun_is_a_fragment_auto_rerun_and_a_typed_value_a_string_widget_state():
    auto = rerun_message("room=ABCDEF", "hash", fragment_id="frag", auto=True, page_name="class")
    assert auto.rerun_script.is_auto_rerun and auto.rerun_script.fragment_id == "frag"
    assert auto.rerun_script.page_name == "class" and not auto.rerun_script.widget_states.widgets
    typed = rerun_message("", "hash", fragment_id="frag", text=("$$ID-abc-cls_guess_text_x", "Paris"))
    [widget] = typed.rerun_script.widget_states.widgets
    assert (widget.id, widget.string_value) == ("$$ID-abc-cls_guess_text_x", "Paris")
    assert not typed.rerun_script.is_auto_rerun


def test_text_fields_and_html_are_read_from_the_deltas():
    msg = ForwardMsg()
    msg.delta.fragment_id = "frag"
    msg.delta.new_element.text_input.id = "$$ID-abc-cls_guess_text_x"
    assert text_field_in(msg) == ("cls_guess_text_x", "$$ID-abc-cls_guess_text_x", "frag")
    html = ForwardMsg()
    html.delta.new_element.html.body = '<div class="tbt-class-status" data-steps="3"><b>3</b> tokens</div>'
    assert shown_steps((text_in(html),)) == 3
    assert shown_steps(("no count here",)) is None


def test_a_message_aged_out_while_a_rerun_was_on_its_way_still_resolves():
    visitor = Visitor(connection=None, url="", query_string="", timeout=1.0, _max_age=0)
    kept = ForwardMsg()
    kept.delta.new_element.html.body = "x" * 100
    kept.hash, kept.metadata.cacheable = "h1", True
    visitor._resolve(kept)
    visitor._age_cache(())
    assert "h1" not in visitor._cache
    assert text_in(visitor._resolve(ForwardMsg(ref_hash="h1"))) == "x" * 100
    assert "h1" in visitor._cache  # in use again


def test_the_follow_elements_trigger_reruns_its_fragment_with_the_trigger_widget_the_frontend_sends():
    drawn = ForwardMsg()
    drawn.delta.fragment_id = "frag"
    drawn.delta.new_element.bidi_component.id = "$$ID-abc-cls_follow_view"
    drawn.delta.new_element.bidi_component.component_name = SIGNAL
    drawn.delta.new_element.bidi_component.json = '{"port": 8502, "path": "/rooms/X/version?token=t", "version": 4}'
    visitor = Visitor(connection=None, url="http://h/class?room=X", query_string="room=X", timeout=1.0)
    visitor._note_delta(drawn, [], [])
    assert visitor.components[SIGNAL] == component_in(drawn)[1] and visitor.components[SIGNAL].data["version"] == 4
    sent = visitor.trigger_message(SIGNAL, MOVED, 5).rerun_script
    assert sent.fragment_id == "frag" and not sent.is_auto_rerun
    [widget] = sent.widget_states.widgets
    assert widget.id == "$$STREAMLIT_INTERNAL_KEY_$$ID-abc-cls_follow_view__events"
    assert widget.json_trigger_value == '[{"event":"moved","value":5}]'  # JSON.stringify's
