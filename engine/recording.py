"""A generation as one web page that needs no server: a recording to hand out after a class.

`recording_html` writes one self-contained HTML file (its style, its script and the trace inline:
no network, no CDN) that replays a recorded generation step by step, with Step / Back / Reset
buttons and a presenter remote's keys. For each step it shows the context chips, the distribution
(raw softmax and the final sampling distribution, labelled) with the pick, the sampler's stages and
the draw, the termination check and the KV cache's growth. Every number is the trace's own
(`engine/trace.py`): the script only formats them. The page follows the reader's light or dark
setting and says which model, settings and seed made it, and that it is a recording.

The file carries the trace, so the app takes it back (`parse_trace` reads a recording as it reads
the trace's JSON) and replays the generation live, exactly. A Generation's recording is written
by `engine/trace.py` (`generation_recording`, `save_recording`), which makes its trace.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from engine.errors import TraceError

RECORDING_ID = "tbt-recording"  # the script element that carries the trace
PAGE_FILE = Path(__file__).with_name("recording_page.html")  # the page: its style and its player
_RECORDING = re.compile(
    r'<script type="application/json" id="' + RECORDING_ID + r'">(.*?)</script>', re.DOTALL)


def trace_from_recording(text: str) -> dict[str, Any]:
    """The trace a recording carries. Raises TraceError for a page that carries none."""
    found = _RECORDING.search(text)
    if found is None:
        raise TraceError("This web page carries no Token by Token recording (no trace inside it).")
    try:
        payload = json.loads(found.group(1))
    except json.JSONDecodeError as exc:
        raise TraceError(f"The recording's trace is not valid JSON: {exc.msg} (line {exc.lineno}).") from exc
    if not isinstance(payload, dict) or not isinstance(payload.get("trace"), dict):
        raise TraceError("The recording holds no trace.")
    return payload["trace"]


def _inline_json(value: object) -> str:
    """JSON safe inside a <script> element: no '<' can close it or open a comment."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


def recording_html(trace: dict[str, Any], prompt_pieces: list[dict[str, Any]], share_query: str | None = None
                   ) -> str:
    """The recording of `trace` as one HTML page. `prompt_pieces`: the prompt's tokens as
    {"text", "special"} (the trace keeps their ids only); `share_query`: the share link's query
    string, named on the page so a reader with a server can open the same state there."""
    model = trace.get("model") or {}
    title = f"Token by Token recording: {str(trace.get('prompt', ''))[:60]}"
    payload = {"trace": trace, "prompt_pieces": prompt_pieces, "share_query": share_query}
    values = {"TITLE": html.escape(title), "MODEL": html.escape(str(model.get("name", "a model"))),
              "ID": RECORDING_ID, "DATA": _inline_json(payload)}
    # one pass: a prompt that spells a placeholder stays as it is
    return re.sub(r"__(TITLE|MODEL|ID|DATA)__", lambda found: values[found.group(1)],
                  PAGE_FILE.read_text(encoding="utf-8"))
