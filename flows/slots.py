"""Concurrency slots of the convert flow: one run per model (`model-<name>`), GPU steps one `gpu` slot each.

Prefect's global concurrency limits hold the counts in the database and the leases in lease storage. The
embedded stack keeps leases on disk (`PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE`, flows/stack/): with Prefect's
default in-memory storage a server restart forgets every lease while the database keeps the count, and the
slot is held forever. A lease lives `LEASE_S` seconds and is renewed while its holder lives, so a slot whose
holder died frees within `LEASE_S` plus the server's repossessor interval.

`slot()` adds three things to `prefect.concurrency.sync.concurrency`:
  holder        each lease names the flow run holding it, so `modelmint stack doctor` can say who holds
                what and since when
  waiting       a slot that is not free at once is waited for with a log line per `WAIT_REPORT_S` naming the
                holders, never in silence
  release       a slot whose server cannot be reached when the work inside it is done is left to lapse (within
                `LEASE_S`) with a warning: finished work is never thrown away because the release failed
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx

GPU_LIMIT = "gpu"
LEASE_S = 60
"""Lease length; the holder renews it every LEASE_S / 2 or so, so a brief server outage does not lose it."""
WAIT_REPORT_S = 60
"""While waiting for a held slot, one line per this many seconds says who holds it."""

log = logging.getLogger(__name__)


def model_limit(name: str) -> str:
    """The global concurrency limit that serializes runs of one model (names allow a-z, 0-9, '-')."""
    return "model-" + re.sub(r"[^a-z0-9-]", "-", name.lower())


def prefect_unreachable(err: BaseException) -> bool:
    """Whether `err` says the Prefect API could not be reached or answered 5xx (worth retrying)."""
    from prefect.exceptions import PrefectHTTPStatusError

    if isinstance(err, httpx.TransportError | ConnectionError | TimeoutError):
        return True
    if isinstance(err, PrefectHTTPStatusError | httpx.HTTPStatusError):
        return err.response.status_code >= 500
    return False


def ensure_limit(client: Any, name: str, limit: int, *, update: bool = False) -> None:
    """Create a global concurrency limit unless it exists (two first runs may race: both are fine);
    `update` sets the size of an existing one."""
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    try:
        client.read_global_concurrency_limit_by_name(name)
    except ObjectNotFound:
        with contextlib.suppress(ObjectAlreadyExists):
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=limit))
    else:
        if update:
            client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(limit=limit))


# ---------------------------------------------------------------- who holds what


@dataclass(frozen=True)
class Lease:
    id: str
    limit_ids: tuple[str, ...]
    holder: str | None  # flow run id
    since: datetime
    expires: datetime

    @property
    def lapsed(self) -> bool:
        return self.expires <= datetime.now(UTC)


def read_leases(prefect_home: Path) -> list[Lease]:
    """The leases in the stack's lease storage (PREFECT_HOME/concurrency_leases, Prefect's filesystem format)."""
    leases = []
    for path in sorted((prefect_home / "concurrency_leases").glob("*.json")):
        if path.name == "expirations.json":
            continue
        try:
            data = json.loads(path.read_text())
            holder = ((data.get("metadata") or {}).get("holder") or {}).get("id")
            leases.append(Lease(
                id=data["id"], limit_ids=tuple(data["resource_ids"]), holder=holder,
                since=datetime.fromisoformat(data["created_at"]), expires=datetime.fromisoformat(data["expiration"]),
            ))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being rewritten, or not a lease
    return leases


def describe_holders(client: Any, limit_name: str, prefect_home: Path | None) -> str:
    """"held by flow run 'x' (Running, since 18:02:11 UTC)" for each lease of `limit_name`, or a pointer to doctor."""
    try:
        limit = client.read_global_concurrency_limit_by_name(limit_name)
    except Exception as err:  # a description must never fail the run
        return f"(could not read the limit: {err})"
    leases = [le for le in read_leases(prefect_home) if str(limit.id) in le.limit_ids] if prefect_home else []
    if not leases:
        return (f"{limit.active_slots}/{limit.limit} slots taken; the holders are listed by "
                "`modelmint stack doctor` on the server's machine")
    return "; ".join(f"held by {run_label(client, le.holder)} since {clock(le.since)}" for le in leases)


def run_label(client: Any, run_id: str | None) -> str:
    if run_id is None:
        return "a holder that did not name itself"
    try:
        run = client.read_flow_run(UUID(run_id))
    except Exception:
        return f"flow run {run_id} (no longer known to the server)"
    state = run.state.name if run.state else "no state"
    return f"flow run '{run.name}' ({run_id[:8]}, {state})"


def clock(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%H:%M:%S UTC")


# ---------------------------------------------------------------- holding a slot


def _holder() -> Any:
    from prefect.client.schemas.objects import ConcurrencyLeaseHolder
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        return None
    return ConcurrencyLeaseHolder(type="flow_run", id=ctx.flow_run.id)


def _say(level: int, msg: str, *args: Any) -> None:
    """To the run's log inside a flow run, else to this module's logger."""
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    try:
        get_run_logger().log(level, msg, *args)
    except MissingContextError:
        log.log(level, msg, *args)


@contextlib.contextmanager
def slot(name: str, *, prefect_home: Path | None = None, first_wait_s: float = 5) -> Iterator[None]:
    """Hold one slot of the global limit `name` (strict: a missing limit is an error, not "no limit")."""
    from prefect.client.orchestration import get_client
    from prefect.concurrency.sync import concurrency

    holder = _holder()
    waited = 0.0
    timeout = first_wait_s
    while True:
        cm = concurrency(name, occupy=1, timeout_seconds=timeout, lease_duration=LEASE_S, strict=True,
                         holder=holder, raise_on_lease_renewal_failure=False)
        try:
            cm.__enter__()
            break
        except TimeoutError:
            waited += timeout
            timeout = WAIT_REPORT_S
            with get_client(sync_client=True) as client:
                who = describe_holders(client, name, prefect_home)
            _say(logging.WARNING, "waiting for a slot of %s (%.0f s so far): %s", name, waited, who)
    if waited:
        _say(logging.INFO, "slot of %s acquired after %.0f s", name, waited)
    try:
        yield
    except BaseException:
        # The work failed: its error is what the caller needs; a release that fails too lapses on its own.
        with contextlib.suppress(Exception):
            cm.__exit__(*sys.exc_info())
        raise
    try:
        cm.__exit__(None, None, None)
    except (httpx.HTTPError, ConnectionError, TimeoutError) as err:
        # unreachable, or the lease was already revoked after lapsing during an outage: either way it is free
        _say(logging.WARNING, "could not release the slot of %s (%s: %s); it lapses within %d s",
             name, type(err).__name__, err, LEASE_S)
