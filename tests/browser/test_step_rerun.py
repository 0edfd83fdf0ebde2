"""What a Step click sends, read off the websocket as the browser receives it: the workspace's
elements and nothing else. The sampler controls beside it are not drawn again, the branch
candidates are one widget, and so is the switch between the detail views (every element of a
Step's rerun costs the shared server CPU)."""

from __future__ import annotations

import asyncio
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

from bench.load_bench import STEP_KEY, link_for, open_visitor

pytestmark = pytest.mark.browser


def element_kind(msg: ForwardMsg) -> str | None:
    """An element's type, or "block:" and a block's (a container, a column, a tab)."""
    if msg.WhichOneof("type") != "delta":
        return None
    delta = msg.delta
    if delta.WhichOneof("type") == "add_block":
        return f"block:{delta.add_block.WhichOneof('type')}"
    return delta.new_element.WhichOneof("type") if delta.WhichOneof("type") == "new_element" else None


async def elements_of_a_step(url: str) -> Counter:
    visitor = await open_visitor(url, link_for(0, 4))
    kinds: Counter = Counter()
    receive = visitor._receive

    async def recording(deadline: float) -> ForwardMsg:
        msg = await receive(deadline)
        if kind := element_kind(msg):
            kinds[kind] += 1
        return msg

    try:
        await visitor.click(STEP_KEY)  # the first step: the branch pills appear
        kinds.clear()
        visitor._receive = recording
        run = await visitor.click(STEP_KEY)
        assert run.errors == ()
        return kinds
    finally:
        await visitor.close()


def test_a_step_redraws_the_workspace_but_not_the_sampler_controls(app_url) -> None:
    with ThreadPoolExecutor(max_workers=1) as pool:  # beside any other test's event loop
        kinds = pool.submit(asyncio.run, elements_of_a_step(app_url)).result(timeout=300)
    assert kinds["plotly_chart"] == 1  # the new distribution
    assert kinds["slider"] == 0 and kinds["selectbox"] == 0  # the controls stay as they are
    assert kinds["button"] == 4  # Step, Run, Back, Reset: no button per candidate
    assert kinds["button_group"] == 3  # the chart's scale, the branch pills, the detail views' switch
    assert kinds["block:tab_container"] == 0 and kinds["block:tab"] == 0  # no block per detail view
