"""The load benchmark's pieces that need no server: the headless visitor's protocol on messages recorded
from the real app, failures as visitor errors, and the figures."""

from __future__ import annotations

import argparse
import asyncio
import math
import socket

import pytest
from streamlit.proto.Alert_pb2 import Alert
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

from bench.load_bench import Think, click_through, link_for, open_or_fail, parse_think, percentile
from bench.streamlit_client import Visitor, VisitorError, button_in, error_in, rerun_message, tokens_in

# Recorded from `streamlit run app.py` (Streamlit 1.67) opened on a share link: the Step button's
# delta inside the workspace fragment, the "Press Step" info box, and the address-bar update.
STEP_BUTTON = bytes.fromhex(
    "0a2037373235396638643339323733323836626533383930616133633330626236371228120400030000222063343439"
    "643265343038373265383065383932383839656639326564326536372a9b011a779a016f0a2d242449442d3761393533"
    "3034326134333735303939616262363262653063303635323762302d73745f73746570120453746570222f4f6e652074"
    "6f6b656e3a20666f727761726420706173732c2073616d706c652c20617070656e642c20636865636b2e3a077072696d"
    "617279d20302100142203166663030623863633433323438373762393138326637393438353433373538")
INFO_BOX = bytes.fromhex(
    "0a203861333335393830613139623833626532613364303061303132323465653934122a120600030200000022206334"
    "3439643265343038373265383065383932383839656639326564326536372ab5011a9001f2018c010a83015072657373"
    "202a2a537465702a2a3a2074686520666972737420666f72776172642070617373207265616473207468652077686f6c"
    "652070726f6d7074206174206f6e6365202870726566696c6c2920616e642067697665732074686520646973747269627574"
    "696f6e20666f7220746865206669727374206e657720746f6b656e2e10032202080142203932323866356231386132656339"
    "633138363261333162383631326366306235")


def recorded(data: bytes) -> ForwardMsg:
    msg = ForwardMsg()
    msg.ParseFromString(data)
    return msg


def test_the_step_button_is_found_by_its_key_with_the_fragment_it_reruns():
    button = button_in(recorded(STEP_BUTTON), "st_step")
    assert button is not None
    assert button.widget_id == "$$ID-7a953042a4375099abb62be0c06527b0-st_step"
    assert button.fragment_id == "1ff00b8cc4324877b9182f7948543758"
    assert not button.disabled
    assert button_in(recorded(STEP_BUTTON), "step") is None  # a key is matched whole
    assert button_in(recorded(INFO_BOX), "st_step") is None


def test_a_click_is_a_fragment_rerun_with_the_buttons_trigger_and_the_current_link():
    sent = rerun_message("prompt=Hi&tokens=5", "pagehash", fragment_id="frag", trigger_id="$$ID-x-st_step",
                         cached_hashes=("h1", "h2"), url="http://127.0.0.1:1/?prompt=Hi")
    msg = BackMsg()
    msg.ParseFromString(sent.SerializeToString())
    assert msg.WhichOneof("type") == "rerun_script"
    state = msg.rerun_script
    assert (state.query_string, state.page_script_hash, state.fragment_id) == ("prompt=Hi&tokens=5", "pagehash", "frag")
    assert [(w.id, w.trigger_value) for w in state.widget_states.widgets] == [("$$ID-x-st_step", True)]
    assert list(state.cached_message_hashes) == ["h1", "h2"]
    opening = rerun_message("prompt=Hi").rerun_script
    assert not opening.fragment_id and not opening.widget_states.widgets and not opening.page_script_hash


def test_an_info_box_is_not_an_error_but_an_exception_or_a_warning_is():
    assert error_in(recorded(INFO_BOX)) is None
    warning = recorded(INFO_BOX)
    warning.delta.new_element.alert.format = Alert.WARNING
    assert error_in(warning).startswith("Press **Step**")
    exception = ForwardMsg()
    exception.delta.new_element.exception.type = "RuntimeError"
    exception.delta.new_element.exception.message = "boom"
    assert error_in(exception) == "RuntimeError: boom"


def test_tokens_are_read_from_the_share_link_with_forced_marks_dropped():
    assert tokens_in("prompt=a&tokens=7042%2C30%21%2C5") == [7042, 30, 5]
    assert tokens_in("prompt=a&seed=1") == []


def test_a_reference_to_a_kept_message_is_replaced_by_it_and_an_unknown_one_fails():
    visitor = Visitor(connection=None, url="", query_string="", timeout=1.0)
    big = recorded(STEP_BUTTON)
    big.metadata.cacheable = True
    visitor._resolve(big)
    reference = ForwardMsg(ref_hash=big.hash)
    reference.metadata.delta_path.extend([0, 9])
    resolved = visitor._resolve(reference)
    assert button_in(resolved, "st_step") is not None
    assert list(resolved.metadata.delta_path) == [0, 9]  # the reference's own place
    with pytest.raises(VisitorError, match="never kept"):
        visitor._resolve(ForwardMsg(ref_hash="unknown"))


def test_kept_messages_age_out_after_the_servers_message_age():
    visitor = Visitor(connection=None, url="", query_string="", timeout=1.0, _max_age=2)
    kept = recorded(STEP_BUTTON)
    kept.metadata.cacheable = True
    visitor._resolve(kept)
    visitor._age_cache(("another fragment",))
    visitor._age_cache(("another fragment",))
    visitor._age_cache(("another fragment",))
    assert kept.hash in visitor._cache  # other fragments' runs leave it alone
    for _ in range(3):
        visitor._age_cache(())
    assert kept.hash not in visitor._cache


def test_percentiles_are_nearest_rank_and_think_ranges_are_checked():
    values = [float(v) for v in range(1, 21)]
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 100)) == (10.0, 19.0, 20.0)
    assert math.isnan(percentile([], 50))
    assert parse_think("0.5-1.5") == Think(0.5, 1.5) and parse_think("0") == Think(0.0, 0.0)
    with pytest.raises(argparse.ArgumentTypeError, match="low before high"):
        parse_think("2-1")


def test_a_page_that_cannot_be_opened_is_a_visitors_error_not_a_crash():
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    failed = asyncio.run(open_or_fail(f"http://127.0.0.1:{port}", link_for(0, 4)))
    assert isinstance(failed, str) and failed.startswith("the page did not open")
    run = asyncio.run(click_through(0, failed, clicks=4, think=Think(0, 0)))
    assert run.errors == (failed,) and run.tokens == () and run.latencies == ()
