"""Modelfile building and publishing from real GGUF headers and source directories (no model weights needed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from registry_env import judged

from pipelines.chat.families import UnsupportedChatTemplate
from pipelines.chat.modelfile import Modelfile, Parameter
from pipelines.core.errors import ConfigError, UnsupportedModel
from pipelines.core.gates import Gate
from pipelines.core.report import parse_report
from pipelines.core.settings import Settings
from pipelines.core.toolchains import llama_cpp
from pipelines.publish.ollama import (
    DEFAULT_NUM_CTX,
    build_modelfile,
    install_into_ollama,
    ollama_commands,
    publish_ollama,
    read_gguf_chat,
)
from pipelines.source.catalog import CatalogEntry

MODELMINT = [str(Path(sys.executable).with_name("modelmint"))]


@pytest.fixture(scope="module")
def settings() -> Settings:
    return Settings.from_env()


@pytest.fixture(scope="module")
def llama_models(settings: Settings) -> Path:
    return llama_cpp(settings).source / "models"


def _write_gguf(path: Path, *, template: str | None, tokens: list[str], eos: int | None, bos: int | None = 0,
                add_bos: bool | None = None, ctx: int = 2048, arch: str = "llama") -> Path:
    """A header-only GGUF written by gguf-py, the library llama.cpp's converter writes with."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(ctx)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    if template is not None:
        w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _qwen_source(tmp: Path, llama_models: Path, **generation: object) -> Path:
    src = tmp / "source"
    src.mkdir()
    template = (llama_models / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text(encoding="utf-8")
    (src / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": template, "eos_token": "<|im_end|>", "bos_token": None, "add_bos_token": False,
        "added_tokens_decoder": {"151643": {"content": "<|endoftext|>"}, "151644": {"content": "<|im_start|>"},
                                 "151645": {"content": "<|im_end|>"}},
    }))
    gen = {"do_sample": True, "eos_token_id": [151645, 151643], "temperature": 0.7, "top_p": 0.8, "top_k": 20,
           "repetition_penalty": 1.05, **generation}
    (src / "generation_config.json").write_text(json.dumps(gen))
    (src / "config.json").write_text(json.dumps({"max_position_embeddings": 32768}))
    (src / "LICENSE").write_text('Apache License\nVersion 2.0 — "as is", \\ no warranty\n')
    return src


@pytest.fixture
def qwen_gguf(tmp_path: Path, llama_models: Path) -> Path:
    # llama.cpp's Qwen2 vocab GGUF: a real header (151k tokens, Qwen2's plain ChatML template embedded).
    out = tmp_path / "out"
    out.mkdir()
    return Path(shutil.copyfile(llama_models / "ggml-vocab-qwen2.gguf", out / "qwen-q8_0.gguf"))


REPORT = {
    "variant": "q8_0", "sha256": "ab" * 32,
    "validation": judged(0.00123, 98.4, ppl=(10.0, 10.031), gate=Gate(0.01, 95.0, 1.02, "tiny")),
    "source": {"kind": "hub", "repo": "Qwen/Qwen2.5-0.5B-Instruct",
               "revision": "7ae557604adf67be50417f59c2c2f167def9a775"},
    "toolchain": {"llama.cpp": "0c1e570"},
}


def _entry() -> CatalogEntry:
    return CatalogEntry.model_validate({
        "name": "qwen2.5", "license": "apache-2.0", "chat_family": "chatml",
        "source": {"repo": "Qwen/Qwen2.5-0.5B-Instruct", "revision": "7ae557604adf67be50417f59c2c2f167def9a775"},
    })


def test_publish_writes_a_modelfile_and_a_model_card(tmp_path: Path, qwen_gguf: Path, llama_models: Path,
                                                      settings: Settings) -> None:
    src = _qwen_source(tmp_path, llama_models)
    published = publish_ollama(qwen_gguf, src, parse_report(REPORT), _entry(), qwen_gguf.parent, settings=settings)
    assert published.paths == [qwen_gguf.parent / "Modelfile", qwen_gguf.parent / "README.md"]
    assert not list(qwen_gguf.parent.glob("*.partial-*"))

    mf = Modelfile.parse(published.modelfile.read_text(encoding="utf-8"))
    assert mf == published.build.modelfile
    assert mf.from_ == "./qwen-q8_0.gguf"
    assert mf.parameter("stop") == ["<|im_end|>", "<|im_start|>", "<|endoftext|>"]
    assert mf.parameter("num_ctx") == [DEFAULT_NUM_CTX]  # 32768 in config.json, bounded to the default
    assert [p for p in mf.parameters if p.name != "stop" and p.name != "num_ctx"] == [
        Parameter("temperature", 0.7), Parameter("top_p", 0.8), Parameter("top_k", 20),
        Parameter("repeat_penalty", 1.05),
    ]
    assert mf.licenses == ('Apache License\nVersion 2.0 — "as is", \\ no warranty',)
    assert "You are Qwen, created by Alibaba Cloud." in (mf.template or "")
    proof = published.build.proof
    assert proof is not None and proof.holds and len(proof.identical) == proof.conversations

    card = published.model_card.read_text(encoding="utf-8")
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["base_model"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert front["quantization"] == "q8_0" and front["license"] == "apache-2.0"
    assert front["validation"]["mean_kl"] == 0.00123 and front["validation"]["passed"] is True
    assert front["modelmint"]["chat_family"] == "chatml"
    assert front["modelmint"]["template_proof"]["different"] == []
    assert "ollama create qwen2.5:q8_0 -f Modelfile" in card


def test_embedded_template_that_disagrees_is_named(tmp_path: Path, qwen_gguf: Path, llama_models: Path,
                                                   settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    src = _qwen_source(tmp_path, llama_models)
    built = build_modelfile(qwen_gguf, src, settings=settings)
    assert built.template_origin == "source:tokenizer_config.json"
    (warning,) = [w for w in built.warnings if "differs" in w]
    assert "qwen-q8_0.gguf" in warning and "follows the source's tokenizer_config.json" in warning
    assert warning in caplog.text
    # Without the source, the GGUF's own (plain ChatML) template is used and proven.
    alone = build_modelfile(qwen_gguf, None, settings=settings)
    assert alone.template_origin == "gguf" and alone.proof is not None and alone.proof.holds
    assert "You are a helpful assistant" in (alone.modelfile.template or "")


def test_template_outside_the_families_says_how_to_write_one(tmp_path: Path, llama_models: Path,
                                                             settings: Settings) -> None:
    unknown = (llama_models / "templates" / "fireworks-ai-llama-3-firefunction-v2.jinja").read_text(encoding="utf-8")
    gguf = _write_gguf(tmp_path / "q3.gguf", template=unknown, tokens=["<|endoftext|>", "<|im_end|>"], eos=1)
    with pytest.raises(UnsupportedChatTemplate, match="not one modelmint can convert") as err:
        build_modelfile(gguf, settings=settings)
    assert "--template FILE" in (err.value.hint or "")
    # The way out the hint names: a hand-written TEMPLATE, used as is and marked unproven.
    built = build_modelfile(gguf, settings=settings, template="{{ range .Messages }}{{ .Content }}{{ end }}")
    assert built.template_origin == "manual" and built.proof is None
    assert built.modelfile.parameter("stop") == ["<|im_end|>"]


def test_tokenizer_without_eos_is_refused(tmp_path: Path, llama_models: Path, settings: Settings) -> None:
    phi = (llama_models / "templates" / "microsoft-Phi-3.5-mini-instruct.jinja").read_text(encoding="utf-8")
    gguf = _write_gguf(tmp_path / "noeos.gguf", template=phi, tokens=["<s>", "</s>", "a"], eos=None)
    with pytest.raises(UnsupportedModel, match="no eos token"):
        build_modelfile(gguf, settings=settings)


def test_system_with_triple_quotes_round_trips(tmp_path: Path, llama_models: Path, settings: Settings) -> None:
    phi = (llama_models / "templates" / "microsoft-Phi-3.5-mini-instruct.jinja").read_text(encoding="utf-8")
    gguf = _write_gguf(tmp_path / "phi.gguf", template=phi, tokens=["<s>", "<|endoftext|>", "<|end|>", "<|user|>",
                                                                   "<|assistant|>"], eos=1, add_bos=True, ctx=4096)
    system = 'Write Python with """docstrings""" and \\n escapes.\nReply in français — "toujours".'
    built = build_modelfile(gguf, settings=settings, system=system)
    text = built.modelfile.to_text()
    assert Modelfile.parse(text).system == system
    assert built.num_ctx == 4096  # the model's own context is shorter than the default
    with pytest.raises(ConfigError, match="beyond the model's context length 4096"):
        build_modelfile(gguf, settings=settings, num_ctx=8192)


def test_greedy_generation_config_means_temperature_zero(tmp_path: Path, qwen_gguf: Path, llama_models: Path,
                                                         settings: Settings) -> None:
    src = _qwen_source(tmp_path, llama_models, do_sample=False)
    built = build_modelfile(qwen_gguf, src, settings=settings)
    assert [p for p in built.modelfile.parameters if p.name not in ("stop", "num_ctx")] == [
        Parameter("temperature", 0.0)]


def test_catalog_family_that_contradicts_the_template(tmp_path: Path, qwen_gguf: Path, llama_models: Path,
                                                      settings: Settings) -> None:
    with pytest.raises(ConfigError, match="set to llama3, but the chat template is chatml"):
        build_modelfile(qwen_gguf, _qwen_source(tmp_path, llama_models), settings=settings, family="llama3")


def test_reads_the_gguf_header_quickly_and_right(llama_models: Path) -> None:
    g = read_gguf_chat(llama_models / "ggml-vocab-llama-bpe.gguf")
    assert (g.bos_text, g.eos_text, g.context_length) == ("<|begin_of_text|>", "<|end_of_text|>", 8192)


def test_ollama_commands() -> None:
    mf = Path("/models/qwen2.5/q4_k_m/Modelfile")
    create, check = ollama_commands(mf, "qwen2.5:q4_k_m")
    assert create == ["ollama", "create", "qwen2.5:q4_k_m", "-f", str(mf)]
    assert check[:3] == ["ollama", "run", "qwen2.5:q4_k_m"] and len(check) == 4
    with pytest.raises(ConfigError):
        ollama_commands(mf, "Qwen 2.5")
    with pytest.raises(TypeError):
        ollama_commands("qwen2.5:q4_k_m", mf)  # type: ignore[arg-type]


def test_without_ollama_the_commands_are_returned_not_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # Ollama cannot be installed here; make sure none is found
    result = install_into_ollama(tmp_path / "Modelfile", "tiny:q8_0")
    assert not result.ran and result.commands == ollama_commands(tmp_path / "Modelfile", "tiny:q8_0")


def test_cli_writes_a_modelfile_or_explains(tmp_path: Path, qwen_gguf: Path, llama_models: Path) -> None:
    src = _qwen_source(tmp_path, llama_models)
    out = tmp_path / "pub" / "Modelfile"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([*MODELMINT, "modelfile", str(qwen_gguf), "--source", str(src), "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert Modelfile.parse(out.read_text(encoding="utf-8")).from_ == str(qwen_gguf.resolve())
    assert "proven on 16 conversations" in done.stderr

    unknown = (llama_models / "templates" / "fireworks-ai-llama-3-firefunction-v2.jinja").read_text(encoding="utf-8")
    bad = _write_gguf(tmp_path / "q3.gguf", template=unknown, tokens=["<|im_end|>"], eos=0)
    failed = subprocess.run([*MODELMINT, "modelfile", str(bad)], capture_output=True, text=True, env=env,
                            timeout=300)
    assert failed.returncode == 1 and "--template FILE" in " ".join(failed.stderr.split())


# The special tokens Gemma 4's chat template prints (a GGUF without them is refused).
GEMMA4_TOKENS = ["<turn|>", "<|turn>", '<|"|>', "<|tool_call>", "<tool_call|>", "<|channel>", "<channel|>",
                 "<|tool>", "<tool|>", "<|tool_response>", "<tool_response|>", "<|image|>", "<|audio|>"]


def test_a_renderer_family_gets_renderer_parser_and_requires(tmp_path: Path, llama_models: Path,
                                                             settings: Settings) -> None:
    gemma4 = (llama_models / "templates" / "google-gemma-4-31B-it.jinja").read_text(encoding="utf-8")
    gguf = _write_gguf(tmp_path / "gemma4.gguf", template=gemma4, tokens=GEMMA4_TOKENS, eos=0)
    # RENDERER gemma4-large renders this Jinja differently (tests/test_ollama_renderers.py): published only forced
    with pytest.raises(UnsupportedChatTemplate, match="RENDERER gemma4-large renders"):
        build_modelfile(gguf, settings=settings)
    built = build_modelfile(gguf, settings=settings, family="gemma4", force=True)
    assert any("published anyway" in w for w in built.warnings)
    mf = built.modelfile
    assert (built.family, mf.template, mf.renderer, mf.parser, mf.requires) == (
        "gemma4", None, "gemma4-large", "gemma4", "0.21.0")
    assert built.proof is None and "'<|tool_call>'" in str(built.evidence)
    text = mf.to_text()
    assert "RENDERER gemma4-large\nPARSER gemma4\nREQUIRES 0.21.0\n" in text and "TEMPLATE" not in text
    assert build_modelfile(gguf, settings=settings, family="gemma4", force=True,
                           ollama_version="0.30.0").modelfile.requires == "0.21.0"
    with pytest.raises(ConfigError, match=r"Ollama 0\.13\.0 is older than this Modelfile needs"):
        build_modelfile(gguf, settings=settings, family="gemma4", force=True, ollama_version="0.13.0")


def test_a_forced_family_is_refused_unless_force(tmp_path: Path, llama_models: Path, settings: Settings) -> None:
    unknown = (llama_models / "templates" / "fireworks-ai-llama-3-firefunction-v2.jinja").read_text(encoding="utf-8")
    gguf = _write_gguf(tmp_path / "smol.gguf", template=unknown, tokens=["<|endoftext|>", "<|im_end|>"], eos=1)
    with pytest.raises(ConfigError, match="not recognised as qwen3") as err:
        build_modelfile(gguf, settings=settings, family="qwen3")
    assert "--force" in (err.value.hint or "")
    built = build_modelfile(gguf, settings=settings, family="qwen3", force=True)
    assert built.family == "qwen3" and built.proof is not None and not built.proof.holds
    assert any("renders differently" in w and "--force" in w for w in built.warnings)
    assert any("using qwen3 as forced" in w for w in built.warnings)


def test_every_family_forced_onto_another_template_builds_or_says_why(tmp_path: Path, llama_models: Path,
                                                                     settings: Settings) -> None:
    """`--family F --force` on a template of another family: a Modelfile with warnings, or one ConfigError
    naming the cause; never an internal error (`--family chatml --force` on a Llama 3 template asserted)."""
    from pipelines.chat.families.core import FAMILIES, UnsupportedChatTemplate

    llama3 = (llama_models / "templates" / "meta-llama-Llama-3.1-8B-Instruct.jinja").read_text(encoding="utf-8")
    gguf = _write_gguf(tmp_path / "llama3.gguf", template=llama3,
                       tokens=["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
                               "<|im_start|>", "<|im_end|>"], eos=1)
    built_any = 0
    for name in sorted(FAMILIES):
        try:
            built = build_modelfile(gguf, settings=settings, family=name, force=True, verify=False)
        except (ConfigError, UnsupportedChatTemplate) as e:
            assert (e.hint and "cannot be built" in e.message) or isinstance(e, ConfigError), (name, e)
            continue
        built_any += 1
        assert (built.family == name and built.modelfile.template) or built.modelfile.renderer, name
    assert built_any >= len(FAMILIES) // 2, built_any


def test_a_proven_family_with_a_parser_gets_template_and_parser(tmp_path: Path, llama_models: Path,
                                                                settings: Settings) -> None:
    ministral = (llama_models / "templates" / "mistralai-Ministral-3-14B-Reasoning-2512.jinja").read_text(encoding="utf-8")
    gguf = _write_gguf(tmp_path / "ministral.gguf", template=ministral, tokens=["<s>", "</s>", "[INST]", "[/INST]"],
                       eos=1, add_bos=True)
    built = build_modelfile(gguf, settings=settings)
    mf = built.modelfile
    assert built.family == "ministral3" and built.proof is not None and built.proof.holds
    assert (mf.renderer, mf.parser, mf.requires) == (None, "ministral", "0.14.0") and mf.template
    assert "PARSER ministral\nREQUIRES 0.14.0\n" in mf.to_text()


def test_a_template_ollama_would_replace_by_its_architecture_renderer_is_refused(
        tmp_path: Path, llama_models: Path, settings: Settings) -> None:
    # Ollama (server/create.go:795-817) sets RENDERER laguna / nemotron-3-nano / gemma4 itself for these GGUF
    # architectures when the Modelfile names none, and that RENDERER replaces the TEMPLATE (server/prompt.go:135-143).
    laguna = (llama_models / "templates" / "poolside-Laguna-XS-2.1.jinja").read_text(encoding="utf-8")
    tokens = ["〈|EOS|〉", "<system>", "<user>", "<assistant>"]
    plain = build_modelfile(_write_gguf(tmp_path / "l.gguf", template=laguna, tokens=tokens, eos=0), settings=settings)
    assert plain.family == "laguna-xs-2.1" and plain.modelfile.template and plain.modelfile.renderer is None

    gguf = _write_gguf(tmp_path / "laguna.gguf", template=laguna, tokens=tokens, eos=0, arch="laguna")
    with pytest.raises(UnsupportedModel) as refused:
        build_modelfile(gguf, settings=settings)
    message = refused.value.message
    assert "GGUF architecture laguna" in message and "RENDERER laguna" in message, message
    assert "server/create.go:795-817" in message and "proven laguna-xs-2.1 TEMPLATE" in message
    assert "--force" in refused.value.hint
    forced = build_modelfile(gguf, settings=settings, force=True)
    assert any("published anyway" in w for w in forced.warnings)
    assert "Ollama adds RENDERER laguna and PARSER laguna itself" in forced.modelfile.to_text()

    chatml = (llama_models / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text(encoding="utf-8")
    for arch in ("nemotron_h", "nemotron_h_moe"):
        nemo = _write_gguf(tmp_path / f"{arch}.gguf", template=chatml, tokens=["<|im_start|>", "<|im_end|>"], eos=1,
                           arch=arch)
        with pytest.raises(UnsupportedModel, match="sets RENDERER nemotron-3-nano itself"):
            build_modelfile(nemo, settings=settings)
        with pytest.raises(UnsupportedModel, match=f"architecture {arch}"):
            build_modelfile(nemo, settings=settings, template="{{ .Prompt }}")

    # naming the RENDERER and PARSER leaves Ollama nothing to add
    gemma4 = (llama_models / "templates" / "google-gemma-4-31B-it.jinja").read_text(encoding="utf-8")
    g4 = build_modelfile(_write_gguf(tmp_path / "g4.gguf", template=gemma4, tokens=GEMMA4_TOKENS, eos=0, add_bos=True,
                                     arch="gemma4"), settings=settings, family="gemma4", force=True)
    assert (g4.modelfile.renderer, g4.modelfile.parser) == ("gemma4-large", "gemma4")
    assert [w for w in g4.warnings if "architecture" in w] == []

    out = tmp_path / "pub" / "Modelfile"
    cli = _cli("modelfile", str(gguf), "--out", str(out))
    assert cli.returncode == 1 and "Traceback" not in cli.stderr and not out.exists()
    assert "RENDERER laguna" in cli.stderr and "--force" in cli.stderr


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "400"}
    return subprocess.run([*MODELMINT, *args], capture_output=True, text=True, env=env, timeout=300)


def test_cli_template_converts_a_bare_chat_template(llama_models: Path) -> None:
    templates = llama_models / "templates"
    done = _cli("template", str(templates / "Qwen-Qwen3-0.6B.jinja"), "--eos", "<|im_end|>", "--no-engine-bos")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith('TEMPLATE """') and "<think>" in done.stdout
    assert "family: qwen3" in done.stderr and "proof think-off: byte-identical" in done.stderr
    assert "note: " in done.stderr and "evidence: '<|im_start|>'" in done.stderr

    renderer = _cli("template", str(templates / "google-gemma-4-31B-it.jinja"))
    assert renderer.returncode == 1 and renderer.stdout == "" and "RENDERER gemma4-large renders" in renderer.stderr

    refused = _cli("template", str(templates / "GLM-4.6.jinja").replace("4.6", "4.6-missing"))
    assert refused.returncode == 1 and "cannot read" in refused.stderr

    unknown = _cli("template", str(templates / "fireworks-ai-llama-3-firefunction-v2.jinja"))
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert "--template FILE" in " ".join(unknown.stderr.split())

    forced = _cli("template", str(templates / "Bielik-11B-v3.0-Instruct.jinja"), "--family", "qwen3")
    assert forced.returncode == 1 and "--force" in " ".join(forced.stderr.split())
    warned = _cli("template", str(templates / "Bielik-11B-v3.0-Instruct.jinja"), "--family", "qwen3", "--force",
                  "--eos", "<|im_end|>")
    assert warned.returncode == 0 and "warning: " in warned.stderr and "renders differently" in warned.stderr


def test_cli_modelfile_explain(tmp_path: Path, qwen_gguf: Path, llama_models: Path) -> None:
    done = _cli("modelfile", str(qwen_gguf), "--source", str(_qwen_source(tmp_path, llama_models)), "--explain")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("# Generated by modelmint")
    assert "family: chatml" in done.stderr and "evidence: '<|im_start|>'" in done.stderr
    assert "proof tool-round-trip: byte-identical" in done.stderr


def test_a_renderer_family_whose_renderer_differs_publishes_no_card(tmp_path: Path, llama_models: Path,
                                                                    settings: Settings) -> None:
    gemma4 = (llama_models / "templates" / "google-gemma-4-31B-it.jinja").read_text(encoding="utf-8")
    gguf = _write_gguf(tmp_path / "gemma4.gguf", template=gemma4, tokens=GEMMA4_TOKENS, eos=0)
    entry = CatalogEntry.model_validate({"name": "gemma4", "license": "mit",
                                         "source": {"repo": "google/gemma-4-31B-it", "revision": "0" * 40}})
    # RENDERER gemma4-large renders this Jinja differently (tests/test_ollama_renderers.py): nothing is published
    with pytest.raises(UnsupportedChatTemplate, match="RENDERER gemma4-large renders"):
        publish_ollama(gguf, None, parse_report(REPORT), entry, tmp_path / "pub", settings=settings)
    assert not (tmp_path / "pub").exists() or not any((tmp_path / "pub").iterdir())


def test_a_tokenizer_without_the_templates_special_tokens_is_refused(tmp_path: Path, llama_models: Path,
                                                                    settings: Settings) -> None:
    qwen3 = (llama_models / "templates" / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8")
    gguf = _write_gguf(tmp_path / "q3.gguf", template=qwen3, tokens=["<|endoftext|>", "<|im_end|>"], eos=1)
    with pytest.raises(UnsupportedModel, match=r"lacks the special tokens <\|im_start\|> that the qwen3") as err:
        build_modelfile(gguf, settings=settings)
    assert "--force" in (err.value.hint or "")
    built = build_modelfile(gguf, settings=settings, force=True)
    assert built.family == "qwen3" and any("lacks the special tokens" in w for w in built.warnings)
    full = _write_gguf(tmp_path / "q3ok.gguf", template=qwen3, tokens=["<|endoftext|>", "<|im_end|>", "<|im_start|>"],
                       eos=1)
    assert build_modelfile(full, settings=settings).proof is not None


def test_a_family_refused_for_tool_use_says_so_in_the_modelfile(tmp_path: Path, llama_models: Path,
                                                                settings: Settings) -> None:
    """LFM2.5 Instruct's TEMPLATE is proven and its .Tools makes Ollama list the model as tool-capable, but its Jinja
    writes nothing for a tool call, so no parser gets the calls back: the Modelfile and the warnings say so."""
    jinja = (llama_models / "templates" / "LFM2.5-Instruct.jinja").read_text(encoding="utf-8")
    gguf = _write_gguf(tmp_path / "lfm.gguf", template=jinja, tokens=["<|startoftext|>", "<|im_end|>", "<|im_start|>"],
                       eos=1, bos=0, add_bos=True)
    built = build_modelfile(gguf, settings=settings)
    assert built.family == "lfm2.5" and built.modelfile.template and ".Tools" in built.modelfile.template
    assert any("tool use refused" in w for w in built.warnings), built.warnings
    assert "# Tool use: refused: its Jinja writes nothing" in built.modelfile.to_text()
