"""The container images built with podman (scripts/images.sh) and run: each one does its job the way the host's
toolchains do. The `images` tier (left out of the default run; .ci/run runs it when containers/, toolchains/,
scripts/images.sh or pyproject.toml changed); the llama.cpp image's own test is also `heavy` (its compile takes
12-15 min on 2 cores: the nightly tier builds it, the images tier reuses the cached image)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from registry_env import ROOT, Repo, free_port, isolate, make_repo
from stack_env import prefect, wait_for

from pipelines.core.fsutil import sha256_file
from pipelines.core.settings import Settings
from pipelines.core.toolchains import llama_cpp
from pipelines.store.manifest import find_manifest

pytestmark = pytest.mark.images

IMAGES_SH = ROOT / "scripts" / "images.sh"
TAGS = dict(
    line.split()
    for line in subprocess.run(
        ["bash", str(IMAGES_SH), "--list"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
)
REAL_HOME = Settings.from_env().home
CONF = REAL_HOME / "images" / "containers.conf"
_built: set[str] = set()


def podman(*args: str | Path, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["podman", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "CONTAINERS_CONF": str(CONF)},
    )
    if check:
        assert done.returncode == 0, (
            f"podman {' '.join(map(str, args))}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done


def built(name: str, *, compile_ok: bool = False) -> str:
    """The image's tag, after scripts/images.sh built it (a cache hit when nothing changed). Without `compile_ok`
    the llama.cpp compile is not started here: an outdated llama-cpp image is the nightly tier's to rebuild."""
    if name not in _built and os.environ.get("MODELMINT_IMAGES_BUILT") == "1":
        # .ci/run's images tier ran scripts/images.sh just before: the images exist or the tier stopped there
        podman("image", "exists", TAGS[name])
        _built.add(name)
    if name not in _built:
        env = {
            **os.environ,
            "MODELMINT_HOME": str(REAL_HOME),
            "MODELMINT_IMAGES_NO_COMPILE": "0" if compile_ok else "1",
        }
        done = subprocess.run(
            ["bash", str(IMAGES_SH), name], capture_output=True, text=True, env=env, timeout=3600
        )
        if done.returncode == 3:
            pytest.skip(
                f"the llama-cpp image is out of date and its compile is the nightly tier's: {done.stderr.strip()}"
            )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        _built.add(name)
    return TAGS[name]


def _isolated_env(*more: str) -> dict[str, str]:
    """The test's isolated git and DVC configuration (registry_env.isolate), and `more`, for a container."""
    names = ("GIT_CONFIG_GLOBAL", "GIT_CONFIG_NOSYSTEM", "DVC_GLOBAL_CONFIG_DIR", "DVC_SYSTEM_CONFIG_DIR",
             "DVC_SITE_CACHE_DIR", *more)
    return {k: os.environ[k] for k in names}


def _sha(path: Path) -> str:
    return sha256_file(path)


# ---------------------------------------------------------------- llama-cpp: the same bytes as the host toolchain


@pytest.mark.heavy
def test_llama_cpp_image_converts_and_quantizes_to_the_host_toolchains_bytes(
    tiny_qwen2: Path, settings: Settings, tmp_path: Path
) -> None:
    tag = built("llama-cpp", compile_ok=True)
    llama = llama_cpp(settings)
    out = tmp_path / "out"
    out.mkdir()
    # the host toolchain: converter (f16), then llama-quantize
    subprocess.run(
        [llama.python, llama.converter, tiny_qwen2, "--outfile", out / "host-f16.gguf", "--outtype", "f16"],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [llama.bin("llama-quantize"), out / "host-f16.gguf", out / "host-q4_k_m.gguf", "Q4_K_M", "2"],
        check=True,
        capture_output=True,
    )
    # the image: its entrypoint is llama-quantize, given the host's f16; its converter, given the same model directory
    # (mounted at the same path: the converter names the model after it)
    podman(
        "run",
        "--rm",
        "--network",
        "none",
        "-v",
        f"{out}:/data",
        tag,
        "/data/host-f16.gguf",
        "/data/image-q4_k_m.gguf",
        "Q4_K_M",
        "2",
    )
    prefix = f"/opt/modelmint/toolchains/{llama.prefix.name}"
    podman(
        "run",
        "--rm",
        "--network",
        "none",
        "-v",
        f"{tiny_qwen2}:{tiny_qwen2}:ro",
        "-v",
        f"{out}:/data",
        "--entrypoint",
        f"{prefix}/venv/bin/python",
        tag,
        f"{prefix}/llama.cpp/convert_hf_to_gguf.py",
        tiny_qwen2,
        "--outfile",
        "/data/image-f16.gguf",
        "--outtype",
        "f16",
    )
    assert _sha(out / "image-q4_k_m.gguf") == _sha(out / "host-q4_k_m.gguf")
    assert _sha(out / "image-f16.gguf") == _sha(out / "host-f16.gguf")


# ---------------------------------------------------------------- prefect-worker: convert/tiny-qwen2 in the image


def _registered(repo: Repo) -> dict[str, Any]:
    """What a run registered, without the parts that name the machine or the time: every file's sha256 and size,
    the parent f16's, the DVC directory hash, the content key."""
    out = {}
    for tag in ("q4_k_m", "q8_0"):
        m = find_manifest(repo.settings(), f"tiny-qwen2:{tag}").model_dump(mode="json")
        out[tag] = {"files": m["files"], "parent": m["parent"], "md5": m["dvc"]["md5"], "key": m["key"]}
    return out


def test_prefect_worker_image_completes_convert_tiny_qwen2_like_a_host_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows import stack

    tag = built("prefect-worker")
    isolate(tmp_path / "env", monkeypatch)
    in_image = make_repo(tmp_path / "image")
    on_host = make_repo(tmp_path / "host")
    monkeypatch.setenv("MODELMINT_PREFECT_PORT", str(free_port()))
    monkeypatch.setenv("PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED", "false")
    monkeypatch.setenv("MODELMINT_REPO", str(in_image.root))
    monkeypatch.setenv("MODELMINT_WORK_DIR", str(in_image.work))
    settings = Settings.from_env()
    state = stack.StackState(api_url=settings.prefect_api_url)
    name = f"modelmint-test-worker-{uuid.uuid4().hex[:8]}"
    try:
        # the host's local server, work pool and deployments (scripts/up.sh's), no host worker yet
        stack.start_server(settings, state)
        stack.ensure_pool_and_limits(settings)
        stack.deploy(settings)
        # 1. the image as the process worker: the deployment's checkout (this one), the project it registers into
        #    and its DVC remote are mounted at the paths the host names them by; MODELMINT_HOME is the image's
        passed = _isolated_env("MODELMINT_REPO", "MODELMINT_WORK_DIR")
        env = {**stack.stack_env(settings), **passed, "PREFECT_HOME": "/root/.prefect"}
        podman(
            "run",
            "-d",
            "--name",
            name,
            "--network",
            "host",
            "-v",
            f"{ROOT}:{ROOT}:ro",
            "-v",
            f"{tmp_path}:{tmp_path}",
            *[a for k, v in env.items() for a in ("-e", f"{k}={v}")],
            tag,
            "prefect",
            "worker",
            "start",
            "--pool",
            stack.WORK_POOL,
            "--type",
            "process",
            "--name",
            name,
        )
        with stack.api(settings) as client:
            wait_for(
                lambda: name in stack.workers_online(settings, client),
                120,
                "the image's worker to come online",
            )
        t0 = time.monotonic()
        ran = prefect(settings, "deployment", "run", "convert/tiny-qwen2", "--watch", timeout=1500)
        image_s = time.monotonic() - t0
        logs = podman("logs", name, check=False)
        assert ran.returncode == 0, (
            ran.stdout[-3000:] + ran.stderr[-3000:] + logs.stdout[-3000:] + logs.stderr[-3000:]
        )
        podman("rm", "-f", name)
        # 2. the same deployment through a worker on the host, registering into the other project
        monkeypatch.setenv("MODELMINT_REPO", str(on_host.root))
        monkeypatch.setenv("MODELMINT_WORK_DIR", str(on_host.work))
        stack.start_worker(settings, state)
        t0 = time.monotonic()
        again = prefect(settings, "deployment", "run", "convert/tiny-qwen2", "--watch", timeout=1500)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        print(f"convert/tiny-qwen2: {image_s:.0f} s in the image, {time.monotonic() - t0:.0f} s on the host")
    finally:
        podman("rm", "-f", name, check=False)
        stack.down(Settings.from_env(), say=lambda _m: None) if state.worker_pid else None
        stack._stop(state.server_pid)
    # the same artifacts, byte for byte, registered and pushed to each project's DVC remote
    got, want = _registered(in_image), _registered(on_host)
    assert got == want
    for tag in ("q4_k_m", "q8_0"):
        m = find_manifest(in_image.settings(), f"tiny-qwen2:{tag}")
        assert m.dvc.pushed and (in_image.root / m.dvc.path / m.file).is_file()
    assert any(in_image.remote.rglob("*")), "nothing pushed to the mounted DVC remote"


# ---------------------------------------------------------------- llmcompressor → vllm: FP8 built, then served


@pytest.fixture(scope="module")
def fp8_registered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Repo, dict[str, float]]]:
    """tiny-qwen2's FP8 variant built, validated and registered by the llmcompressor image into a mounted project."""
    from pipelines.source.tinymodel import ensure_tiny_model

    tag = built("llmcompressor")
    base = tmp_path_factory.mktemp("fp8")
    with pytest.MonkeyPatch.context() as mp:
        isolate(base / "env", mp)
        repo = make_repo(base, models={"tiny-qwen2": ["fp8"]})
        # the generated source model, from the host's cache: the image has no llama.cpp converter to generate it
        model = ensure_tiny_model("tiny-qwen2", Settings.from_env())
        passed = _isolated_env("DVC_NO_ANALYTICS")
        env = {
            **passed,
            "MODELMINT_REPO": str(repo.root),
            "MODELMINT_WORK_DIR": str(repo.work),
            "HF_HUB_OFFLINE": "1",
        }
        t0 = time.monotonic()
        done = podman(
            "run",
            "--rm",
            "--network",
            "none",
            "-v",
            f"{base}:{base}",
            "-v",
            f"{model}:/opt/modelmint/models/{model.name}:ro",
            *[a for k, v in env.items() for a in ("-e", f"{k}={v}")],
            tag,
            "tiny-qwen2",
            "--schemes",
            "fp8",
            "--register",
            "--json",
            check=False,
            timeout=1800,
        )
        took = time.monotonic() - t0
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
        yield repo, {"compress_s": took}


def test_llmcompressor_image_builds_and_registers_the_tiny_fp8_variant(
    fp8_registered: tuple[Repo, dict[str, float]],
) -> None:
    repo, took = fp8_registered
    m = find_manifest(repo.settings(), "tiny-qwen2:fp8")
    d = repo.root / m.dvc.path
    config = json.loads((d / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "compressed-tensors"
    assert config["quantization_config"]["format"] == "float-quantized"
    assert m.dvc.pushed
    for f in m.files:
        assert _sha(d / f.path) == f.sha256, f.path
    print(f"FP8 built, validated and registered in the llmcompressor image in {took['compress_s']:.0f} s")


def test_vllm_image_serves_the_registered_checkpoint_from_the_planners_vllm_yaml(
    fp8_registered: tuple[Repo, dict[str, float]], tmp_path: Path
) -> None:
    repo, _ = fp8_registered
    tag = built("vllm")
    m = find_manifest(repo.settings(), "tiny-qwen2:fp8")
    d = repo.root / m.dvc.path
    plan = next(
        f for f in sorted(p.path for p in m.files) if f.startswith("serve/") and f.endswith("/vllm.yaml")
    )
    cfg = yaml.safe_load((d / plan).read_text())
    mount = cfg["model"]  # where the plan's pods mount the checkpoint (/models/fp8)
    port = free_port()
    name = f"modelmint-test-vllm-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    podman(
        "run",
        "-d",
        "--name",
        name,
        "--network",
        "host",
        "-v",
        f"{d}:{mount}:ro",
        "-v",
        f"{d / plan}:/serve.yaml:ro",
        # vLLM's shared-memory broadcast needs 160 MiB of /dev/shm; podman gives 64 MiB by default
        "--shm-size",
        "1g",
        "-e",
        "HF_HUB_OFFLINE=1",
        "-e",
        "VLLM_CPU_KVCACHE_SPACE=1",
        tag,
        "--config",
        "/serve.yaml",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    )
    try:

        def up() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    return r.status == 200
            except OSError:
                state = podman("inspect", "--format", "{{.State.Running}}", name, check=False).stdout.strip()
                assert state == "true", podman("logs", name, check=False).stderr[-5000:]
                return False

        wait_for(up, 600, "vLLM in the image to answer /health")
        ready_s = time.monotonic() - t0
        body = json.dumps(
            {
                "model": cfg["served-model-name"],
                "max_tokens": 8,
                "temperature": 0,
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
            }
        ).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=120) as r:
            answer = json.loads(r.read())
        assert answer["model"] == cfg["served-model-name"] == "tiny-qwen2-fp8"
        assert answer["choices"][0]["message"]["role"] == "assistant"
        assert answer["usage"]["completion_tokens"] >= 1
        print(f"vLLM in the image up in {ready_s:.0f} s from {plan}")
    finally:
        podman("rm", "-f", name, check=False)


# ---------------------------------------------------------------- the Kubernetes files run these images


def test_the_work_pools_job_and_the_rayclusters_pods_run_commands_their_images_have(tmp_path: Path) -> None:
    """The base job template rendered by prefect-kubernetes itself (in the worker image, where it is installed) with
    the built image's name, and the RayCluster's pods: each container's command exists in its image."""
    tag = built("prefect-worker")
    render = r"""
import json, sys
from prefect.utilities.templating import apply_values
from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration
# BaseJobConfiguration.from_template_and_values without its API client (the template has no block references):
# the variables' defaults, the values given, applied to job_configuration, validated by the worker's own model
template = json.load(open(sys.argv[1]))
defaults = {k: v["default"] for k, v in template["variables"]["properties"].items() if "default" in v}
values = {**defaults, "image": sys.argv[2], "command": "prefect flow-run execute", "name": "flow-run"}
config = KubernetesWorkerJobConfiguration(**apply_values(template["job_configuration"], values))
pod = config.job_manifest["spec"]["template"]["spec"]
print(json.dumps([{"image": c["image"], "args": c["args"]} for c in pod["containers"]]))
"""
    done = podman(
        "run",
        "--rm",
        "--network",
        "none",
        "-v",
        f"{ROOT / 'containers/k8s'}:/k8s:ro",
        "--entrypoint",
        "python",
        tag,
        "-c",
        render,
        "/k8s/base-job-template.json",
        tag,
    )
    (job,) = json.loads(done.stdout.strip().splitlines()[-1])
    assert job["image"] == tag
    needed: dict[str, set[str]] = {
        tag: {job["args"].split()[0] if isinstance(job["args"], str) else job["args"][0]}
    }
    docs = list(yaml.safe_load_all((ROOT / "containers" / "k8s" / "raycluster.yaml").read_text()))
    cluster = next(d for d in docs if d["kind"] == "RayCluster")
    pods = [
        cluster["spec"]["headGroupSpec"]["template"],
        *(g["template"] for g in cluster["spec"]["workerGroupSpecs"]),
    ]
    for pod in pods:
        for c in pod["spec"]["containers"]:
            assert c["image"] == tag, c["image"]
            # KubeRay starts each node with `ray start` (its generated command) and, with the image's default
            # command, the worker; the flow's own steps need the toolchain's binaries
            needed[c["image"]] |= {"ray", "prefect", "git", "dvc", *c.get("command", [])[:1]}
    llama = llama_cpp(Settings.from_env())
    needed[tag] |= {
        f"/opt/modelmint/toolchains/{llama.prefix.name}/bin/{b}"
        for b in ("llama-quantize", "llama-perplexity")
    }
    for image, commands in needed.items():
        script = " && ".join(f"command -v {c}" for c in sorted(commands))
        found = podman(
            "run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c", script, check=False
        )
        assert found.returncode == 0, (
            f"{image} lacks one of {sorted(commands)}: found only {found.stdout.split()}"
        )
    # and the image's default command (the process worker of scripts/up.sh's pool) starts
    helped = podman("run", "--rm", "--network", "none", tag, "prefect", "worker", "start", "--help")
    assert "--pool" in helped.stdout


# ---------------------------------------------------------------- the base: a stand-in missing or stale; a full disk


def _images_sh(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(IMAGES_SH), *args],
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, "MODELMINT_HOME": str(REAL_HOME), **env},
    )


def _label(image: str, key: str) -> str:
    return podman("image", "inspect", "--format", f'{{{{ index .Labels "{key}" }}}}', image).stdout.strip()


def test_a_missing_or_stale_stand_in_base_is_made_again() -> None:
    """Under a name of its own (the real stand-in, which every image is built on, stays as it is)."""
    name = f"localhost/modelmint-test/python:{uuid.uuid4().hex[:8]}"
    try:
        made = _images_sh("base", MODELMINT_IMAGES_BASE=name)
        assert made.returncode == 0, made.stdout + made.stderr
        assert f"{name} cannot be pulled" in made.stdout and f"local stand-in {name}" in made.stdout
        fingerprint = _label(name, "modelmint.stand-in.fingerprint")
        assert fingerprint and "never push" in _label(name, "modelmint.stand-in")
        assert "Python 3.11" in podman("run", "--rm", "--network", "none", name, "python", "--version").stdout
        assert "pip " in podman("run", "--rm", "--network", "none", name, "pip", "--version").stdout
        # a stand-in from another recipe under that name (an old fingerprint) is stale: made again
        rootfs = podman(
            "images", "--format", "{{.Repository}}:{{.Tag}}", "localhost/modelmint/bookworm-minbase"
        )
        old = f"FROM {rootfs.stdout.split()[0]}\nLABEL modelmint.stand-in=old modelmint.stand-in.fingerprint=0000\n"
        subprocess.run(
            ["podman", "build", "-t", name, "-f", "-", "."],
            input=old,
            text=True,
            capture_output=True,
            check=True,
            cwd=ROOT / "containers" / "base",
            env={**os.environ, "CONTAINERS_CONF": str(CONF)},
        )
        stale = _images_sh("base", MODELMINT_IMAGES_BASE=name)
        assert stale.returncode == 0, stale.stdout + stale.stderr
        assert f"stale (fingerprint 0000, want {fingerprint}): rebuilding" in stale.stdout
        assert _label(name, "modelmint.stand-in.fingerprint") == fingerprint
        # and one that is up to date is kept
        kept = _images_sh("base", MODELMINT_IMAGES_BASE=name)
        assert "up to date" in kept.stdout
    finally:
        podman("rmi", "-f", name, check=False)


def test_a_full_disk_is_named_with_podmans_storage_path(small_disk: Any, tmp_path: Path) -> None:
    disk = small_disk("48m")
    storage = tmp_path / "storage.conf"
    storage.write_text(f'[storage]\ndriver = "vfs"\ngraphroot = "{disk}/graph"\nrunroot = "{tmp_path}/run"\n')
    done = _images_sh(
        "base", CONTAINERS_STORAGE_CONF=str(storage), MODELMINT_IMAGES_BASE="localhost/modelmint-test/full:1"
    )
    assert done.returncode == 1
    assert "error: " in done.stderr and "the disk is full" in done.stderr
    assert f"podman's storage {disk}/graph" in done.stderr and "podman info --format" in done.stderr
    assert "Traceback" not in done.stderr
    logs = REAL_HOME / "logs" / "images"
    assert (
        "no space left on device"
        in ((logs / "import.log").read_text() + (logs / "base.log").read_text()).lower()
    )


def test_an_image_whose_pins_disagree_with_toolchains_fails_to_build_naming_both() -> None:
    built("llmcompressor")  # its layers are cached: the build reaches the pins check in seconds
    done = podman(
        "build",
        "--network",
        "none",
        "--build-arg",
        "LLMC_VERSION=0.13.0",
        "-f",
        "containers/llmcompressor/Dockerfile",
        "-t",
        "modelmint-test/llmcompressor:wrong-pins",
        ROOT,
        check=False,
    )
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert (
        "error: build arg LLMC_VERSION=0.13.0 disagrees with toolchains/llmcompressor.env (LLMC_VERSION=0.14.0.1)"
        in said
    )
    assert podman("image", "exists", "modelmint-test/llmcompressor:wrong-pins", check=False).returncode == 1
