"""The webhook receiver: a Hugging Face `repo.content` update of a tracked ref starts that commit's conversion.

An ASGI app (Starlette, which Prefect's server already brings) served by uvicorn on 127.0.0.1 by default. It checks
the shared secret (X-Webhook-Secret, compared in constant time), reads the event, and hands each tracked ref that
moved to Prefect with the same idempotency key the scheduled watcher uses (flows.watch.conversion_key): a webhook and
a watcher tick for one commit make one conversion. The pin itself is recorded by the watcher's next tick, which
finds the same run.

    401  no or wrong X-Webhook-Secret          400  not JSON, or not a repo update event
    404  a repo the catalog does not hold      413  a body over 1 MiB
    500  the Prefect server has no convert/<name> deployment      503  Prefect could not be reached (the hub resends)
    202  started (or already started) conversions, or ignored: an update of a ref no entry tracks
"""

from __future__ import annotations

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
from pipelines.source.catalog import HubSource, load_catalog

log = logging.getLogger(__name__)

MAX_BODY = 1 << 20
_SHA = re.compile(r"^[0-9a-f]{40}$")
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
        body = await request.body()
        if len(body) > MAX_BODY:
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
        wanted = [(e.name, refs[e.source.track]) for e in entries
                  if isinstance(e.source, HubSource) and e.source.track in refs
                  and refs[e.source.track] != e.source.revision]
        if not wanted:
            return _answer(202, ignored=f"no catalog entry tracks an updated ref of {repo} at a new commit")
        started = []
        for name, commit in wanted:
            try:
                run = await run_in_threadpool(dispatch, name, commit)
            except ObjectNotFound:
                log.error("webhook: Prefect has no deployment convert/%s: run `prefect deploy --all`", name)
                return _answer(500, error=f"no deployment convert/{name} on the Prefect server", started=started)
            except Exception as err:  # Prefect's client raises httpx and its own errors: the hub will resend
                log.error("webhook: could not start the conversion of %s@%s: %s", name, commit[:12], err)
                return _answer(503, error="Prefect could not be reached; send the event again", started=started)
            started.append({"model": name, "commit": commit, "flow_run": str(run.id)})
        return _answer(202, started=started)

    async def healthz(_request: Request) -> JSONResponse:
        return _answer(200, ok=True)

    return Starlette(routes=[Route("/", receive, methods=["POST"]), Route("/webhook", receive, methods=["POST"]),
                             Route("/healthz", healthz, methods=["GET"])])


def parse_event(body: bytes) -> tuple[str, dict[str, str]]:
    """The repo name and each updated ref's new commit (`refs/heads/main` → `main`) of a Hugging Face webhook.

    Raises:
        BadEvent: not JSON, not a model repo's content update, or refs that are not 40-hex commits.
    """
    try:
        event = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise BadEvent(f"the body is not JSON: {err}") from err
    if not isinstance(event, dict) or not isinstance(event.get("repo"), dict):
        raise BadEvent("not a Hugging Face webhook event: no `repo` object")
    meta = event.get("event", {})
    scope = str(meta.get("scope", "repo.content")) if isinstance(meta, dict) else repr(meta)
    if not scope.startswith("repo.content"):
        raise BadEvent(f"event scope {scope!r} is not repo.content: configure the webhook for repo content updates")
    repo = event["repo"]
    if not isinstance(repo.get("name"), str) or repo.get("type", "model") != "model":
        raise BadEvent("`repo.name` is missing, or the repo is not a model")
    updated = event.get("updatedRefs")
    if updated is None and repo.get("headSha"):
        updated = [{"ref": "refs/heads/main", "newSha": repo["headSha"]}]
    if not isinstance(updated, list) or not all(isinstance(u, dict) for u in updated):
        raise BadEvent("`updatedRefs` must be a list of {ref, oldSha, newSha}")
    refs = {}
    for u in updated:
        ref, new = str(u.get("ref", "")), u.get("newSha")
        if new is None:
            continue  # a deleted ref: nothing to build
        if not isinstance(new, str) or not _SHA.fullmatch(new):
            raise BadEvent(f"newSha of {ref!r} is not a 40-hex commit")
        refs[re.sub(r"^refs/(heads|tags)/", "", ref)] = new
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
