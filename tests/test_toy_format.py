"""A format declared in this test, and in no module of pipelines/ or flows/, reaches everything a format reaches.

The toy format "builds" a variant by copying the source checkpoint's weights and config and "validates" it against
itself. Declared with its names (pipelines/store/names.py) and implemented with its hooks and step list
(pipelines/store/formats/base.py), it is run by the local executor (the CLI's composition) and by the Prefect
flow, registered (dvc.yaml stage, DVC, manifest), planned for serving (serve/ beside it) and published with its own
card, without an edit to any other module: the proof that a format is one entry, not a branch in each place.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings
from prefect.testing.utilities import prefect_test_harness
from registry_env import Repo, make_repo, task_runs

from pipelines import __version__
from pipelines.compose import run_model
from pipelines.core.errors import ArtifactError
from pipelines.core.fsutil import atomic_output, sha256_file
from pipelines.core.gates import gguf_gate
from pipelines.core.report import Figures, Validation, VariantReport
from pipelines.core.settings import Settings
from pipelines.core.steps import (
    BuildResult,
    Executed,
    Step,
    StepList,
    StepResult,
    VariantOutcome,
    content_key,
    load_dir_receipt,
    load_report,
    write_dir_receipt,
    write_summary,
)
from pipelines.publish.oci import Blob, Image
from pipelines.source.catalog import CatalogEntry, load_catalog
from pipelines.store.candidate import Candidate
from pipelines.store.formats import FORMATS, format_of
from pipelines.store.formats.base import IMPLEMENTED, ArtifactFormat, implement
from pipelines.store.manifest import Manifest, find_manifest
from pipelines.store.names import FormatName, stage_name, undeclare

ROOT = Path(__file__).resolve().parent.parent
TOY = "toy"
COPIED = ("config.json", "model.safetensors")


@dataclass(frozen=True)
class ToyPlan:
    entry: CatalogEntry
    settings: Settings
    snapshot: Any
    source_key: str
    out_dir: Path

    summary_name = "toy.json"

    def advice_context(self) -> tuple[int | None, bool | None]:
        return None, None

    @property
    def source(self) -> dict[str, Any]:
        return self.snapshot.describe(self.source_key)

    @property
    def variant_dir(self) -> Path:
        return self.out_dir / f"{self.entry.name}-{TOY}"

    @property
    def key(self) -> str:
        return content_key("toy", self.source_key)

    @property
    def report_path(self) -> Path:
        return self.out_dir / f"{self.entry.name}-{TOY}.report.json"


def _plan(
    entry: CatalogEntry, settings: Settings, *, variants: list[str] | None = None, revision: str | None = None
) -> ToyPlan:
    from pipelines.source.fetch import fetch

    snapshot = fetch(entry, settings, revision=revision)
    source_key = content_key(sorted(snapshot.files.items()))
    out_dir = settings.work_dir / entry.name / (snapshot.revision or source_key)[:12]
    out_dir.mkdir(parents=True, exist_ok=True)
    return ToyPlan(entry, settings, snapshot, source_key, out_dir)


def _make(plan: ToyPlan, _inputs: dict[str, Any]) -> StepResult:
    d = plan.variant_dir
    if (receipt := load_dir_receipt(d, plan.key)) is not None:
        return StepResult(d, receipt, ran=False)
    shutil.rmtree(d, ignore_errors=True)
    with atomic_output(d) as tmp:
        tmp.mkdir()
        for name in COPIED:
            shutil.copyfile(plan.snapshot.path / name, tmp / name)
    return StepResult(d, write_dir_receipt(d, plan.key), ran=True)


def _check(plan: ToyPlan, got: dict[str, Any]) -> VariantOutcome:
    made: StepResult = got["make-toy"]
    key = content_key("check", made.receipt["tree_sha256"])
    report = load_report(plan.report_path, key)
    cached = report is not None
    if report is None:
        same = all(sha256_file(made.path / n) == sha256_file(plan.snapshot.path / n) for n in COPIED)
        figures = Figures(
            mean_kl=0.0, same_top_pct=100.0, ppl_reference=10.0, ppl=10.0, ppl_ratio=1.0, dppl_pct=0.0
        )
        judged = Validation.judge(
            format=TOY,
            reference="the source itself",
            evaluation={"text": "none"},
            figures=figures,
            gate=gguf_gate("q8_0", "tiny"),
            failures=None if same else ["the copy differs from the source"],
        )
        report = VariantReport(key=key, variant=TOY, validation=judged)  # a new format writes the common fields
        report.write(plan.report_path)
    return VariantOutcome(TOY, made.path, made.receipt["tree_sha256"], made.receipt["size"], report, cached)


def _steps(
    plan: ToyPlan, *, progress: Any = None, asked: list[str] | None = None, **_options: Any
) -> StepList:
    make = Step(
        "make-toy",
        "make",
        run=lambda got: _make(plan, got),
        output=plan.variant_dir,
        variants=(TOY,),
        key=lambda _got: plan.key,
        say=lambda _got: "toy: copying the source",
        current=lambda r: load_dir_receipt(r.path, plan.key) is not None,
        tools=lambda r: ["cp"] if r.ran else [],
    )
    check = Step(
        "check-toy",
        "check",
        run=lambda got: _check(plan, got),
        output=plan.report_path,
        needs=("make-toy",),
        variants=(TOY,),
        stage="validate",
        key=lambda got: content_key("check", got["make-toy"].receipt["tree_sha256"]),
    )
    return StepList([make, check], asked=[TOY])


def _finish(plan: ToyPlan, listed: StepList, done: Executed, _progress: Any) -> BuildResult:
    variants = {TOY: done.results["check-toy"]} if "check-toy" in done.results else {}
    result = BuildResult(
        plan.entry.name,
        plan.out_dir,
        plan.source,
        {},
        variants,
        done.tools_run,
        done.timings,
        plan,
        errors=done.errors,
        asked=listed.asked,
    )
    write_summary(result, lambda v: {"tree_sha256": v.digest})
    return result


def _candidate(plan: ToyPlan, outcome: VariantOutcome) -> Candidate:
    receipt = load_dir_receipt(outcome.path, plan.key)
    assert receipt is not None and outcome.passed
    main = receipt["files"]["model.safetensors"]
    return Candidate(
        entry=plan.entry.with_serve_gpus(plan.settings.serve_gpus),
        tag=TOY,
        files=tuple(outcome.path / n for n in ("model.safetensors", "config.json")),
        sha256=main["sha256"],
        size_bytes=main["size"],
        source={k: v for k, v in plan.source.items() if k != "path"},
        parent=None,
        toolchain={"modelmint": __version__},
        recipe={"format": TOY},
        report=outcome.report,
        report_sha256=sha256_file(plan.report_path),
        source_dir=plan.snapshot.path,
        root=outcome.path,
    )


def _publish(_settings: Settings, c: Candidate, directory: Path) -> list[Path]:
    card = directory / "TOY.md"
    card.write_text(f"# {c.ref}\n\nThe source's weights, copied.\n")
    return [card]


def _image(_directory: Path, manifest: Manifest, _extra: tuple[Blob, ...]) -> Image:
    raise ArtifactError(f"{manifest.ref}: toy artifacts have no image")


@pytest.fixture
def toy() -> Iterator[ArtifactFormat]:
    names = FormatName(
        name=TOY,
        stage="toy",
        command="toy",
        option="--variants",
        owns=lambda tag: tag == TOY,
        catalog_variants=lambda entry: [TOY] if entry.name == "tiny-qwen2" else [],
        pins="toolchains/llama-cpp.env",
        module=__name__,
    )
    fmt = implement(
        ArtifactFormat(
            names=names,
            candidate=_candidate,
            publish=_publish,
            served=lambda d, _main, tag: (d, Path(tag)),
            offer=lambda target, _m, _ollama: {"commands": [f"cat {target}/TOY.md"]},
            image=_image,
            image_config="application/vnd.example.toy.v1+json",
            pull_command=lambda image, _insecure: ["echo", image],
            plan=_plan,
            steps=_steps,
            finish=_finish,
        )
    )
    yield fmt
    IMPLEMENTED.pop(TOY, None)
    undeclare(TOY)


def test_nothing_in_pipelines_or_flows_names_the_toy_format() -> None:
    named = [p for d in ("pipelines", "flows") for p in (ROOT / d).rglob("*.py") if '"toy"' in p.read_text()]
    assert named == []


def test_a_format_without_step_hooks_fails_its_variants_with_a_hint(toy: ArtifactFormat) -> None:
    """The flow builds every format step by step: one that declares no plan hook is a ModelmintError (the flow keeps
    it as each variant's `error:` line and builds the other formats), not a TypeError that ends the run."""
    from pipelines.core.errors import ConfigError
    from pipelines.core.steps import variant_scoped

    assert toy.stepwise().plan is _plan
    with pytest.raises(ConfigError, match="declares no plan hook") as refused:
        dataclasses.replace(toy, plan=None).stepwise()
    assert variant_scoped(refused.value) and "modelmint toy" in (refused.value.hint or "")


def _registered(repo: Repo, settings: Settings) -> Manifest:
    m = find_manifest(settings, f"tiny-qwen2:{TOY}")
    assert m.format == TOY and m.dvc.stage == stage_name("tiny-qwen2", TOY) == "toy@tiny-qwen2-toy"
    assert m.validation.passed and m.dvc.md5 and m.dvc.md5 in (repo.root / "dvc.lock").read_text()
    files = {f.path for f in m.files}
    assert {"model.safetensors", "config.json", "TOY.md", "serve/plans.json"} <= files
    assert m.serving is not None
    [inventory] = m.serving.inventories  # the one inventory MODELMINT_SERVE_GPUS names
    assert (
        inventory.refused is None
        and inventory.plans
        and any(f.endswith("vllm.yaml") for f in inventory.files)
    )
    return m


def test_a_toy_format_reaches_the_local_executor_the_registry_and_the_serving_files(
    toy: ArtifactFormat, isolated: Path, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path, models={"tiny-qwen2": ["q8_0"]})
    stages = yaml.safe_load((repo.root / "dvc.yaml").read_text())["stages"]
    assert stages["toy"]["foreach"] == {"tiny-qwen2-toy": {"model": "tiny-qwen2", "tag": TOY}}
    assert (
        stages["toy"]["do"]["cmd"]
        == "modelmint toy ${item.model} --variants ${item.tag} --register --no-track"
    )
    settings = repo.settings(MODELMINT_SERVE_GPUS="1xL4-24G")
    entry = load_catalog(settings.catalog_path).get("tiny-qwen2")
    assert FORMATS[TOY] is toy and format_of(TOY) is toy
    said: list[str] = []
    ran = run_model(entry, settings, [(toy, [TOY])], register=True, progress=said.append)
    (run,) = ran.runs
    assert run.failure() is None, run.rows()
    # the run's last step rebuilt the registry site, which shows the new variant
    assert ran.site is not None and ran.site.built and ran.site.index is not None, ran.site
    assert f"tiny-qwen2:{TOY}" in (ran.site.index.parent / "models" / "tiny-qwen2.html").read_text()
    assert f"registry site rebuilt: {ran.site.index}" in said
    assert run.registered == {TOY: f"tiny-qwen2:{TOY}"}
    assert run.result.tools_run == ["cp"] and "toy: copying the source" in said
    assert (run.result.out_dir / "toy.json").is_file()
    _registered(repo, settings)
    # a site that cannot be written is said, and the run that registered still succeeds
    shutil.rmtree(ran.site.index.parent)
    ran.site.index.parent.write_text("a file where the site's folder goes")
    said.clear()
    rerun = run_model(entry, settings, [(toy, [TOY])], register=True, progress=said.append)
    (again,) = rerun.runs
    assert again.result.tools_run == [] and again.registered == {TOY: f"tiny-qwen2:{TOY}"}
    assert again.failure() is None and rerun.site is not None and rerun.site.index is None and rerun.site.error
    assert any(m.startswith("the registry site was not rebuilt: ") for m in said), said


@pytest.mark.slow
def test_a_toy_format_reaches_the_flow(
    toy: ArtifactFormat, isolated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.client.orchestration import get_client

    from flows.convert import convert

    repo = make_repo(tmp_path, models={"tiny-qwen2": ["q8_0"]})
    monkeypatch.setenv("MODELMINT_REPO", str(repo.root))
    monkeypatch.setenv("MODELMINT_WORK_DIR", str(repo.work))
    monkeypatch.setenv("MODELMINT_SERVE_GPUS", "1xL4-24G")
    with (
        prefect_test_harness(server_startup_timeout=180),
        temporary_settings(updates={PREFECT_LOCAL_STORAGE_PATH: tmp_path / "results"}),
    ):
        state = convert(model="tiny-qwen2", variants=[TOY], return_state=True)
        assert state.is_completed(), state.message
        with get_client(sync_client=True) as client:
            names = {r.name for r in task_runs(client, state.state_details.flow_run_id)}
    summary = state.result()
    assert summary["registered"] == [f"tiny-qwen2:{TOY}"]
    assert [(r["variant"], r["format"], r["gate"]) for r in summary["variants"]] == [(TOY, TOY, "pass")]
    assert {f"fetch-{TOY}", "make-toy", "check-toy", f"register-{TOY}", "site"} <= names, names
    _registered(repo, repo.settings(MODELMINT_SERVE_GPUS="1xL4-24G"))
    assert next(repo.work.rglob("toy.json")).is_file()
