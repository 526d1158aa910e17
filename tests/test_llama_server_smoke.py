"""The published Modelfile through the real engine: llama-server on 127.0.0.1 with the tiny quant.

The prompt is what our TEMPLATE renders (Go, as Ollama renders it). A tiny model's text is noise, so
the test forces each stop token of the Modelfile into the output (a grammar lets a few free tokens
through, then only the stop token) and checks that generation ends exactly there: on the token itself
when the engine counts it as end-of-generation, else on the stop string, as Ollama's runner does.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from pipelines.chat import jinja as chat_template
from pipelines.chat.gotemplate import OllamaRequest, render
from pipelines.chat.modelfile import Modelfile
from pipelines.chat.proof import SYSTEM, TOOLS, ollama_messages
from pipelines.core.runner import run
from pipelines.core.settings import Settings, project_root
from pipelines.core.toolchains import llama_cpp
from pipelines.gguf.answers import server_healthy  # the answer check's own wait for llama-server
from pipelines.gguf.build import ensure_base, ensure_quant, plan_gguf
from pipelines.publish.ollama import OllamaModelfile, build_modelfile, publish_ollama, read_source_chat
from pipelines.source.catalog import CatalogEntry, load_catalog

pytestmark = pytest.mark.slow

CONVERSATION = ({"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is the capital of France?"})
FREE_TOKENS = 3
N_PREDICT = 24


@dataclass(frozen=True)
class Tiny:
    gguf: Path
    source: Path
    settings: Settings


def _tiny_entry(settings: Settings, tmp: Path) -> CatalogEntry:
    """The catalog's tiny-qwen2; until pipelines.source.tinymodel (which generates it) is in the tree, the same
    model made by the generator it wraps, pipelines/scripts/make_tiny_model.py, as a local source."""
    if importlib.util.find_spec("pipelines.source.tinymodel") is not None:
        return load_catalog(settings.catalog_path).get("tiny-qwen2")
    llama = llama_cpp(settings)
    model = tmp / "tiny-qwen2"
    data = project_root() / "pipelines" / "data"
    run([llama.python, project_root() / "pipelines" / "scripts" / "make_tiny_model.py", "generate",
         "--family", "qwen2", "--out", model, "--llama-cpp-src", llama.source, "--train-text", data / "train.txt",
         "--eval-text", data / "eval.txt", "--train-steps", "20", "--threads", str(settings.effective_threads)],
        timeout=1800)
    return CatalogEntry.model_validate({"name": "tiny-qwen2", "source": {"path": str(model)},
                                        "license": "apache-2.0", "gate_profile": "tiny"})


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    """tiny-qwen2 (real Qwen2 tokenizer and Qwen2.5 chat template) converted and quantized to q8_0."""
    settings = replace(Settings.from_env(), work_dir=tmp_path_factory.mktemp("work"))
    entry = _tiny_entry(settings, tmp_path_factory.mktemp("source"))
    plan = plan_gguf(entry, settings, quants=["q8_0"])
    ensure_base(plan)
    ensure_quant(plan, "q8_0")
    return Tiny(plan.quant_path("q8_0"), Path(plan.snapshot.path), settings)


@pytest.fixture(scope="session")
def built(tiny: Tiny) -> OllamaModelfile:
    return build_modelfile(tiny.gguf, tiny.source, settings=tiny.settings, verify=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as err:
        raise AssertionError(f"{url} answered {err.code}: {err.read().decode(errors='replace')}") from err


@pytest.fixture(scope="session")
def server(tiny: Tiny, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """llama-server on 127.0.0.1 and a free port; special tokens printed as text, as Ollama's runner does."""
    log = tmp_path_factory.mktemp("server") / "llama-server.log"
    for _attempt in range(3):
        port = _free_port()
        argv = [
            str(llama_cpp(tiny.settings).bin("llama-server")), "-m", str(tiny.gguf), "--host", "127.0.0.1",
            "--port", str(port), "-c", "2048", "-np", "1", "-t", str(tiny.settings.effective_threads),
            "--special", "--no-ui", "--no-warmup",
        ]
        with open(log, "wb") as fh:
            proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        if server_healthy(url, proc):
            break
        _stop(proc)  # the port was taken in between, or it never came up: try another port
    else:
        raise AssertionError(f"llama-server did not start:\n{log.read_text(errors='replace')[-3000:]}")
    try:
        yield url
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _prompt(built: OllamaModelfile, settings: Settings, conversation: tuple[dict[str, Any], ...] = CONVERSATION,
            tools: tuple[dict[str, Any], ...] | None = None) -> str:
    from pipelines.chat.proof import Conversation

    conv = Conversation("smoke", conversation, tools)
    return render(OllamaRequest(built.modelfile.template or "", tuple(ollama_messages(conv)), tools), settings)


def _single_token(url: str, text: str) -> int | None:
    ids = _post(f"{url}/tokenize", {"content": text, "add_special": False, "parse_special": True})["tokens"]
    return ids[0] if len(ids) == 1 else None


def test_the_modelfile_is_published_beside_the_quant(tiny: Tiny, built: OllamaModelfile) -> None:
    entry = load_catalog(tiny.settings.catalog_path).get("tiny-qwen2")
    files = publish_ollama(tiny.gguf, tiny.source, None, entry, settings=tiny.settings)
    assert files.paths == [tiny.gguf.parent / "Modelfile", tiny.gguf.parent / "README.md"]
    mf = Modelfile.parse(files.modelfile.read_text(encoding="utf-8"))
    assert mf.from_ == f"./{tiny.gguf.name}" and mf == built.modelfile
    assert built.family == "chatml" and built.proof is not None and built.proof.holds
    assert "<|im_end|>" in built.stops and built.num_ctx == 8192


def test_our_prompt_is_the_source_templates_prompt_token_for_token(tiny: Tiny, built: OllamaModelfile,
                                                                    server: str) -> None:
    jinja = read_source_chat(tiny.source).chat_template
    assert jinja
    for tools in (None, TOOLS):
        ours = _prompt(built, tiny.settings, tools=tools)
        theirs = chat_template.render(jinja, list(CONVERSATION), tools=list(tools) if tools else None)
        assert ours == theirs
        tokens = _post(f"{server}/tokenize", {"content": ours, "add_special": True, "parse_special": True})["tokens"]
        # The TEMPLATE's markers reach the model as its special tokens, not as text pieces.
        assert tokens[0] == _single_token(server, "<|im_start|>")
        assert tokens.count(_single_token(server, "<|im_end|>")) == 2


def _stops_at(url: str, prompt: str, stop_id: int, stops: list[str]) -> dict[str, Any]:
    """Generate FREE_TOKENS tokens other than the stop token, then the stop token, and see what happens."""
    # Is it an end-of-generation token for the engine? Then nothing may follow it.
    probe = _post(f"{url}/completion", {"prompt": prompt, "n_predict": 2, "temperature": 0,
                                        "logit_bias": [[stop_id, 100]], "return_tokens": True})
    eog = probe["tokens"] == [stop_id] and probe["stop_type"] == "eos"
    body: dict[str, Any] = {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "return_tokens": True,
                            "stop": stops}
    if eog:
        # A grammar cannot name an end-of-generation token; once it is complete only those may follow,
        # and the bias picks ours among them.
        body |= {"grammar": f"root ::= !<[{stop_id}]>{{{FREE_TOKENS}}}", "logit_bias": [[stop_id, 50]]}
    else:
        body |= {"grammar": f"root ::= !<[{stop_id}]>{{{FREE_TOKENS}}} <[{stop_id}]> !<[{stop_id}]>*"}
    return {"eog": eog, **_post(f"{url}/completion", body)}


def test_generation_stops_on_every_stop_token_of_the_modelfile(built: OllamaModelfile, server: str,
                                                               tiny: Tiny) -> None:
    prompt = _prompt(built, tiny.settings)
    stops = list(built.stops)
    exercised = {}
    for stop in stops:
        stop_id = _single_token(server, stop)
        assert stop_id is not None, f"stop {stop!r} is not one token of this vocabulary"
        r = _stops_at(server, prompt, stop_id, stops)
        assert r["stop"] is True and r["tokens_predicted"] == FREE_TOKENS + 1, r
        assert r["tokens"][-1] == stop_id, r
        if r["eog"]:
            assert r["stop_type"] == "eos", r
        else:
            assert (r["stop_type"], r["stopping_word"]) == ("word", stop), r
            assert stop not in r["content"]
        exercised[stop] = r["stop_type"]
    # Both ways of stopping were exercised: end-of-generation tokens and stop strings.
    assert exercised["<|im_end|>"] == "eos" and exercised["<|im_start|>"] == "word"


def test_without_our_stops_the_noise_runs_to_the_limit(built: OllamaModelfile, server: str, tiny: Tiny) -> None:
    # The control: with the stop tokens kept out, the same request would not have stopped by itself.
    prompt = _prompt(built, tiny.settings)
    ban = [[_single_token(server, s), False] for s in built.stops]
    r = _post(f"{server}/completion", {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0,
                                       "logit_bias": ban, "stop": list(built.stops)})
    assert r["stop_type"] == "limit" and r["tokens_predicted"] == N_PREDICT
