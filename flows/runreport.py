"""What a convert run leaves in Prefect beside its result: the run report as a Markdown artifact and a table
artifact of every variant's figures and verdict (the table the CLI prints), where each variant was published, and
the registry site's lines; and the fan-out of `convert/all`, which starts each model's own deployment run and reads
those tables back.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, cast

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.client.orchestration import get_client

from flows.site import site_lines
from pipelines.compose import Cell, RunReport, SiteRefresh
from pipelines.oci.images import Published
from pipelines.registry import register as reg
from pipelines.store.formats import format_of

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun


def artifact_key(*parts: str) -> str:
    """Prefect artifact keys allow only a-z, 0-9 and dashes."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", "-".join(parts).lower())).strip("-")


def publish_run_artifacts(report: RunReport, registrations: dict[str, reg.Registration],
                          published: dict[str, Published], site: SiteRefresh | None) -> dict[str, Any]:
    """The run report as the run's Markdown artifact (its table: RunReport.table, the one the CLI prints) and as a
    table artifact of data rows; returns the flow's result."""
    columns, cells = report.table()
    lines = [f"# {report.name}: convert", "", *report.header, "",
             "| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(_markdown(c) for c in row) + " |" for row in cells]
    lines += ["", "Registered variants are in the DVC remote; `modelmint pull NAME:TAG` fetches one and checks it."]
    lines += _published_lines(published)
    lines += site_lines(site)
    rows = [line.data() for line in report.lines]
    create_markdown_artifact("\n".join(lines), key=artifact_key("convert", report.name),
                             description=f"convert {report.name}")
    create_table_artifact(rows, key=artifact_key("convert", report.name, "variants"),
                          description=f"variants of {report.name}")
    return {
        "model": report.name,
        "registered": [r.manifest.ref for r in registrations.values()],
        "published": {p.manifest.ref: p.images for p in published.values()},
        "failed": report.failed,
        "variants": rows,
    }


def _markdown(cell: Cell) -> str:
    """A run report cell in a Markdown table: a ref as code, a verdict with its sign."""
    text = cell.text.replace("|", "/")
    if cell.code and text:
        return f"`{text}`"
    if cell.tone == "ok" and text:
        return "✅ " + text
    return "❌ " + text if cell.tone == "bad" and text else text


def _published_lines(published: dict[str, Published]) -> list[str]:
    """Where each variant was published, and the line that pulls it."""
    lines = ["", "Published to the OCI registry:", ""] if published else []
    for p in published.values():
        pull = " ".join(format_of(p.manifest.tag).pull_command(p.images[-1], p.registry.insecure))
        lines.append(f"- `{p.manifest.ref}` → {', '.join(f'`{i}`' for i in p.images)} ({p.digest}; "
                     f"{len(p.uploaded)} blob(s) uploaded, {len(p.tagged)} tag(s) written): `{pull}`")
    return lines


# ---------------------------------------------------------------- `convert/all`: each model's run


def start_all(names: list[str], variants: list[str] | None) -> dict[str, Any]:
    from prefect.context import FlowRunContext
    from prefect.deployments import run_deployment

    parent = FlowRunContext.get().flow_run.id  # type: ignore[union-attr]
    started: dict[str, Any] = {}
    for name in names:
        params = {"model": name, **({"variants": variants} if variants else {})}
        # run_deployment is sync_compatible: called from sync code it returns the FlowRun, not a coroutine
        started[name] = cast("FlowRun", run_deployment(f"convert/{name}", parameters=params, timeout=0,
                                                       as_subflow=True, idempotency_key=f"convert-all-{parent}-{name}"))
        get_run_logger().info("started convert/%s: flow run %s", name, started[name].id)
    return started


def wait_all(started: dict[str, Any], poll_s: float = 5.0) -> dict[str, Any]:
    import time

    pending, done = dict(started), {}
    with get_client(sync_client=True) as client:
        while pending:
            for name, run in list(pending.items()):
                now = client.read_flow_run(run.id)
                if now.state and now.state.is_final():
                    del pending[name]
                    done[name] = now
            if pending:
                time.sleep(poll_s)
    return done


def run_rows(client: Any, flow_run_id: Any, name: str) -> list[dict[str, Any]]:
    """The variants table a convert run published (artifact convert-<name>-variants), or nothing."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    found = client.read_artifacts(artifact_filter=ArtifactFilter(
        flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]),
        key=ArtifactFilterKey(any_=[artifact_key("convert", name, "variants")])))
    data = found[0].data if found else None
    return json.loads(data) if isinstance(data, str) else list(data or [])
