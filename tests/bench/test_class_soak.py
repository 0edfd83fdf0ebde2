"""The class soak (bench/class_soak.py): the headless client's inputs as the browser sends them, the
soak's own reckoning of lost guesses and scores, and a tiny lesson on a real server whose process
is killed half-way (the bundled model loads in it)."""

from __future__ import annotations

import pytest
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

from bench.class_soak import Lesson, SentGuess, SoakStudent, lost_guesses, soak, stored_scores
from bench.streamlit_client import Visitor
from classroom.hall import context_key
from classroom.store import GuessRow


def drawn_input(kind: str, widget_id: str, fragment_id: str = "frag", options: tuple[str, ...] = ()) -> ForwardMsg:
    msg = ForwardMsg()
    msg.delta.fragment_id = fragment_id
    element = getattr(msg.delta.new_element, kind)
    element.id = widget_id
    for option in options:
        element.options.add(content=option)
    return msg


def a_visitor() -> Visitor:
    return Visitor(connection=None, url="http://h:1/class?room=X", query_string="room=X", timeout=1.0,
                   page_name="class", auto_reruns={"frag": 3.0})


def test_a_chip_is_sent_as_its_label_and_a_value_given_travels_with_every_rerun_while_its_input_is_shown():
    visitor, drawn = a_visitor(), []
    visitor._note_delta(drawn_input("button_group", "$$ID-a-cls_guess_pick_c1", options=("'x'", "'y'")), [], [], drawn)
    visitor._note_delta(drawn_input("checkbox", "$$ID-b-cls_p_st_ignore_eos", ""), [], [], drawn)
    visitor._note_page(drawn, ())
    assert drawn == ["cls_guess_pick_c1", "cls_p_st_ignore_eos"]
    assert visitor.widgets["cls_guess_pick_c1"].options == ("'x'", "'y'")
    picked = visitor.value_message("cls_guess_pick_c1", ["'y'"]).rerun_script
    [state] = picked.widget_states.widgets
    assert (picked.fragment_id, state.id, list(state.string_array_value.data)) == ("frag", "$$ID-a-cls_guess_pick_c1",
                                                                                  ["'y'"])
    toggled = visitor.value_message("cls_p_st_ignore_eos", True).rerun_script
    assert [(w.id, w.WhichOneof("value")) for w in toggled.widget_states.widgets] == [
        ("$$ID-a-cls_guess_pick_c1", "string_array_value"), ("$$ID-b-cls_p_st_ignore_eos", "bool_value")]
    # the fragment redrew without the chips (the next token's controls): the browser forgets their value
    visitor._note_page([], ("frag",))
    tick = visitor.auto_rerun_message("frag").rerun_script
    assert [w.id for w in tick.widget_states.widgets] == ["$$ID-b-cls_p_st_ignore_eos"]


def test_a_guess_missing_or_changed_in_the_store_is_lost_and_scores_count_the_revealed_steps_only():
    prompt, tokens = [1, 2], [7, 8]
    contexts = [context_key(prompt), context_key([*prompt, 7]), context_key([*prompt, 7, 8])]
    stored = [GuessRow(contexts[0], "id1", "s01", "Paris", 7), GuessRow(contexts[1], "id1", "s01", "x", 9),
              GuessRow(contexts[2], "id1", "s01", "y", 3), GuessRow(contexts[0], "id2", "s02", "a", 4)]
    lesson = Lesson(prompt, tokens, stored)
    assert stored_scores(lesson) == {"s01": (1, 2), "s02": (0, 1)}  # the guess after the last step is not revealed
    student = SoakStudent(a_visitor(), "s01")
    student, unsent = SoakStudent(a_visitor(), "s01"), SoakStudent(a_visitor(), "s02")
    student.guesses = {0: SentGuess(0, False, "Paris", sent_at=1.0),
                       1: SentGuess(1, True, "'z'", sent_at=1.0),  # stored as another token
                       2: SentGuess(2, True, "'y'", sent_at=1.0)}
    unsent.guesses = {0: SentGuess(0, False, "the")}  # never sent: not counted
    assert lost_guesses([student, unsent], lesson, 2) == ["s01 step 1: \"'z'\" stored as 'x'"]
    assert lost_guesses([student], lesson, 0) == []


@pytest.mark.model
def test_a_tiny_lesson_comes_back_whole_after_its_server_is_killed_half_way(tmp_path) -> None:
    result = soak("sqlite", 2, 4, 0.0, logs=tmp_path)
    assert result["steps"] == result["stored_tokens"] == 4
    assert result["lost_guesses"] == 0 and not result["score_mismatches"] and result["guesses_stored"] >= 10
    assert result["missed"] == result["unconfirmed"] == 0
    restart = result["restart"]
    assert restart["all_back"] and restart["tokens_kept"] and restart["lost_guesses_at_kill"] == []
    assert restart["stored_steps_after_kill"] == 2 and restart["pages_back_s"] > restart["server_start_s"] > 0
    assert result["rss_samples"] > 0
