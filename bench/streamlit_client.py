"""A headless Streamlit visitor: it speaks the app's websocket protocol the way Streamlit's
browser frontend does (1.67), renders nothing, and times each rerun it asks for.

What it mirrors from the frontend (the ClientState message in streamlit/proto/BackMsg and the
frontend bundle's `sendRerunBackMsg`):

- It connects to ws://HOST:PORT/_stcore/stream with the subprotocol "streamlit". It sends no
  Origin header, so the server asks for no XSRF token (starlette_websocket.py).
- Its first message is a `rerun_script` carrying the page's query string (a share link) and an
  empty page_script_hash and page_name (the default page, as for the URL "/").
- Every later rerun carries the address bar's current query string (the server's
  `page_info_changed` rewrites it, and the browser sends it back), the page_script_hash from
  the last `new_session`, the hashes of the messages it has cached, and its context_info.
- A click is a rerun whose widget_states hold that button's id with trigger_value true; a
  button drawn inside an st.fragment carries the fragment's id (Delta.fragment_id), and the
  click then reruns that fragment alone (ClientState.fragment_id).
- Cacheable messages are kept by hash and a `ref_hash` message is replaced by the kept one;
  entries age out after `max_cached_message_age` runs, as in the frontend's ForwardMsgCache.

- A fragment drawn with `run_every` arrives as an `auto_rerun` message (its fragment id and
  interval); the frontend then reruns that fragment on the interval with is_auto_rerun set.
  `auto_reruns` keeps what the page asked for and `auto_rerun` sends one such rerun, so a
  caller drives the fragment's timer itself (bench/class_bench.py).
- A browser does not wait for one run before asking for the next (a follower's timer fires
  while its guess's run is under way) and draws whatever arrives: `listen` reads every run as
  it ends, and the `send_*` methods send a rerun without waiting for it.
- A page may be opened by its URL path (`page_name`, as the frontend sends it for /class); later
  reruns name the page the last `navigation` message said is shown, as the frontend does.
- `type_text` sends a text field's new value as the browser does when the field loses focus;
  `value_message` any other keyed input's (a number, a toggle, a pill picked: `widgets` keeps each
  as the last run drew it, and `RunResult.drawn` names those a run drew).
- A visitor may carry a `cookie` (Streamlit's XSRF cookie, by which the app knows a browser again),
  sent with the websocket's handshake as a browser sends its cookies. When the server goes away,
  `reconnect` does what the frontend does once the server's health check answers again: a new
  connection with the same cookie, and a rerun of the whole page with the address bar's query
  string (ConnectionManager and App.handleConnectionStateChanged in the frontend bundle).
- A components-v2 element (`st.components.v2.component`) is kept by name with the data it was last
  drawn with (`components`); its script's `setTriggerValue(event, value)` is a rerun of the
  element's fragment whose widget_states hold the element's trigger widget,
  "$$STREAMLIT_INTERNAL_KEY_<element id>__events", with json_trigger_value the JSON list
  [{"event": ..., "value": ...}] (the frontend's WidgetStateManager.setTriggerValue):
  `trigger_message` builds it.

A rerun's widget_states carry the clicked button's trigger and the value this visitor last gave
each input still on its page. The browser sends every input's value with every rerun; the server
holds the untouched ones' from the previous run, so the script sees the same. The values given
must travel again, as the browser's do: the server folds a rerun that has not started yet into a
later one (a fragment's timer, say) and keeps only the later one's values (ScriptRequests), so a
value sent once could be dropped.

Where a run ends: the server opens each run with a `new_session` whose metadata.run names the
run (script_run_id, and the fragment ids for a fragment run) and closes it with a
`script_finished` carrying the same script_run_id. A rerun's latency here is from sending its
BackMsg to receiving that `script_finished`: every delta of the run has arrived by then (the
browser has yet to draw them, which is the browser's cost, not the server's).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qs

from streamlit.proto.Alert_pb2 import Alert
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from websockets.asyncio.client import ClientConnection, connect

STREAM_PATH = "/_stcore/stream"
FINISHED_OK = (ForwardMsg.FINISHED_SUCCESSFULLY, ForwardMsg.FINISHED_FRAGMENT_RUN_SUCCESSFULLY)
# the frontend's default when new_session names no age
DEFAULT_MAX_MESSAGE_AGE = 2
TRIGGER_WIDGET = "$$STREAMLIT_INTERNAL_KEY_{id}__events"  # a v2 component's trigger widget (bidi_component/main.py)
RETIRED_KEPT = 64  # aged-out messages kept for a reference already on its way


class VisitorError(RuntimeError):
    """The server did not answer a visitor's rerun as a browser would expect."""


@dataclass(frozen=True)
class ButtonInfo:
    """A button as the last run drew it."""

    widget_id: str
    fragment_id: str  # "" outside a fragment
    disabled: bool


@dataclass(frozen=True)
class ComponentInfo:
    """A components-v2 element as the last run drew it."""

    element_id: str
    fragment_id: str  # "" outside a fragment
    data: object  # what the element was given (its JSON data)


@dataclass(frozen=True)
class RunResult:
    """One rerun as the visitor saw it."""

    seconds: float  # from sending the BackMsg to receiving the run's script_finished
    errors: tuple[str, ...]  # exception elements and error/warning alerts the run drew
    texts: tuple[str, ...] = ()  # the bodies of the markdown, HTML and code elements the run drew
    drawn: tuple[str, ...] = ()  # the keys of the input widgets the run drew (see `Visitor.widgets`)
    began: float = 0.0  # when its new_session arrived (time.perf_counter): the run started no later


@dataclass(frozen=True)
class WidgetInfo:
    """A keyed input widget as the last run drew it."""

    widget_id: str
    fragment_id: str  # "" outside a fragment
    kind: str  # the element's type: "text_input", "number_input", "checkbox" (a toggle too), "button_group" ...
    options: tuple[str, ...] = ()  # a button group's labels (st.pills): a pick sends its label back


def rerun_message(query_string: str, page_script_hash: str = "", *, fragment_id: str = "",
                  trigger_id: str | None = None, cached_hashes: tuple[str, ...] = (), url: str = "",
                  page_name: str = "", auto: bool = False, text: tuple[str, str] | None = None,
                  json_trigger: tuple[str, str] | None = None, values: tuple[tuple[str, str, object], ...] = ()
                  ) -> BackMsg:
    """The BackMsg the browser sends to (re)run the page, or one fragment of it for a click, a
    fragment's timer (`auto`), a text field's new value (`text`: its widget id and value) or a
    component's trigger (`json_trigger`: its trigger widget's id and JSON value), with the inputs'
    values (`values`: each its widget id, the WidgetState field that carries it, the value)."""
    msg = BackMsg()
    state = msg.rerun_script
    state.query_string = query_string
    state.page_script_hash = page_script_hash
    state.page_name = page_name
    state.fragment_id = fragment_id
    state.is_auto_rerun = auto
    if text is not None:
        widget = state.widget_states.widgets.add()
        widget.id, widget.string_value = text
    if json_trigger is not None:
        widget = state.widget_states.widgets.add()
        widget.id, widget.json_trigger_value = json_trigger
    for widget_id, carrier, value in values:
        widget = state.widget_states.widgets.add()
        widget.id = widget_id
        if carrier == "string_array_value":
            widget.string_array_value.data.extend(value)
        else:
            setattr(widget, carrier, value)
    state.cached_message_hashes.extend(cached_hashes)
    if trigger_id is not None:
        widget = state.widget_states.widgets.add()
        widget.id = trigger_id
        widget.trigger_value = True
    info = state.context_info
    info.timezone, info.timezone_offset, info.locale = "UTC", 0, "en-US"
    info.url, info.is_embedded, info.color_scheme = url, False, "light"
    return msg


def button_in(msg: ForwardMsg, key: str) -> ButtonInfo | None:
    """The button with this widget key if `msg` draws it (a keyed widget's id ends in -key)."""
    if msg.WhichOneof("type") != "delta" or msg.delta.WhichOneof("type") != "new_element":
        return None
    element = msg.delta.new_element
    if element.WhichOneof("type") != "button" or not element.button.id.endswith(f"-{key}"):
        return None
    return ButtonInfo(element.button.id, msg.delta.fragment_id, element.button.disabled)


def text_field_in(msg: ForwardMsg) -> tuple[str, str, str] | None:
    """(its key, widget id, fragment id) of a keyed text field `msg` draws, or None."""
    if msg.WhichOneof("type") != "delta" or msg.delta.WhichOneof("type") != "new_element":
        return None
    element = msg.delta.new_element
    if element.WhichOneof("type") != "text_input" or "-" not in element.text_input.id:
        return None
    return element.text_input.id.rsplit("-", 1)[-1], element.text_input.id, msg.delta.fragment_id


VALUE_FIELDS = {"text_input": "string_value", "text_area": "string_value", "checkbox": "bool_value",
                "button_group": "string_array_value", "number_input": "int_value"}  # a float's: double_value


def widget_in(msg: ForwardMsg) -> tuple[str, WidgetInfo] | None:
    """(its key, the widget) of a keyed input widget `msg` draws (a keyed widget's id ends in -key)."""
    if msg.WhichOneof("type") != "delta" or msg.delta.WhichOneof("type") != "new_element":
        return None
    element = msg.delta.new_element
    kind = element.WhichOneof("type")
    if kind not in VALUE_FIELDS or "-" not in getattr(element, kind).id:
        return None
    widget = getattr(element, kind)
    options = tuple(option.content for option in widget.options) if kind == "button_group" else ()
    return widget.id.rsplit("-", 1)[-1], WidgetInfo(widget.id, msg.delta.fragment_id, kind, options)


def component_in(msg: ForwardMsg) -> tuple[str, ComponentInfo] | None:
    """(its name, the element) of a components-v2 element `msg` draws, or None."""
    if msg.WhichOneof("type") != "delta" or msg.delta.WhichOneof("type") != "new_element":
        return None
    element = msg.delta.new_element
    if element.WhichOneof("type") != "bidi_component":
        return None
    bidi = element.bidi_component
    data = bidi.json or bidi.mixed.json
    return bidi.component_name, ComponentInfo(bidi.id, msg.delta.fragment_id, json.loads(data) if data else None)


def text_in(msg: ForwardMsg) -> str | None:
    """The body of a markdown, HTML or code element `msg` draws."""
    if msg.WhichOneof("type") != "delta" or msg.delta.WhichOneof("type") != "new_element":
        return None
    element = msg.delta.new_element
    kind = element.WhichOneof("type")
    return {"markdown": element.markdown.body, "html": element.html.body, "code": element.code.code_text}.get(kind)


def error_in(msg: ForwardMsg) -> str | None:
    """What a visitor would read as an error: an exception element, or an error or warning box."""
    if msg.WhichOneof("type") != "delta" or msg.delta.WhichOneof("type") != "new_element":
        return None
    element = msg.delta.new_element
    kind = element.WhichOneof("type")
    if kind == "exception":
        return f"{element.exception.type}: {element.exception.message}"
    if kind == "alert" and element.alert.format in (Alert.ERROR, Alert.WARNING):
        return element.alert.body
    return None


def tokens_in(query_string: str) -> list[int]:
    """The token ids of a share link's `tokens` parameter (a forced token is marked '!')."""
    values = parse_qs(query_string).get("tokens", [""])
    return [int(token.rstrip("!")) for token in values[-1].split(",") if token]


@dataclass
class _Cached:
    msg: ForwardMsg
    run: int  # the run count when it was last delivered or referred to
    fragment_id: str


@dataclass
class Visitor:
    """One browser tab's session, without the browser. Use `Visitor.open`, then `click`."""

    connection: ClientConnection
    url: str
    query_string: str
    timeout: float
    page_script_hash: str = ""
    page_name: str = ""
    buttons: dict[str, ButtonInfo] = field(default_factory=dict)
    text_fields: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (widget id, fragment id)
    auto_reruns: dict[str, float] = field(default_factory=dict)  # fragment id -> seconds between its reruns
    components: dict[str, ComponentInfo] = field(default_factory=dict)  # component name -> as last drawn
    widgets: dict[str, WidgetInfo] = field(default_factory=dict)  # key -> as last drawn
    errors: list[str] = field(default_factory=list)
    cookie: str = ""  # the Cookie header the browser sends ("" none)
    _cache: dict[str, _Cached] = field(default_factory=dict)
    # aged out, still resolvable: a rerun sent while another ran listed them, and the server may
    # refer to them in its answer (only with `send`, which does not wait; a browser keeps them too)
    _retired: dict[str, _Cached] = field(default_factory=dict)
    _runs: int = 0
    _max_age: int = DEFAULT_MAX_MESSAGE_AGE
    _given: dict[str, tuple[str, str, object]] = field(default_factory=dict)  # key -> the value this visitor gave it
    _on_page: set[str] = field(default_factory=set)  # keys of the inputs the page shows now

    @classmethod
    async def open(cls, base_url: str, query_string: str, *, timeout: float = 120.0,
                   button_keys: tuple[str, ...] = (), page_name: str = "", cookie: str = "") -> Visitor:
        """Connect and run the page once, as a browser opening `base_url/page_name?query_string`
        (with `cookie`, the Cookie header a browser that was here before sends)."""
        visitor = cls(await _connect(base_url, cookie, timeout), f"{base_url}/{page_name}?{query_string}",
                      query_string, timeout, page_name=page_name, cookie=cookie)
        await visitor.rerun(rerun_message(query_string, url=visitor.url, page_name=page_name), button_keys)
        return visitor

    async def reconnect(self, button_keys: tuple[str, ...] = ()) -> RunResult:
        """After the server went away: connect again (the same cookie) and rerun the whole page as
        the address bar has it, as the frontend does; returns that run. What the old session drew
        is forgotten (its buttons, timers and inputs); the kept messages stay, as in the browser."""
        base_url = self.url.split("?", 1)[0].removesuffix(f"/{self.page_name}")
        self.connection = await _connect(base_url, self.cookie, self.timeout)
        self.buttons.clear()
        self.auto_reruns.clear()
        self.widgets.clear()
        msg = rerun_message(self.query_string, self.page_script_hash, cached_hashes=tuple(self._cache), url=self.url,
                            page_name=self.page_name, values=self._values())
        return await self.rerun(msg, button_keys)

    async def click(self, key: str) -> RunResult:
        """Click the button with this widget key, as the browser does, and wait for its run."""
        button = self.buttons.get(key)
        if button is None:
            raise VisitorError(f"no button with key '{key}' on the page")
        if button.disabled:
            raise VisitorError(f"the button '{key}' is disabled")
        msg = rerun_message(self.query_string, self.page_script_hash, fragment_id=button.fragment_id,
                            trigger_id=button.widget_id, cached_hashes=tuple(self._cache), url=self.url,
                            values=self._values())
        return await self.rerun(msg, (key,))

    async def auto_rerun(self, fragment_id: str) -> RunResult:
        """One tick of a `run_every` fragment's timer, as the frontend sends it, and its run."""
        return await self.rerun(self.auto_rerun_message(fragment_id))

    async def type_text(self, key: str, value: str) -> RunResult:
        """Type `value` into the text field with this key (as the browser sends it on blur)."""
        return await self.rerun(self.text_message(key, value))

    def auto_rerun_message(self, fragment_id: str) -> BackMsg:
        return rerun_message(self.query_string, self.page_script_hash, fragment_id=fragment_id, auto=True,
                             cached_hashes=tuple(self._cache), url=self.url, values=self._values())

    def trigger_message(self, component: str, event: str, value: object) -> BackMsg:
        """What the browser sends when the component's script calls setTriggerValue(event, value)."""
        info = self.components[component]
        payload = json.dumps([{"event": event, "value": value}], separators=(",", ":"))  # as JSON.stringify
        trigger = (TRIGGER_WIDGET.format(id=info.element_id), payload)
        return rerun_message(self.query_string, self.page_script_hash, fragment_id=info.fragment_id,
                             cached_hashes=tuple(self._cache), url=self.url, json_trigger=trigger,
                             values=self._values())

    def value_message(self, key: str, value: object) -> BackMsg:
        """What the browser sends when the input with this key gets `value` (a pill's label, in a list)."""
        info = self.widgets.get(key)
        if info is None:
            raise VisitorError(f"no input with key '{key}' on the page")
        carrier = "double_value" if isinstance(value, float) else VALUE_FIELDS[info.kind]
        return rerun_message(self.query_string, self.page_script_hash, fragment_id=info.fragment_id,
                             cached_hashes=tuple(self._cache), url=self.url,
                             values=self._values(key, (info.widget_id, carrier, value)))

    def text_message(self, key: str, value: str) -> BackMsg:
        if key not in self.text_fields:
            raise VisitorError(f"no text field with key '{key}' on the page")
        widget_id, fragment_id = self.text_fields[key]
        return rerun_message(self.query_string, self.page_script_hash, fragment_id=fragment_id,
                             cached_hashes=tuple(self._cache), url=self.url,
                             values=self._values(key, (widget_id, "string_value", value)))

    def _values(self, key: str | None = None, given: tuple[str, str, object] | None = None
                ) -> tuple[tuple[str, str, object], ...]:
        """What the browser sends of its inputs with a rerun: the value this visitor gave each
        input still on the page (and `key`'s new one, `given`)."""
        if key is not None:
            self._given[key] = given
        return tuple(value for name, value in self._given.items() if name in self._on_page or name == key)

    def _note_page(self, drawn: list[str], fragment_ids: tuple[str, ...]) -> None:
        """The inputs on the page after a run: those it drew, and (after a fragment's run) those
        of the rest of the page. The values given to the others are dropped (the frontend's
        WidgetStateManager keeps only the inputs on the page)."""
        kept = {key for key in self._on_page if key in self.widgets and self.widgets[key].fragment_id
                not in fragment_ids} if fragment_ids else set()
        self._on_page = kept | set(drawn)
        for key in set(self._given) - self._on_page:  # an input that left the page is forgotten, as in the browser
            del self._given[key]

    async def send(self, msg: BackMsg) -> None:
        """Send a rerun without waiting for it (`listen` reads what comes back)."""
        await self.connection.send(msg.SerializeToString())

    async def listen(self, on_run, until: asyncio.Event) -> None:
        """Read every run the server sends, whoever started it, until `until` is set;
        `on_run(result)` is told as each one ends (`seconds`: since the listening began)."""
        started = time.perf_counter()
        texts, errors, drawn, began = [], [], [], started
        while not until.is_set():
            try:
                data = await asyncio.wait_for(self.connection.recv(), 0.2)
            except TimeoutError:
                continue
            msg = ForwardMsg()
            msg.ParseFromString(data)
            reply = self._resolve(msg)
            kind = reply.WhichOneof("type")
            if kind == "new_session":
                texts, errors, drawn, began = [], [], [], time.perf_counter()
            elif kind == "delta":
                self._note_delta(reply, errors, texts, drawn)
            elif kind == "page_info_changed":
                self.query_string = reply.page_info_changed.query_string
            elif kind == "script_finished":
                self._age_cache(tuple(reply.metadata.run.fragment_ids))
                if reply.script_finished == ForwardMsg.FINISHED_EARLY_FOR_RERUN:
                    continue  # a newer run replaced it, as in a browser: its elements come with that one
                if reply.script_finished not in FINISHED_OK:
                    errors.append(f"the run ended with status {reply.script_finished}")
                self.errors.extend(errors)
                self._note_page(drawn, tuple(reply.metadata.run.fragment_ids))
                on_run(RunResult(time.perf_counter() - started, tuple(errors), tuple(texts), tuple(drawn), began))

    def _note_delta(self, reply: ForwardMsg, errors: list[str], texts: list[str], drawn: list[str] | None = None
                    ) -> None:
        """What a visitor reads of one delta: an error, a text, an input to fill in (its key in `drawn`)."""
        if problem := error_in(reply):
            errors.append(problem)
        if (body := text_in(reply)) is not None:
            texts.append(body)
        if found := text_field_in(reply):
            self.text_fields[found[0]] = found[1:]
        if widget := widget_in(reply):
            self.widgets[widget[0]] = widget[1]
            if drawn is not None:
                drawn.append(widget[0])
        if element := component_in(reply):
            self.components[element[0]] = element[1]

    async def rerun(self, msg: BackMsg, button_keys: tuple[str, ...] = ()) -> RunResult:
        """Send a rerun and read until its script_finished; note the buttons it draws."""
        started = time.perf_counter()
        deadline = time.monotonic() + self.timeout
        await self.connection.send(msg.SerializeToString())
        run_id, errors, texts, drawn, began = None, [], [], [], started
        while True:
            reply = await self._receive(deadline)
            kind = reply.WhichOneof("type")
            if kind == "new_session":
                run_id, began = reply.metadata.run.script_run_id, time.perf_counter()
                self.page_script_hash = reply.new_session.page_script_hash
                self._max_age = reply.new_session.config.max_cached_message_age or DEFAULT_MAX_MESSAGE_AGE
            elif kind == "page_info_changed":
                self.query_string = reply.page_info_changed.query_string
            elif kind == "navigation":  # the page being shown: what the frontend's next rerun names
                self.page_script_hash = reply.navigation.page_script_hash
            elif kind == "auto_rerun":
                self.auto_reruns[reply.auto_rerun.fragment_id] = reply.auto_rerun.interval
            elif kind == "delta":
                self._note_delta(reply, errors, texts, drawn)
                for key in button_keys:
                    if button := button_in(reply, key):
                        self.buttons[key] = button
            elif kind == "script_finished" and run_id is not None and (
                    reply.metadata.run.script_run_id in ("", run_id)):
                if reply.script_finished == ForwardMsg.FINISHED_EARLY_FOR_RERUN:
                    run_id = None  # the page reran itself (ui/widgets/frame.py): the rerun's end is this run's end
                    continue
                seconds = time.perf_counter() - started
                self._age_cache(tuple(reply.metadata.run.fragment_ids))
                if reply.script_finished not in FINISHED_OK:
                    errors.append(f"the run ended with status {reply.script_finished}")
                self.errors.extend(errors)
                self._note_page(drawn, tuple(reply.metadata.run.fragment_ids))
                return RunResult(seconds, tuple(errors), tuple(texts), tuple(drawn), began)

    @property
    def tokens(self) -> list[int]:
        """The visitor's generated token ids, read from the share link in its address bar."""
        return tokens_in(self.query_string)

    async def close(self) -> None:
        await self.connection.close()

    async def _receive(self, deadline: float) -> ForwardMsg:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise VisitorError(f"no script_finished within {self.timeout:.0f} s")
        try:
            data = await asyncio.wait_for(self.connection.recv(), remaining)
        except TimeoutError as exc:
            raise VisitorError(f"no script_finished within {self.timeout:.0f} s") from exc
        msg = ForwardMsg()
        msg.ParseFromString(data)
        return self._resolve(msg)

    def _resolve(self, msg: ForwardMsg) -> ForwardMsg:
        """Keep cacheable messages; replace a reference by the kept message."""
        if msg.WhichOneof("type") == "ref_hash":
            if msg.ref_hash in self._retired:
                self._cache[msg.ref_hash] = self._retired.pop(msg.ref_hash)
            cached = self._cache.get(msg.ref_hash)
            if cached is None:
                raise VisitorError(f"the server referred to a message this visitor never kept ({msg.ref_hash})")
            cached.run = self._runs
            resolved = ForwardMsg()
            resolved.CopyFrom(cached.msg)
            resolved.metadata.CopyFrom(msg.metadata)
            return resolved
        if msg.metadata.cacheable and msg.hash:
            fragment_id = msg.delta.fragment_id if msg.WhichOneof("type") == "delta" else ""
            self._cache[msg.hash] = _Cached(msg, self._runs, fragment_id)
        return msg

    def _age_cache(self, fragment_ids: tuple[str, ...]) -> None:
        """After a run, forget messages unused for too many runs (in a fragment run, only that
        fragment's messages age), as the frontend's cache does."""
        self._runs += 1
        for key, cached in list(self._cache.items()):
            in_run = not fragment_ids or cached.fragment_id in fragment_ids
            if in_run and self._runs - cached.run > self._max_age:
                self._retired[key] = self._cache.pop(key)
        while len(self._retired) > RETIRED_KEPT:
            del self._retired[next(iter(self._retired))]


async def _connect(base_url: str, cookie: str, timeout: float) -> ClientConnection:
    ws_url = base_url.replace("http://", "ws://", 1) + STREAM_PATH
    # no proxy (loopback only), no pings and no size cap: a browser sends no pings either
    return await connect(ws_url, subprotocols=["streamlit"], proxy=None, ping_interval=None, max_size=None,
                         open_timeout=timeout, additional_headers={"Cookie": cookie} if cookie else None)
