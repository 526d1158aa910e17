"""The bundled questions through llama-server, greedily, with the stops the published Modelfile sets."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipelines.chat import jinja as chat_template
from pipelines.chat.families import detect_family
from pipelines.core.answers import MAX_TOKENS, Answer, load_questions
from pipelines.core.errors import ArtifactError
from pipelines.core.ggufheader import inspect_gguf
from pipelines.core.runner import tool_env
from pipelines.core.toolchains import LlamaCpp

_START_S = 180.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_healthy(url: str, proc: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + _START_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.3)
    return False


def _log_tail(log: Path) -> str:
    return log.read_text(errors="replace")[-1500:] if log.exists() else ""


@contextlib.contextmanager
def llama_server(gguf: Path, llama: LlamaCpp, *, threads: int, log: Path) -> Iterator[str]:
    """llama-server serving `gguf` on 127.0.0.1, stopped (and waited for) on exit; yields its URL.

    Raises:
        ArtifactError: it did not come up (its log's tail says why).
    """
    argv = [str(llama.bin("llama-server")), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(_free_port()),
            "-c", "1024", "-np", "1", "-t", str(threads), "--no-ui", "--no-warmup"]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=tool_env())
    try:
        url = f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"
        if not server_healthy(url, proc):
            raise ArtifactError(f"llama-server did not come up with {gguf.name}:\n{_log_tail(log)}",
                                hint=f"run `modelmint inspect {gguf}`; the GGUF or the llama.cpp build is broken")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _complete(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(f"{url}/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


def answer_questions(gguf: Path, llama: LlamaCpp, *, threads: int, log: Path, variant: str) -> list[Answer]:
    """Every bundled question, rendered with the GGUF's own chat template, answered greedily by llama-server with
    the stop strings of its chat family (the Modelfile's PARAMETER stop), at most MAX_TOKENS tokens each.

    Raises:
        ArtifactError: the GGUF has no chat template; llama-server would not start, died or answered nothing
            (the message names the engine and the variant).
    """
    try:
        info = inspect_gguf(gguf)
    except ArtifactError as err:  # caught before the engine is started: still say which engine and variant
        raise ArtifactError(f"llama-server cannot answer with {variant} ({gguf.name}): {err.message}",
                            hint=err.hint) from err
    if not info.chat_template:
        raise ArtifactError(f"{gguf} has no chat template to ask the questions with")
    stop = list(detect_family(info.chat_template).stop)
    out = []
    with llama_server(gguf, llama, threads=threads, log=log) as url:
        for q in load_questions():
            prompt = chat_template.render(info.chat_template, [{"role": "user", "content": q}],
                                          add_generation_prompt=True, bos_token="", eos_token="")
            body = {"prompt": prompt, "n_predict": MAX_TOKENS, "temperature": 0.0, "top_k": 1, "seed": 1,
                    "stop": stop, "cache_prompt": False}
            try:
                got = _complete(url, body)
            except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError) as err:
                raise ArtifactError(f"llama-server crashed or hung answering {q!r} with {variant} ({gguf.name}): "
                                    f"{err}\n{_log_tail(log)}", hint="read the log above; rerun the same command "
                                    "once the variant or the llama.cpp build is fixed") from err
            kind = got.get("stop_type") or ("eos" if got.get("stopped_eos") else "word" if got.get("stopped_word") else "limit")
            out.append(Answer(question=q, text=str(got.get("content", "")), stopped=kind in ("eos", "word")))
    return out
