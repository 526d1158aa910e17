"""The `watch-upstream` flow: each tracked ref that moved gets its pin recorded and one `convert/<name>` run.

What Prefect adds to pipelines.source.upstream and pipelines.store.pins:
  schedule      a cron schedule in prefect.yaml (deployment watch-upstream/watch-upstream)
  idempotency   each conversion is started through run_deployment with the key `upstream-<name>-<commit>`, so one
                upstream commit makes one run, whoever asks (two overlapping ticks, a tick and the webhook)
  no retries    a hub that fails (5xx, 429, timeouts) triggers nothing now: the next tick checks again
  failed runs   a conversion that failed is started again by the next ask (tick, webhook, CLI), bounded and with a
                backoff (start_conversion), and its state is reported
  artifacts     a Markdown table per run: what moved, what changed, which run converts it
"""

from __future__ import annotations

import logging
import subprocess
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.deployments import run_deployment
from prefect.exceptions import MissingContextError

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

from pipelines.core.errors import ConfigError, ModelmintError
from pipelines.core.settings import Settings
from pipelines.source import upstream
from pipelines.source.catalog import CatalogEntry, load_catalog
from pipelines.store.pins import RecordMode, record_pin

HUB_INTERVAL_S = 0.5
"""At most two hub calls a second from one watcher run."""


def conversion_key(name: str, commit: str) -> str:
    """The idempotency key of the conversion of `name` at an upstream `commit`: the watcher and the webhook use it."""
    return f"upstream-{name}-{commit}"


CONVERSION_ATTEMPTS = 3
"""Runs one upstream commit gets: the first and two retries after it failed (a hub outage during the one run)."""
RETRY_BACKOFF_S = 600.0
"""The wait after a failed attempt before the next, doubled for each attempt made."""


def start_conversion(name: str, commit: str) -> Any:
    """Ask Prefect for the `convert/<name>` run of `commit`: created once, then the same run for the same key.

    A run that ended Failed or Crashed is retried, CONVERSION_ATTEMPTS runs in all, each retry RETRY_BACKOFF_S ×
    2^(attempt-1) after the last one ended, under its own key (`…-retry<n>`, found again like the first); until then,
    and once they are spent, the failed run is handed back and logged, so the caller reports its state.
    Does not wait for the run; returns it (its id, name and state).
    """
    for attempt in range(CONVERSION_ATTEMPTS):
        key = conversion_key(name, commit) + (f"-retry{attempt}" if attempt else "")
        # run_deployment is sync_compatible: called from sync code it returns the FlowRun, not a coroutine
        run = cast("FlowRun", run_deployment(f"convert/{name}", parameters={"model": name, "revision": commit},
                                             timeout=0, idempotency_key=key, as_subflow=False,
                                             tags=["upstream", f"upstream-{commit[:12]}"]))
        if run.state is None or not (run.state.is_failed() or run.state.is_crashed()):
            return run
        ended = run.end_time or run.state.timestamp
        waited = (datetime.now(UTC) - ended).total_seconds() if ended else 0.0
        due = RETRY_BACKOFF_S * 2 ** attempt
        if attempt + 1 == CONVERSION_ATTEMPTS or waited < due:
            spent = attempt + 1 == CONVERSION_ATTEMPTS
            _log().warning("%s@%s: conversion %s ended %s (attempt %d of %d); %s", name, commit[:12], run.name,
                           run.state.type.value, attempt + 1, CONVERSION_ATTEMPTS,
                           "no retries left: fix the cause, then `modelmint watch --convert " + name + "`"
                           " after deleting the failed runs" if spent else f"retried in {due - waited:.0f} s")
            return run
    raise AssertionError("unreachable")  # the loop returns on its last attempt


def _log() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    try:
        return get_run_logger()
    except MissingContextError:  # the webhook and `modelmint watch --convert` run outside a flow
        return logging.getLogger(__name__)


@task(name="check-upstream", task_run_name="check-{entry.name}", cache_policy=NO_CACHE)
def check_upstream(entry: CatalogEntry, settings: Settings, limit: upstream.RateLimit) -> upstream.Movement | None:
    """One tracked entry against the hub; None when the hub failed or refused (logged, nothing triggered)."""
    try:
        return upstream.check(entry, settings, limit=limit)
    except ModelmintError as err:
        when = "the next tick checks again" if err.transient else "fix it; nothing is triggered until then"
        get_run_logger().warning("%s: %s (%s)", entry.name, err.message, when)
        return None


@task(name="record-and-convert", task_run_name="record-{m.name}", cache_policy=NO_CACHE)
def record_and_convert(m: upstream.Movement, settings: Settings, record: RecordMode) -> dict[str, Any]:
    """Record the new pin, then start (or find) its one conversion."""
    recorded = record_pin(settings, m, record)
    run = start_conversion(m.name, m.head)
    get_run_logger().info("%s: %s → %s recorded on %s; conversion %s (%s)", m.name, (m.pinned or "unpinned")[:12],
                          m.head[:12], recorded.where, run.name, run.id)
    return {**m.to_dict(), "recorded_on": recorded.where, "git_commit": recorded.commit, "flow_run": str(run.id),
            "flow_run_name": run.name}


@flow(name="watch-upstream", log_prints=True)
def watch_upstream(names: list[str] | None = None, record: RecordMode = "in-place") -> dict[str, Any]:
    """Check every tracked catalog entry (or `names`) upstream; for each moved pin, record it (`record`: in-place
    commits on the checkout's branch, branch commits on upstream/<name>-<commit12>) and start its conversion."""
    settings = Settings.from_env()
    entries = upstream.tracked(load_catalog(settings.catalog_path), names or ())
    limit = upstream.RateLimit(HUB_INTERVAL_S)
    found = {e.name: check_upstream(e, settings, limit) for e in entries}
    started = {m.name: record_and_convert(m, settings, record) for m in found.values() if m is not None and m.moved}
    failed = sorted(n for n, m in found.items() if m is None)
    unchanged = sorted(n for n, m in found.items() if m is not None and not m.moved)
    _report(started, unchanged, failed)
    return {"moved": started, "unchanged": unchanged, "failed": failed}


def _report(started: dict[str, dict[str, Any]], unchanged: list[str], failed: list[str]) -> None:
    rows = ["| model | ref | from → to | changed | rebuild | recorded on | conversion |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, s in started.items():
        rows.append(f"| {name} | {s['ref']} | {(s['pinned'] or 'unpinned')[:12]} → {s['head'][:12]} | "
                    f"{', '.join(s['kinds']) or '-'} | {'weights' if s['rebuilds_weights'] else 'metadata only'} | "
                    f"{s['recorded_on']} | {s['flow_run_name']} |")
    text = "\n".join(["# Upstream", "", *(rows if started else ["Nothing moved."]), "",
                      f"Unchanged: {', '.join(unchanged) or '-'}", "",
                      f"Not checked (see the log; the next tick tries again): {', '.join(failed) or '-'}"])
    create_markdown_artifact(text, key="watch-upstream", description="what moved upstream")


def pinned_commits(settings: Settings, names: list[str]) -> dict[str, str]:
    """Each named catalog entry's pinned hub commit, the one `modelmint watch --convert` starts the conversion of.

    Raises:
        ConfigError: an unknown name, or an entry pinned to no hub commit.
    """
    catalog = load_catalog(settings.catalog_path)
    commits = {name: getattr(catalog.get(name).source, "revision", None) for name in names}
    for name, commit in commits.items():
        if commit is None:
            raise ConfigError(f"{name} has no pinned hub commit to convert",
                              hint=f"pin its source's revision in {settings.catalog_path} "
                              f"(`modelmint watch {name} --apply` moves a tracked pin), then rerun")
    return cast("dict[str, str]", commits)


def main(argv: list[str] | None = None) -> int:
    """`python -m flows.watch convert NAME…`: the older spelling of `modelmint watch --convert NAME…` (the upstream
    workflow and docs/upstream.md use it), run as that command: the same output, errors and exit code."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] != ["convert"] or len(args) < 2:
        print("usage: python -m flows.watch convert NAME [NAME ...]\n"
              "error: the one command is `convert NAME…` (`modelmint watch --convert NAME…` is the same)",
              file=sys.stderr)
        return 2
    return subprocess.run([sys.executable, "-m", "pipelines.cli", "watch", "--convert", *args[1:]]).returncode


if __name__ == "__main__":
    sys.exit(main())
