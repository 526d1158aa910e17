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
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
from collections.abc import Callable
from typing import Any

from prefect.exceptions import ObjectNotFound
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

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
_REPO = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?", re.ASCII)
Dispatch = Callable[[str, str], Any]
"""(catalog name, commit) → the flow run Prefect made or found for it."""


class BadEvent(ValueError):
    """A body that is not a repo update event this receiver can read."""


def create_app(settings: Settings, secret: str, dispatch: Dispatch = start_conversion) -> Starlette:
    """The ASGI app: POST / (and /webhook) receive events; GET /healthz answers ok."""
    if not secret:
        raise ConfigError("the webhook receiver needs a shared secret",
                          hint="set MODELMINT_WEBHOOK_SECRET to the secret configured on the hub's webhook")
    expected = secret.encode()

    async def receive(request: Request) -> JSONResponse:
        given = request.headers.get("x-webhook-secret", "").encode()
        if not hmac.compare_digest(given, expected):
            return _answer(401, error="wrong or missing X-Webhook-Secret")
        body = await _read_limited(request)
        if body is None:
            return _answer(413, error=f"body over {MAX_BODY} bytes")
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


async def _read_limited(request: Request) -> bytes | None:
    """The body, or None once it passes MAX_BODY: read as it streams, so a huge body never sits in memory."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            return None  # the rest is left unread: uvicorn closes the connection
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


def _answer(status: int, **body: Any) -> JSONResponse:
    return JSONResponse(body, status_code=status)


def serve(settings: Settings, *, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve the receiver until interrupted.

    Raises:
        ConfigError: no MODELMINT_WEBHOOK_SECRET.
    """
    import uvicorn

    app = create_app(settings, settings.webhook_secret or "")
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
    except SystemExit as err:  # uvicorn exits when it cannot bind
        raise ModelmintError(f"the webhook receiver could not listen on {host}:{port}",
                             hint="choose another --port, or stop what listens there") from err
