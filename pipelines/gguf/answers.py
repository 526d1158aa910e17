"""The bundled questions through llama-server, greedily, with the stops the published Modelfile sets."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from pipelines.chat import jinja as chat_template
from pipelines.chat.families import detect_family
from pipelines.core.answers import MAX_TOKENS, Answer, load_questions
from pipelines.core.errors import ArtifactError
from pipelines.core.ggufheader import inspect_gguf, read_gguf_header
from pipelines.core.runner import stop_process, tool_env
from pipelines.core.toolchains import LlamaCpp
from pipelines.core.vocab import GGUFKey
from pipelines.gguf.validate import check_threads

_START_S = 180.0
SLOTS = 4
"""Questions llama-server answers at once (`-np`: one slot each, continuous batching): the 20 answers of SmolLM2
q4_k_m took 23 s on four slots, 33 s on one and 37 s on eight (docs/quality.md). Greedy answers are the same run
after run for one slot count, but not across counts (ggml computes a batch of rows with other kernels than one
row: 7 of 20 q4_k_m answers identical between one slot and four), so the source and every variant are asked with
the same count, and it is part of the source answers' key."""
_ANSWER_S = 300.0
"""How long one slot may take for one answer before the server counts as hung."""
_SLOT_CTX = 1024
"""Context of each slot: a question's prompt and its MAX_TOKENS answer fit several times over."""
_LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")


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


def _listening_url(log: Path, proc: subprocess.Popen[bytes]) -> str | None:
    """The address llama-server bound itself to (`--port 0`: the kernel picks a free port, so two validations at
    once never race for one), read from the line it logs once the model is loaded (tools/server/server.cpp,
    "listening on"); None when it exited or did not say within _START_S."""
    deadline = time.monotonic() + _START_S
    while time.monotonic() < deadline:
        if m := _LISTENING.search(log.read_text(errors="replace") if log.exists() else ""):
            return m.group(1)
        if proc.poll() is not None:
            return None
        time.sleep(0.2)
    return None


def _log_tail(log: Path) -> str:
    return log.read_text(errors="replace")[-1500:] if log.exists() else ""


def _last_line(log: Path) -> str:
    lines = [line.strip() for line in _log_tail(log).splitlines() if line.strip()]
    return lines[-1] if lines else "(llama-server wrote nothing)"


@dataclass(frozen=True)
class Server:
    """A running llama-server: its address, its process and the log it writes."""

    url: str
    proc: subprocess.Popen[bytes]
    log: Path


@contextlib.contextmanager
def llama_server(gguf: Path, server: Path, *, threads: int, log: Path, args: Sequence[str]) -> Iterator[Server]:
    """llama-server (the binary `server`) serving `gguf` on 127.0.0.1 with `args` (its context, slots, …), up and
    healthy, then stopped and waited for on exit; its output goes to `log`.

    Raises:
        ArtifactError: it did not come up (its log's tail says why).
    """
    # --port 0: the kernel picks a free port, so two servers at once never race for one (_listening_url reads it)
    argv = [str(server), "-m", str(gguf), "--host", "127.0.0.1", "--port", "0", "-t", str(threads), "--no-ui",
            "--no-warmup", *args]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=tool_env())
    try:
        url = _listening_url(log, proc)
        if url is None or not server_healthy(url, proc):
            raise ArtifactError(f"llama-server did not come up with {gguf.name} ({' '.join(args)}):\n{_log_tail(log)}",
                                hint=f"run `modelmint inspect {gguf}`; the GGUF, its arguments or the llama.cpp build "
                                     "is wrong")
        yield Server(url, proc, log)
    finally:
        stop_process(proc, timeout=20)


def answering_args(slots: int) -> list[str]:
    """The answer check's server: `slots` parallel slots of _SLOT_CTX tokens each, below the KL divergence it runs
    beside (nice 5, common/common.cpp set_process_priority): the checks wait on the KL divergence, not on the
    answers, so the answers take what the KL divergence leaves."""
    return ["-c", str(_SLOT_CTX * slots), "-np", str(slots), "--prio", "-1"]


def prompting(gguf: Path) -> str:
    """A digest of everything a GGUF prompts and stops with: every `tokenizer.*` key (vocabulary, merges, special
    token ids, chat template, and so the stop strings its family takes from the template). llama-quantize copies them
    from its input, so a variant's digest is its f16's unless something changed how it is asked or when it stops.

    Raises:
        ArtifactError: not a GGUF that reads.
    """
    header = read_gguf_header(gguf, lambda key, _found: key.startswith(GGUFKey.TOKENIZER_PREFIX))
    return hashlib.sha256(json.dumps(header.metadata, sort_keys=True, default=repr).encode()).hexdigest()


def _complete(url: str, body: dict[str, Any], *, timeout: float) -> Any:
    req = urllib.request.Request(f"{url}/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def answer_questions(gguf: Path, llama: LlamaCpp, *, threads: int, log: Path, variant: str,
                     slots: int = SLOTS, questions: list[str] | None = None,
                     max_tokens: int = MAX_TOKENS) -> list[Answer]:
    """Every bundled question (or `questions`, a probe of them), rendered with the GGUF's own chat template, answered greedily by llama-server with
    the stop strings of its chat family (the Modelfile's PARAMETER stop), at most `max_tokens` tokens each, `slots`
    questions at a time on check_threads(threads) threads; the answers come back in the questions' order.

    Raises:
        ArtifactError: the GGUF has no chat template; llama-server would not start, died or answered nothing
            (the message names the engine and the variant, and quotes the server's last log line).
    """
    try:
        info = inspect_gguf(gguf)
    except ArtifactError as err:  # caught before the engine is started: still say which engine and variant
        raise ArtifactError(f"llama-server cannot answer with {variant} ({gguf.name}): {err.message}",
                            hint=err.hint) from err
    if not info.chat_template:
        raise ArtifactError(f"{gguf} has no chat template to ask the questions with")
    template = info.chat_template
    questions = load_questions() if questions is None else questions
    prompts = [chat_template.render(template, [{"role": "user", "content": q}], add_generation_prompt=True,
                                    bos_token="", eos_token="") for q in questions]
    # One request holding every prompt: llama-server queues them all at once (tools/server/server-context.cpp,
    # handle_completions_impl: one task per prompt, posted together), so which questions share a decoding step
    # follows from the answers alone, not from when separate requests happened to arrive: the same answers every run.
    body = {"prompt": prompts, "n_predict": max_tokens, "temperature": 0.0, "top_k": 1, "seed": 1,
            "stop": list(detect_family(template).stop), "cache_prompt": False}
    with llama_server(gguf, llama.bin("llama-server"), threads=check_threads(threads), log=log,
                      args=answering_args(slots)) as server:
        try:
            got = _complete(server.url, body, timeout=_ANSWER_S * -(-len(prompts) // slots))
        except (OSError, json.JSONDecodeError) as err:  # URLError, a reset or a hang: all OSError
            _died(server, gguf, variant, err)
    results = got if isinstance(got, list) else [got]
    if len(results) != len(questions):
        raise ArtifactError(f"llama-server answered {len(results)} of {len(questions)} questions with {variant} "
                            f"({gguf.name}); its last log line: {_last_line(log)}", hint=f"read {log}")
    out = []
    for q, r in zip(questions, sorted(results, key=lambda r: int(r.get("index", 0))), strict=True):
        kind = r.get("stop_type") or ("eos" if r.get("stopped_eos") else "word" if r.get("stopped_word") else "limit")
        made = r.get("tokens_predicted")
        out.append(Answer(question=q, text=str(r.get("content", "")), stopped=kind in ("eos", "word"),
                          tokens=int(made) if isinstance(made, int) else None))
    return out


def _died(server: Server, gguf: Path, variant: str, err: Exception) -> NoReturn:
    try:  # a server that died closes its connections first: give it a moment to be reaped
        code = server.proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        code = None
    what = f"died (exit code {code})" if code is not None else "stopped answering"
    raise ArtifactError(f"llama-server {what} answering the questions with {variant} ({gguf.name}): {err}; its "
                        f"last log line: {_last_line(server.log)}",
                        hint=f"read {server.log}; rerun the same command once the variant or the llama.cpp build is "
                             "fixed") from err
