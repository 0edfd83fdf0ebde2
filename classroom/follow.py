"""A student's page hears that its room moved on the moment it does: a long poll of the room's version.

    GET /rooms/<code>/version?token=<t>&after=<n>

answers `{"version": v, "view": html}` at once when the room's version v is above n; otherwise it
holds the request until the room's next version (or `hold_s`, then it answers the version as it
is). `view` is what every student sees of that version above their own controls (the context, the
text so far: the same for all, built once per version by `view_of`), so the page shows the step
the moment the answer lands, and then reruns its own fragment for the controls that are each
student's own (their guess field, their score). `token` is the room's code signed with a key this process drew at start
(`follow_token`): the page is given it with the room, so the endpoint cannot be used to try codes
past the join form's slow-down, and a wrong code, a wrong token and a room that expired all get
the same 404. Held requests are capped per room and in all (`FollowLimits`); one over the cap is
answered 429 at once and its page keeps its slower timer.

`FollowApp` is a plain ASGI application; `serve` runs it with uvicorn (Streamlit's own server) on
its own event loop in a daemon thread, so a held request costs no thread and the Streamlit server's
loop never waits for one (ui/server/follow_endpoint.py starts it, once per process). The rooms tell
it about a new version from any thread with `announce(code)`. No Streamlit here.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import re
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from engine import SettingsError

PATH = re.compile(r"/rooms/([A-Z0-9]{1,16})/version")
NOT_FOUND = b'{"version": null}'  # the same for a wrong code, a wrong token and an expired room
TOKEN_CHARS = 22  # 132 bits of the HMAC
KEPT_ANSWERS = 64  # rooms whose latest answer is kept encoded (one per room: every student gets the same)
START_WAIT_S = 5.0  # for uvicorn to take its socket


@dataclass(frozen=True)
class FollowLimits:
    """What held requests may cost. A page over a cap follows with its timer instead."""

    hold_s: float = 25.0  # below the usual 30-60 s idle timeouts of proxies
    per_room: int = 100  # held at once for one room (set to the room's student cap)
    total: int = 500  # held at once in all: each is an open socket, and file descriptors run out first

    def __post_init__(self) -> None:
        if not 0 < self.hold_s <= 120:
            raise SettingsError("hold_s", self.hold_s, "seconds above 0, at most 120")
        for name in ("per_room", "total"):
            if (value := getattr(self, name)) < 1:
                raise SettingsError(name, value, "a whole number >= 1")


def follow_token(key: bytes, code: str) -> str:
    """The token a room's pages poll with: its code signed with this process's key."""
    digest = hmac.new(key, code.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode()[:TOKEN_CHARS]


class RoomWaits:
    """Who is waiting for which room's next version, on one asyncio loop (not thread-safe: the
    app calls `moved` on its loop)."""

    def __init__(self, limits: FollowLimits) -> None:
        self.limits = limits
        self.held: dict[str, int] = {}
        self._next: dict[str, asyncio.Event] = {}

    @property
    def total(self) -> int:
        return sum(self.held.values())

    def admit(self, code: str) -> bool:
        """Count one more held request for `code`, unless a cap is reached."""
        if self.held.get(code, 0) >= self.limits.per_room or self.total >= self.limits.total:
            return False
        self.held[code] = self.held.get(code, 0) + 1
        return True

    def release(self, code: str) -> None:
        self.held[code] -= 1
        if not self.held[code]:
            del self.held[code]
            self._next.pop(code, None)

    def moved(self, code: str) -> None:
        """The room has a new version: wake everyone waiting for it."""
        if (event := self._next.pop(code, None)) is not None:
            event.set()

    async def next_version(self, code: str, timeout: float) -> None:
        """Until the room's next `moved`, or `timeout` seconds."""
        event = self._next.setdefault(code, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    retry_after: int | None = None


ViewOf = Callable[[str], tuple[int, str] | None]  # code -> (version, the students' view of it), or None


class FollowApp:
    """The long poll as an ASGI application. `version_of(code)` is the open room's version, or
    None; `view_of(code)`, when given, its current version with the view every student is shown
    of it (both called on the app's loop: they must be quick)."""

    def __init__(self, version_of: Callable[[str], int | None], key: bytes, limits: FollowLimits,
                 view_of: ViewOf | None = None) -> None:
        self.version_of, self.key, self.limits, self.view_of = version_of, key, limits, view_of
        self.waits = RoomWaits(limits)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._answers: OrderedDict[str, tuple[int, bytes]] = OrderedDict()  # code -> its latest answer

    def announce(self, code: str) -> None:
        """A room has a new version (from any thread; it never blocks)."""
        if (loop := self._loop) is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.waits.moved, code)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":  # lifespan and websockets: not served
            return
        self._loop = asyncio.get_running_loop()
        reply = await self._answer(scope, receive)
        if reply is not None:
            await send({"type": "http.response.start", "status": reply.status, "headers": _headers(scope, reply)})
            await send({"type": "http.response.body", "body": reply.body})

    async def _answer(self, scope: dict, receive: Callable) -> Reply | None:
        """The reply to one request; None when the client left while it was held."""
        if scope["method"] != "GET":
            return Reply(405, b"{}")
        found = PATH.fullmatch(scope["path"])
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        code = found.group(1) if found else ""
        if not (code and hmac.compare_digest(query.get("token", [""])[0].encode(),
                                                 follow_token(self.key, code).encode())):
            return Reply(404, NOT_FOUND)
        after = _whole(query.get("after", ["-1"])[0])
        if after is None:
            return Reply(400, b"{}")
        if (version := self.version_of(code)) is None:
            return Reply(404, NOT_FOUND)
        if version > after:
            return self._news(code, version)
        if not self.waits.admit(code):
            return Reply(429, b"{}", retry_after=10)
        try:
            return await _first_of(self._held(code, after), _client_gone(receive))
        finally:
            self.waits.release(code)

    async def _held(self, code: str, after: int) -> Reply:
        """Wait for a version above `after`, at most `hold_s`; then the version as it is."""
        deadline = asyncio.get_running_loop().time() + self.limits.hold_s
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            version = self.version_of(code)
            if version is None:
                return Reply(404, NOT_FOUND)
            if version > after:
                return self._news(code, version)
            await self.waits.next_version(code, left)
        version = self.version_of(code)
        return Reply(404, NOT_FOUND) if version is None else _version(version)

    def _news(self, code: str, version: int) -> Reply:
        """The room's new version, with the view of it: encoded once, however many students ask."""
        if (kept := self._answers.get(code)) is not None and kept[0] == version:
            self._answers.move_to_end(code)
            return Reply(200, kept[1])
        found = self.view_of(code) if self.view_of is not None else None
        if found is None or found[0] < version:  # no view (or an older one): the number alone
            return _version(version)
        body = json.dumps({"version": found[0], "view": found[1]}).encode()
        self._answers[code] = (found[0], body)
        self._answers.move_to_end(code)
        while len(self._answers) > KEPT_ANSWERS:
            self._answers.popitem(last=False)
        return Reply(200, body)


def _version(version: int) -> Reply:
    """The version alone: a page held to the end with no news, or with no view to send."""
    return Reply(200, json.dumps({"version": version}).encode())


def _whole(text: str) -> int | None:
    """`after` as a number (-1 and up: -1 asks for any version); None when it is not one."""
    if not re.fullmatch(r"-1|\d{1,12}", text):
        return None
    return int(text)


async def _client_gone(receive: Callable) -> None:
    """Returns when the client closes the connection (it sends no body)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _first_of(answer, gone) -> Reply | None:
    """The answer, or None if the client went first; the other is cancelled."""
    answering, leaving = asyncio.ensure_future(answer), asyncio.ensure_future(gone)
    done, pending = await asyncio.wait({answering, leaving}, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    return answering.result() if answering in done else None


def _headers(scope: dict, reply: Reply) -> list[tuple[bytes, bytes]]:
    """JSON, never cached; readable by the app's page (a page on the same host, on another port)."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(reply.body)).encode()),
               (b"cache-control", b"no-store"), (b"vary", b"origin")]
    if reply.retry_after is not None:
        headers.append((b"retry-after", str(reply.retry_after).encode()))
    given = dict(scope.get("headers", []))
    origin = given.get(b"origin", b"").decode("latin-1")
    host = given.get(b"host", b"").decode("latin-1")
    if origin and _hostname(origin) and _hostname(origin) == _hostname("//" + host):
        headers.append((b"access-control-allow-origin", origin.encode("latin-1")))
    return headers


def _hostname(url: str) -> str | None:
    try:
        return urlsplit(url).hostname
    except ValueError:
        return None


def serve(app: FollowApp, sock: socket.socket):
    """Serve `app` on the bound `sock` with uvicorn, in a daemon thread (it goes with the
    process); returns the uvicorn.Server once it listens (`should_exit = True` stops it)."""
    import uvicorn  # loaded only where a class is followed

    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="class-follow", daemon=True).start()
    deadline = time.monotonic() + START_WAIT_S
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    return server
