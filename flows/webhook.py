"""The webhook receiver: a Hugging Face `repo.content` update of a tracked ref starts that commit's conversion.

An ASGI app (Starlette, which Prefect's server already brings) served by uvicorn on 127.0.0.1 by default. It checks
the shared secret (X-Webhook-Secret, compared in constant time), reads the event, and hands each tracked ref that
moved to Prefect with the same idempotency key the scheduled watcher uses (flows.watch.conversion_key): a webhook and
a watcher tick for one commit make one conversion. The pin itself is recorded by the watcher's next tick, which
finds the same run.

    401  no or wrong X-Webhook-Secret          400  not JSON, JSON nested too deeply, or not a repo update event
    404  a repo the catalog does not hold      413  a body over 1 MiB (refused as it streams in)
    500  the Prefect server has no convert/<name> deployment
    503  Prefect unreachable, or silent for DISPATCH_TIMEOUT_S (the hub resends)
    202  started (or already started) conversions, or ignored: an update of a ref no entry tracks, or a commit that
         does not descend from the pin (a stale or reordered delivery: `oldSha` is not the pin and the hub's history
         of the new commit does not hold it)
    408  the body did not arrive within the body timeout (the connection is closed)

A client that stalls cannot hold the receiver: a connection whose request headers are not all in within the header
timeout is closed, a body not all in within the body timeout is a 408, and at the connection limit a new connection
closes the oldest one that is still sending its request. The limit stays under the open-file limit, so accept()
never runs out of descriptors; what is closed this way (and any accept error) is one log line a minute, not one each.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import resource
import time
from collections.abc import Callable
from typing import Any, ClassVar

import uvicorn
from prefect.exceptions import ObjectNotFound
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

from flows.watch import start_conversion
from pipelines.core.errors import ConfigError, ModelmintError
from pipelines.core.settings import Settings
from pipelines.core.vocab import COMMIT
from pipelines.source import upstream
from pipelines.source.catalog import HubSource, load_catalog

log = logging.getLogger(__name__)

MAX_BODY = 1 << 20
DISPATCH_TIMEOUT_S = 10.0
"""How long one delivery waits for Prefect before answering 503: well inside a hub's delivery timeout, so the
hub sees a failure it resends instead of a connection it abandons (a hung API once held deliveries over 120 s)."""
HEADER_TIMEOUT_S = 10.0
"""How long a connection has to send a request's headers (from connecting, or from the previous answer on a kept-alive
connection) before it is closed."""
BODY_TIMEOUT_S = 30.0
"""How long a request's body (at most MAX_BODY) has to arrive once its headers are in: then a 408 and the connection
is closed."""
MAX_CONNECTIONS = 256
"""Open connections at most (fewer where the open-file limit leaves less room): a hub delivers one event at a time."""
BACKLOG = 64
"""The listen queue, and also how many connections asyncio accepts in one go before any of them runs
(selector_events.py `_accept_connection` loops `for _ in range(backlog)`)."""
FILES_BESIDES_CONNECTIONS = 4 * BACKLOG + 64
"""Descriptors kept free of connections: a few accept batches that arrive before the limit closes any, the listener,
the event loop, Prefect's client, catalog reads and the log."""
LOG_INTERVAL_S = 60.0
_REPO = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?", re.ASCII)
Dispatch = Callable[[str, str], Any]
"""(catalog name, commit) → the flow run Prefect made or found for it."""


class BadEvent(ValueError):
    """A body that is not a repo update event this receiver can read."""


def create_app(settings: Settings, secret: str, dispatch: Dispatch = start_conversion, *,
               body_timeout: float = BODY_TIMEOUT_S) -> Starlette:
    """The ASGI app: POST / (and /webhook) receive events; GET /healthz answers ok."""
    if not secret:
        raise ConfigError("the webhook receiver needs a shared secret",
                          hint="set MODELMINT_WEBHOOK_SECRET to the secret configured on the hub's webhook")
    expected = secret.encode()
    slow_bodies = _Tally(f"answered 408 to bodies not all in within {body_timeout:g} s")

    async def receive(request: Request) -> JSONResponse:
        given = request.headers.get("x-webhook-secret", "").encode()
        if not hmac.compare_digest(given, expected):
            return _answer(401, error="wrong or missing X-Webhook-Secret", close=True)  # its body is left unread
        try:
            body = await _read_limited(request, body_timeout)
        except _TooLarge:
            return _answer(413, error=f"body over {MAX_BODY} bytes", close=True)
        except TimeoutError:
            slow_bodies.add()
            return _answer(408, error=f"the body did not arrive within {body_timeout:g} s", close=True)
        except ClientDisconnect:  # the client went away mid-body (or the limit closed it): nobody to answer
            return _answer(400, error="the client disconnected before its body was in")
        try:
            repo, refs = parse_event(body)
        except BadEvent as err:
            return _answer(400, error=str(err))
        try:
            catalog = load_catalog(settings.catalog_path)
        except ConfigError as err:
            log.error("webhook: %s", err)
            return _answer(503, error="the catalog does not load; see the receiver's log")
        entries = [e for e in catalog.models if isinstance(e.source, HubSource) and e.source.repo == repo]
        if not entries:
            return _answer(404, error=f"{repo} is not in the catalog")
        moved = [(e.name, e.source.revision, refs[e.source.track]) for e in entries
                 if isinstance(e.source, HubSource) and e.source.track in refs
                 and refs[e.source.track][1] != e.source.revision]
        if not moved:
            return _answer(202, ignored=f"no catalog entry tracks an updated ref of {repo} at a new commit")
        wanted: list[tuple[str, str]] = []
        stale: list[tuple[str, str]] = []
        for name, pinned, (old, new) in moved:
            # ordering: a late or resent delivery of an earlier push must not build (and register) an older commit
            if pinned is None or old == pinned:
                wanted.append((name, new))
                continue
            try:
                later = await asyncio.wait_for(
                    run_in_threadpool(upstream.descends, settings, repo, pinned, new), DISPATCH_TIMEOUT_S)
            except Exception as err:  # the hub's errors, its transport's, or its silence: the hub resends
                log.error("webhook: could not read %s's history for %s@%s: %s", repo, name, new[:12],
                          str(err).splitlines()[0] if str(err) else type(err).__name__)
                return _answer(503, error=f"the hub's history of {repo} could not be read; send the event again")
            (wanted if later else stale).append((name, new))
        for name, new in stale:
            log.warning("webhook: %s@%s does not descend from %s's pin: a stale or reordered delivery, ignored",
                        repo, new[:12], name)
        if not wanted:
            return _answer(202, ignored=f"{repo}@{stale[0][1][:12]} does not descend from the pin: "
                           "a stale or reordered delivery")
        started: list[dict[str, Any]] = []
        for name, commit in wanted:
            try:
                run = await asyncio.wait_for(run_in_threadpool(dispatch, name, commit), DISPATCH_TIMEOUT_S)
            except TimeoutError:
                log.error("webhook: Prefect did not answer within %s s for %s@%s", DISPATCH_TIMEOUT_S, name,
                          commit[:12])
                return _answer(503, error="Prefect did not answer in time; send the event again", started=started)
            except ObjectNotFound:
                log.error("webhook: Prefect has no deployment convert/%s: run `prefect deploy --all`", name)
                return _answer(500, error=f"no deployment convert/{name} on the Prefect server", started=started)
            except Exception as err:  # Prefect's client raises httpx and its own errors: the hub will resend
                log.error("webhook: could not start the conversion of %s@%s: %s", name, commit[:12], err)
                return _answer(503, error="Prefect could not be reached; send the event again", started=started)
            state = run.state.type.value if run.state else None  # FAILED: its retries wait or are spent (logged)
            started.append({"model": name, "commit": commit, "flow_run": str(run.id), "state": state})
        return _answer(202, started=started)

    async def healthz(_request: Request) -> JSONResponse:
        return _answer(200, ok=True)

    return Starlette(routes=[Route("/", receive, methods=["POST"]), Route("/webhook", receive, methods=["POST"]),
                             Route("/healthz", healthz, methods=["GET"])])


class _TooLarge(Exception):
    """A body over MAX_BODY."""


async def _read_limited(request: Request, timeout: float) -> bytes:
    """The body, read as it streams (a huge body never sits in memory) under one deadline for all of it.

    Raises:
        _TooLarge: the body passed MAX_BODY (the rest is left unread).
        TimeoutError: the body was not all in within `timeout` seconds.
        ClientDisconnect: the client went away before its body was in.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        raise _TooLarge
    chunks, size = [], 0
    async with asyncio.timeout(timeout):  # uvicorn has no deadline for a body: its reads wait as long as it trickles
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY:
                raise _TooLarge  # the rest is left unread: the 413 closes the connection
            chunks.append(chunk)
    return b"".join(chunks)


def parse_event(body: bytes) -> tuple[str, dict[str, tuple[str | None, str]]]:
    """The repo name and each updated ref's (old commit or None, new commit) (`refs/heads/main` → `main`) of a
    Hugging Face webhook.

    Raises:
        BadEvent: not JSON, not a model repo's content update, or refs that are not 40-hex commits.
    """
    try:
        event = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise BadEvent(f"the body is not JSON: {err}") from err
    except RecursionError as err:  # json's decoder recurses once per level of nesting
        raise BadEvent("the body's JSON is nested too deeply: a hub event is a few levels deep") from err
    if not isinstance(event, dict) or not isinstance(event.get("repo"), dict):
        raise BadEvent("not a Hugging Face webhook event: no `repo` object")
    meta = event.get("event", {})
    scope = str(meta.get("scope", "repo.content")) if isinstance(meta, dict) else repr(meta)
    if not scope.startswith("repo.content"):
        raise BadEvent(f"event scope {scope!r} is not repo.content: configure the webhook for repo content updates")
    repo = event["repo"]
    if not isinstance(repo.get("name"), str) or repo.get("type", "model") != "model":
        raise BadEvent("`repo.name` is missing, or the repo is not a model")
    if not _REPO.fullmatch(repo["name"]):
        raise BadEvent("`repo.name` is not a hub repo id (owner/name)")
    updated = event.get("updatedRefs")
    if updated is None and repo.get("headSha"):
        updated = [{"ref": "refs/heads/main", "newSha": repo["headSha"]}]  # no oldSha: the history decides
    if not isinstance(updated, list) or not all(isinstance(u, dict) for u in updated):
        raise BadEvent("`updatedRefs` must be a list of {ref, oldSha, newSha}")
    refs = {}
    for u in updated:
        ref, new = str(u.get("ref", "")), u.get("newSha")
        if new is None:
            continue  # a deleted ref: nothing to build
        if not isinstance(new, str) or not COMMIT.fullmatch(new):
            raise BadEvent(f"newSha of {ref!r} is not a 40-hex commit")
        old = u.get("oldSha")
        refs[re.sub(r"^refs/(heads|tags)/", "", ref)] = (old if isinstance(old, str) else None, new)
    return repo["name"], refs


def _answer(status: int, *, close: bool = False, **body: Any) -> JSONResponse:
    """A JSON answer; `close` ends the connection after it (uvicorn closes once h11 says MUST_CLOSE:
    h11_impl.py:512-515), where a body was left unread: uvicorn would otherwise read and drop the rest, every chunk
    deferring its keep-alive timeout (h11_impl.py:171-172, 258-260)."""
    return JSONResponse(body, status_code=status, headers={"connection": "close"} if close else None)


class _Tally:
    """Events of one kind, logged at most once per LOG_INTERVAL_S: a flood of them is a line a minute, not a line
    (or a traceback) each."""

    def __init__(self, what: str) -> None:
        self.what, self.count, self.next_at = what, 0, 0.0

    def add(self) -> None:
        self.count += 1
        now = time.monotonic()
        if now >= self.next_at:
            log.warning("webhook: %s (%d since the last such line; one a minute at most)", self.what, self.count)
            self.count, self.next_at = 0, now + LOG_INTERVAL_S


class _Guard:
    """One server's open connections, oldest first, with the header deadline and the connection limit they obey."""

    def __init__(self, limit: int, header_timeout: float) -> None:
        self.limit, self.header_timeout = limit, header_timeout
        self.open: dict[_GuardedH11Protocol, None] = {}  # insertion order: oldest first
        self.late_headers = _Tally(f"closed connections whose request headers were not in within {header_timeout:g} s")
        self.evicted = _Tally(f"closed the oldest connections still sending a request, at the limit of {limit}")
        self.accept_failed = _Tally("could not accept connections (out of file descriptors or memory)")

    def protocol(self) -> type[H11Protocol]:
        """The h11 protocol class uvicorn makes one of per connection, bound to this guard."""
        return type("GuardedH11Protocol", (_GuardedH11Protocol,), {"guard": self})

    def admit(self, conn: _GuardedH11Protocol) -> None:
        """Count a new connection; at the limit, close the oldest one still sending its request (or idle between
        requests), or this one if every other is being answered."""
        if len(self.open) >= self.limit:
            victim = next((c for c in self.open if c.awaiting_request() and not c.transport.is_closing()), conn)
            self.open.pop(victim, None)
            victim.transport.close()
            self.evicted.add()
            if victim is conn:
                return
        self.open[conn] = None

    def loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """The event loop's exception handler: accept() errors counted, everything else as asyncio logs it.

        On EMFILE asyncio logs a traceback per failed accept, up to BACKLOG of them per wake-up, and retries every
        second (selector_events.py `_accept_connection`): a flood that kept descriptors short wrote millions of lines.
        """
        if context.get("message") == "socket.accept() out of system resource":
            self.accept_failed.add()
        else:
            loop.default_exception_handler(context)


class _GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for request headers and a place under the connection limit.

    uvicorn's own knobs do not cover a stalled client: `timeout_keep_alive` is armed only once a response is sent
    (uvicorn/protocols/http/h11_impl.py:319-322), so a connection that never completes its headers is never closed;
    `limit_concurrency` is checked only once a request's headers are in (h11_impl.py:226-233) and then answers 503,
    with a warning per request, to a valid delivery while stalled connections keep their places. h11 itself caps the
    headers' size (h11_max_incomplete_event_size, 16 KiB by default: h11_impl.py:57-62; larger is a 400).
    """

    guard: ClassVar[_Guard]
    _headers_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.guard.admit(self)
        self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.open.pop(self, None)
        if self._headers_deadline is not None:
            self._headers_deadline.cancel()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._await_headers()  # a kept-alive connection's next request has the same deadline

    def awaiting_request(self) -> bool:
        """No request being answered: its headers or body still coming, or idle after an answer."""
        return self.cycle is None or self.cycle.more_body or self.cycle.response_complete

    def _await_headers(self) -> None:
        if self._headers_deadline is not None:
            self._headers_deadline.cancel()
        if not self.transport.is_closing():
            self._headers_deadline = self.loop.call_later(self.guard.header_timeout, self._headers_late, self.cycle)

    def _headers_late(self, cycle: RequestResponseCycle | None) -> None:
        # a new request since the deadline was set (uvicorn makes a new cycle per request's headers) clears it
        if self.cycle is cycle and (cycle is None or cycle.response_complete) and not self.transport.is_closing():
            self.guard.late_headers.add()
            self.transport.close()


def connection_limit(asked: int | None) -> int:
    """The connection limit: `asked`, else MAX_CONNECTIONS, either way within the open-file limit.

    Raises:
        ConfigError: the open-file limit leaves no room for `asked` connections (or for any).
    """
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    room = (asked or MAX_CONNECTIONS) if soft == resource.RLIM_INFINITY else soft - FILES_BESIDES_CONNECTIONS
    limit = min(MAX_CONNECTIONS, room) if asked is None else asked
    if limit > room or limit < 1:
        want = asked or MAX_CONNECTIONS
        raise ConfigError(f"an open-file limit of {soft} leaves room for {max(room, 0)} webhook connections, "
                          f"not {want} ({FILES_BESIDES_CONNECTIONS} descriptors are kept for the receiver itself)",
                          hint=f"raise the limit (`ulimit -n {want + FILES_BESIDES_CONNECTIONS}`) or lower "
                               "--max-connections, then rerun `modelmint webhook serve`")
    return limit


def serve(settings: Settings, *, host: str = "127.0.0.1", port: int = 8765, header_timeout: float = HEADER_TIMEOUT_S,
          body_timeout: float = BODY_TIMEOUT_S, max_connections: int | None = None) -> None:
    """Serve the receiver until interrupted.

    Raises:
        ConfigError: no MODELMINT_WEBHOOK_SECRET, or an open-file limit with no room for the connection limit.
        ModelmintError: the receiver could not listen on host:port.
    """
    app = create_app(settings, settings.webhook_secret or "", body_timeout=body_timeout)
    guard = _Guard(connection_limit(max_connections), header_timeout)
    # asyncio's loop, whose accept() behaviour the limit and the exception handler are built on (not uvloop's);
    # timeout_keep_alive: an idle kept-alive connection is closed 5 s after its answer (h11_impl.py:319-322, 355-363)
    config = uvicorn.Config(app, host=host, port=port, loop="asyncio", http=guard.protocol(), backlog=BACKLOG,
                            timeout_keep_alive=5, log_level="warning", access_log=False)
    server = uvicorn.Server(config)

    async def run() -> None:
        asyncio.get_running_loop().set_exception_handler(guard.loop_exception)
        await server.serve()

    try:
        asyncio.run(run())
    except SystemExit as err:  # uvicorn exits when it cannot bind
        raise ModelmintError(f"the webhook receiver could not listen on {host}:{port}",
                             hint="choose another --port, or stop what listens there") from err
    except KeyboardInterrupt:  # uvicorn shut down gracefully, then raised the captured Ctrl-C again
        pass
