"""Proof of the RENDERER mappings: Ollama's renderer (tests/ollama_renderers.py, written from Ollama's source) on
Ollama's own test vectors, then byte for byte against the model's Jinja over the conversation suite.

The vectors (tests/data/ollama_renderer_vectors.json) are cases of Ollama's model/renderers/*_test.go at the pinned
commit: the expected prompts copied verbatim, the inputs transcribed to /api/chat JSON. The Jinja is given the
suite's tools in the key order Ollama's API holds them in (its Go structs), the one normalisation. A family's recorded
`renderer_differs` must be exactly the conversations on which the reimplementation and the Jinja differ; a family
with any is refused at publish time with them named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from pipelines.chat.coverage import classify, templates_tree
from pipelines.chat.families import FAMILIES, TemplateTokens, UnsupportedChatTemplate, detect_family
from pipelines.chat.proof import SUITE, ollama_messages, render_both, render_hf
from pipelines.chat.renderers import RENDERERS as OLLAMA_RENDERER_NAMES
from pipelines.core.errors import UnsupportedModel
from pipelines.core.settings import Settings
from pipelines.publish.ollama import convert_template
from tests.ollama_renderers import RENDERERS, go_json, go_tool

VECTORS = json.loads((Path(__file__).parent / "data" / "ollama_renderer_vectors.json").read_text(encoding="utf-8"))
TODAY = date(2026, 11, 26)

# The template each reimplemented RENDERER is mapped to, with the special tokens its Jinja prints.
CHECKED: dict[str, tuple[str, TemplateTokens]] = {
    "deepseek-ai-DeepSeek-V3.1.jinja": ("deepseek3.1", TemplateTokens("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>")),
    "Qwen3-Coder.jinja": ("qwen3-coder", TemplateTokens(None, "<|im_end|>", engine_adds_bos=False)),
    "GLM-4.7-Flash.jinja": ("glm-4.7", TemplateTokens(None, "<|endoftext|>", engine_adds_bos=False)),
    "LFM2-8B-A1B.jinja": ("lfm2", TemplateTokens("<|startoftext|>", "<|im_end|>")),
    "poolside-Laguna-XS.2.jinja": ("laguna", TemplateTokens("〈|EOS|〉", "〈|EOS|〉")),
    "Cohere2MoE.jinja": ("cohere2", TemplateTokens("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>")),
    "muse-glimmer.jinja": ("glimmer", TemplateTokens("<|begin_of_text|>", "<|eot|>")),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": ("nemotron-3-nano",
                                                  TemplateTokens(None, "<|im_end|>", engine_adds_bos=False)),
    "Qwen3.5-4B.jinja": ("qwen3.5", TemplateTokens(None, "<|im_end|>", engine_adds_bos=False)),
    "google-gemma-4-31B-it.jinja": ("gemma4", TemplateTokens("<bos>", "<turn|>")),
    "google-gemma-4-31B-it-interleaved.jinja": ("gemma4-interleaved", TemplateTokens("<bos>", "<turn|>")),
}

# Templates published with a proven TEMPLATE (and Ollama's PARSER) instead of Ollama's RENDERER, which renders them
# differently: the RENDERER and the conversations on which it differs. Glimmer's differs only where the conversation
# ends in an assistant message: Ollama hands that message to a TEMPLATE to continue (template/template.go:272-281,
# and the legacy path cuts the template after .Response, :326-346; server/routes.go:2685-2691 tells the PARSER it is
# a prefill), while RENDERER glimmer closes it and opens a new turn (model/renderers/glimmer.go:341-367).
_WITH_TOOLS = ("tools-offered", "tools-offered-no-system", "tool-call-and-result", "tool-round-trip",
               "parallel-tool-calls", "tool-call-nested-arguments", "reasoning-in-tool-loop")
TEMPLATE_INSTEAD: dict[str, tuple[str, tuple[str, ...]]] = {
    "muse-glimmer.jinja": ("glimmer", ("continue-assistant",)),
    "LFM2-8B-A1B.jinja": ("lfm2", _WITH_TOOLS),
    "Qwen3.5-4B.jinja": ("qwen3.5", _WITH_TOOLS),
    "Qwen3-Coder.jinja": ("qwen3-coder", _WITH_TOOLS),
    "GLM-4.7-Flash.jinja": ("glm-4.7", ("continue-assistant", *_WITH_TOOLS[:-1], "reasoning-in-history",
                                        "reasoning-in-tool-loop")),
    "deepseek-ai-DeepSeek-V3.1.jinja": ("deepseek3.1", ("user", "system-user", "multi-turn", "system-multi-turn",
                                                        "continue-assistant", "special-characters", *_WITH_TOOLS[:-1],
                                                        "reasoning-in-history", "think-off", "reasoning-in-tool-loop")),
    # RENDERER cohere leaves the Jinja's platform instructions to a Modelfile SYSTEM (and Ollama does not set it
    # itself for any GGUF architecture, server/create.go:795-817): every conversation differs.
    "Cohere2MoE.jinja": ("cohere", tuple(c.name for c in SUITE)),
}


def _renderer(name: str) -> str:
    renderer = TEMPLATE_INSTEAD[name][0] if name in TEMPLATE_INSTEAD else FAMILIES[CHECKED[name][0]].renderer
    assert renderer is not None
    return renderer


@pytest.fixture(scope="module")
def templates_dir(settings: Settings) -> Path:
    return templates_tree(settings)[0]


def _cases() -> list[Any]:
    return [pytest.param(name, case, id=f"{name}:{case['name']}")
            for name, data in VECTORS["renderers"].items() for case in data["cases"]]


@pytest.mark.parametrize(("renderer", "case"), _cases())
def test_the_reimplementation_writes_what_ollamas_own_tests_expect(renderer: str, case: dict[str, Any]) -> None:
    assert renderer in OLLAMA_RENDERER_NAMES
    got = RENDERERS[renderer](case["messages"], case["tools"], case["think"])
    if "expected" in case:
        assert got == case["expected"]
    for part in case.get("contains", ()):  # where Ollama's test checks a part of the prompt
        assert part in got
    if case.get("ends_with"):
        assert got.endswith(case["contains"][-1])
    for part in case.get("absent", ()):
        assert part not in got


def test_every_reimplemented_renderer_has_vectors_and_a_template() -> None:
    assert set(VECTORS["renderers"]) == set(RENDERERS)
    assert {_renderer(n) for n in CHECKED} == set(RENDERERS) - {"lfm2-thinking", "gemma4"}
    assert all(len(v["cases"]) >= 3 for v in VECTORS["renderers"].values())


def test_go_json_escapes_as_encoding_json_does() -> None:
    # encoding/json: HTML-escaped, compact, non-ASCII kept, float64 numbers without a fraction when integral
    assert go_json({"q": "a<b & c>d", "n": 3.0, "x": 2.5, "s": "日本\u2028"}) == \
        '{"q":"a\\u003cb \\u0026 c\\u003ed","n":3,"x":2.5,"s":"日本\\u2028"}'


def _differs(templates_dir: Path, name: str) -> list[str]:
    family_name, tokens = CHECKED[name]
    fam = FAMILIES[family_name]
    jinja = (templates_dir / name).read_text(encoding="utf-8")
    differs = []
    for conv in SUITE:
        # The one normalisation: the Jinja gets the tools in the key order Ollama's API holds them in (Go structs,
        # api/types.go:305-309, 418-426, 473-490), which no client can change; values are the same.
        as_ollama_holds = replace(conv, tools=tuple(go_tool(t) for t in conv.tools) if conv.tools else None)
        try:
            hf: str | None = render_hf(jinja, as_ollama_holds, fam, tokens, now=TODAY)
        except UnsupportedModel:
            hf = None
        ollama = RENDERERS[_renderer(name)](ollama_messages(conv), list(conv.tools) if conv.tools else None, conv.think)
        if tokens.engine_adds_bos and tokens.bos and not ollama.startswith(tokens.bos):
            # the runner's tokenizer adds the BOS token (llm/llama_server.go:243-255 completionPrompt)
            ollama = tokens.bos + ollama
        if hf != ollama:
            differs.append(conv.name)
    return differs


@pytest.mark.parametrize("name", sorted(CHECKED))
def test_the_recorded_differences_are_the_measured_ones(templates_dir: Path, name: str) -> None:
    if name in TEMPLATE_INSTEAD:
        assert list(TEMPLATE_INSTEAD[name][1]) == _differs(templates_dir, name)
        return
    fam = FAMILIES[CHECKED[name][0]]
    assert fam.renderer_differs is not None, f"{fam.name}: record its measured differences ({_differs(templates_dir, name)})"
    assert list(fam.renderer_differs) == _differs(templates_dir, name)


@pytest.mark.parametrize("name", sorted(set(CHECKED) - set(TEMPLATE_INSTEAD)))
def test_a_renderer_that_renders_differently_is_refused_with_the_conversations(
        templates_dir: Path, settings: Settings, name: str) -> None:
    family_name, tokens = CHECKED[name]
    jinja = (templates_dir / name).read_text(encoding="utf-8")
    differs = _differs(templates_dir, name)
    assert differs, "a proven-identical mapping is published: this test is for the refused ones"
    with pytest.raises(UnsupportedChatTemplate, match=f"RENDERER {FAMILIES[family_name].renderer} renders") as err:
        detect_family(jinja)
    assert all(c in err.value.message for c in differs) and "--template" in (err.value.hint or "")
    assert family_name not in err.value.families  # the hint lists the families modelmint publishes
    with pytest.raises(UnsupportedChatTemplate, match=r"renders this .* differently"):
        convert_template(jinja, tokens, settings)
    row = classify(name, jinja)
    assert (row.kind, row.family, row.differs) == ("refused", family_name, tuple(differs))


@pytest.mark.parametrize("name", sorted(TEMPLATE_INSTEAD))
def test_a_template_whose_renderer_differs_is_published_with_its_proven_template_and_parser(
        templates_dir: Path, settings: Settings, name: str) -> None:
    # modelmint names no RENDERER: the TEMPLATE (proven on the whole suite in tests/test_ollama_templates.py) and
    # Ollama's PARSER of the same name for the model's output where modelmint has checked it
    family_name, tokens = CHECKED[name]
    jinja = (templates_dir / name).read_text(encoding="utf-8")
    fam = FAMILIES[family_name]
    assert detect_family(jinja) is fam and fam.build is not None and fam.renderer is None
    assert fam.parser in (None, _renderer(name))
    done = convert_template(jinja, tokens, settings)
    assert done.lines.startswith('TEMPLATE """') and "\nRENDERER " not in done.lines
    assert (f"\nPARSER {fam.parser}\n" in done.lines) if fam.parser else ("\nPARSER " not in done.lines)
    row = classify(name, jinja)
    assert (row.kind, row.family) == ("proven", family_name)


def test_ollama_continues_a_final_assistant_message_through_the_template_not_renderer_glimmer(
        templates_dir: Path, settings: Settings) -> None:
    name = "muse-glimmer.jinja"
    family_name, tokens = CHECKED[name]
    jinja = (templates_dir / name).read_text(encoding="utf-8")
    conv = next(c for c in SUITE if c.name == "continue-assistant")
    fam = FAMILIES[family_name]
    hf = render_hf(jinja, conv, fam, tokens, now=TODAY)
    renderer = RENDERERS[_renderer(name)](ollama_messages(conv), None, None)
    # the Jinja leaves the final assistant message open; Ollama's RENDERER closes it and opens a new turn
    assert hf.endswith("to=user<|message|>The sky is")
    assert renderer.endswith("to=user<|message|>The sky is<|eot|><|start|>assistant")
    # the TEMPLATE, run by Go's text/template as Ollama runs it, continues the message as the Jinja does
    [rendering] = render_both(jinja, fam.template(jinja, tokens), fam, tokens, settings, conversations=(conv,), now=TODAY)
    assert rendering.ollama == hf


def test_the_cli_refuses_a_mismatched_renderer_naming_the_conversations(templates_dir: Path) -> None:
    # python -m, so the command imports this checkout
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "template", str(templates_dir / "poolside-Laguna-XS.2.jinja")],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "400"})
    said = " ".join(done.stderr.split())
    assert done.returncode == 1 and done.stdout == "" and "Traceback" not in done.stderr
    assert "RENDERER laguna renders this laguna template differently" in said and "tool-round-trip" in said
    assert "--template FILE" in said


def test_a_family_named_by_hand_is_refused_too_unless_forced(templates_dir: Path, settings: Settings) -> None:
    # The catalog's chat_family and `--family` name the family instead of detecting it: the same refusal applies.
    name = "poolside-Laguna-XS.2.jinja"
    family_name, tokens = CHECKED[name]
    jinja = (templates_dir / name).read_text(encoding="utf-8")
    with pytest.raises(UnsupportedChatTemplate, match=r"RENDERER laguna renders"):
        convert_template(jinja, tokens, settings, family=family_name)
    forced = convert_template(jinja, tokens, settings, family=family_name, force=True)
    assert "RENDERER laguna\n" in forced.lines and any("published anyway" in w for w in forced.warnings)
