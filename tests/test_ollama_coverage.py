"""Coverage of the pinned llama.cpp tree's chat templates: each is proven, mapped to an Ollama RENDERER, or refused.

The survey runs over every `models/templates/*.jinja` of the pinned tree; docs/ollama-families.md is its
generated table and must be current. Proven templates are the ones tests/test_ollama_templates.py proves
byte-identical on the conversation suite; renderer-mapped ones name a RENDERER and PARSER Ollama ships
(pipelines.chat.renderers, read from Ollama's source at a named tag).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.chat.coverage import DOC, Coverage, classify, render_doc, survey, templates_tree
from pipelines.chat.families import (
    FAMILIES,
    TemplateTokens,
    UnsupportedChatTemplate,
    detect_family,
    go_blockers,
    go_blockers_at,
)
from pipelines.chat.renderers import (
    COMMAND_SINCE,
    PARSERS,
    RENDERERS,
    check_ollama_version,
    required_version,
    version_key,
)
from pipelines.core.errors import ConfigError
from pipelines.core.settings import Settings
from pipelines.publish.ollama import convert_template
from tests.test_ollama_templates import CLAIMED

# The floor reached; raise it as families are added. (It was 46 until nine RENDERER mappings, Qwen3-Coder, DeepSeek
# V3.1, GLM-4.7, LFM2, Laguna XS.2, Cohere2 MoE, Muse Glimmer, Nemotron 3 Nano and Qwen3.5, were checked against their
# Jinja (tests/test_ollama_renderers.py) and found to render differently: now refused; 48 with llama.cpp's own
# DeepSeek-R1 template, 54 with proven TEMPLATEs in place of the RENDERERs of Muse Glimmer, LFM2, Qwen3.5,
# Qwen3-Coder, GLM-4.7 and DeepSeek V3.1, 55 with Command R7B, 56 with Command R+, 57 with gpt-oss, 58 with
# Apriel 1.6, 59 with Kimi K3, 60 with MiniCPM 5, 61 with Reka Edge; 59 once Ollama's gemma4 RENDERER was checked
# against both Gemma 4 templates and found to render differently, with no TEMPLATE able to stand in for a gemma4
# GGUF; 60 with Cohere2 MoE, whose RENDERER Ollama does not force, as a proven TEMPLATE; 62 with GigaChat 3 and 3.1;
# 63 with Apertus, 64 with Functionary medium v3.2, 65 with NVIDIA Nemotron Nano v2.)
COVERED_AT_LEAST = 65


@pytest.fixture(scope="module")
def tree(settings: Settings) -> tuple[Path, str]:
    return templates_tree(settings)


def test_docs_table_is_current(tree: tuple[Path, str]) -> None:
    expected = render_doc(survey(tree[0]), tree[1])
    assert DOC.read_text(encoding="utf-8") == expected, (
        "docs/ollama-families.md is out of date: run `.venv/bin/python -m pipelines.chat.coverage --write`")


def test_survey_counts(tree: tuple[Path, str]) -> None:
    rows = survey(tree[0])
    assert len(rows) == 70
    assert sum(r.covered for r in rows) >= COVERED_AT_LEAST


def test_the_summary_says_plainly_when_no_renderer_is_published() -> None:
    proven = [Coverage(f"t{i}.jinja", "chatml", "proven", "evidence") for i in range(3)]
    refused = Coverage("r.jinja", None, "refused", "no marker; publish with --template")
    summary = render_doc([*proven, refused], "tree").split("\n")[4]
    assert "publishes 3: every one with a Go TEMPLATE proven byte-identical" in summary, summary
    assert "none relies on Ollama's built-in RENDERER and PARSER" in summary and "(0 of them" not in summary
    rendered = Coverage("x.jinja", "nemotron-3-nano", "renderer", "evidence", proof="not proven")
    summary = render_doc([*proven, rendered], "tree").split("\n")[4]
    assert "publishes 4: 3 with a Go TEMPLATE" in summary and "1 with Ollama's built-in RENDERER and PARSER (0 of them" \
        in summary, summary


def test_every_proven_row_is_proven_by_the_suite(tree: tuple[Path, str]) -> None:
    proven = {r.template for r in survey(tree[0]) if r.kind == "proven"}
    assert proven == {n for n in CLAIMED if n.endswith(".jinja")}


def test_every_refusal_names_the_nearest_family_and_the_escape_hatch(tree: tuple[Path, str]) -> None:
    for r in survey(tree[0]):
        if r.kind == "refused":
            assert "--template" in r.reason, r
            assert r.family is None or r.family in FAMILIES
            assert ("nearest family" in r.reason or "every marker" in r.reason or "no marker" in r.reason
                    or (r.differs and "renders this" in r.reason)), r


# Templates mapped to Ollama's built-in renderers, with the evidence that ties each to its renderer.
RENDERER_MAPPED = {
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": "nemotron-3-nano",
    "google-gemma-4-31B-it.jinja": "gemma4",
    "google-gemma-4-31B-it-interleaved.jinja": "gemma4-interleaved",
    # Byte-identical to Ollama's own reference (model/renderers/testdata/laguna_v2_chat_template.jinja2 at v0.32.15).
    "poolside-Laguna-XS.2.jinja": "laguna",
}


# Mapped, then refused: Ollama's renderer (tests/test_ollama_renderers.py) writes other bytes than the Jinja.
RENDERER_REFUSED = {"poolside-Laguna-XS.2.jinja",
                    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", "google-gemma-4-31B-it.jinja",
                    "google-gemma-4-31B-it-interleaved.jinja"}


@pytest.mark.parametrize("name", sorted(RENDERER_MAPPED))
def test_renderer_mapped_templates(tree: tuple[Path, str], name: str) -> None:
    jinja = (tree[0] / name).read_text(encoding="utf-8")
    fam = FAMILIES[RENDERER_MAPPED[name]]
    assert fam.detect(jinja) and fam.kind == "renderer"
    assert fam.renderer in RENDERERS and fam.parser in PARSERS
    if name in RENDERER_REFUSED:
        assert fam.renderer_differs
        with pytest.raises(UnsupportedChatTemplate, match="renders this"):
            detect_family(jinja)
    else:
        assert detect_family(jinja) is fam and classify(name, jinja).kind == "renderer"


# Near-misses: a neighbour of a family (an older or newer version) refused with what differs.
NEAR_MISSES = {
    "fireworks-ai-llama-3-firefunction-v2.jinja": ("llama3", "lacks 'Cutting Knowledge Date: December 2023'"),
}


@pytest.mark.parametrize("name", sorted(NEAR_MISSES))
def test_near_misses_are_refused_with_what_differs(tree: tuple[Path, str], name: str) -> None:
    jinja = (tree[0] / name).read_text(encoding="utf-8")
    family, differs = NEAR_MISSES[name]
    row = classify(name, jinja)
    assert (row.kind, row.family) == ("refused", family) and differs in row.reason, row
    with pytest.raises(UnsupportedChatTemplate, match=r"nearest family|every marker"):
        detect_family(jinja)


def test_a_template_matching_two_families_is_refused(tree: tuple[Path, str]) -> None:
    both = (tree[0] / "Cohere2MoE.jinja").read_text(encoding="utf-8") + \
        (tree[0] / "muse-glimmer.jinja").read_text(encoding="utf-8")
    with pytest.raises(UnsupportedChatTemplate, match="several families"):
        detect_family(both)
    assert classify("both", both).kind == "refused"


def test_renderer_table_versions() -> None:
    assert RENDERERS["qwen3-coder"] == "0.12.0" and PARSERS["harmony"] == "0.12.1"
    assert COMMAND_SINCE == {"RENDERER": "0.12.0", "PARSER": "0.12.0", "REQUIRES": "0.14.0"}
    # REQUIRES itself needs 0.14.0, so that is the floor even for older renderers.
    assert required_version("qwen3-coder", "qwen3-coder") == "0.14.0"
    assert required_version("qwen3.5", "qwen3.5") == "0.17.1"
    assert version_key("0.30.10") > version_key("0.9.0")


def test_an_ollama_version_older_than_the_renderer_is_refused() -> None:
    assert check_ollama_version("gemma4-large", "gemma4", "0.21.0") == "0.21.0"
    with pytest.raises(ConfigError, match=r"Ollama 0\.20\.0 is older") as err:
        check_ollama_version("gemma4-large", "gemma4", "0.20.0")
    assert "--template" in (err.value.hint or "")
    with pytest.raises(ConfigError, match="no built-in RENDERER"):
        required_version("qwen4", None)


def test_an_edited_family_template_is_a_near_miss_with_what_differs(tree: tuple[Path, str], settings: Settings) -> None:
    # A family's template edited upstream (here: Qwen3's thinking switch renamed) must not keep matching.
    qwen3 = (tree[0] / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8")
    edited = qwen3.replace("enable_thinking", "thinking_mode")
    with pytest.raises(UnsupportedChatTemplate, match=r"nearest family qwen3 \(6 of 7 markers\); lacks 'enable_thinking'"):
        detect_family(edited)
    # An edit the detector does not see (a line break after each tool response) is caught by the proof, which
    # names the conversations that differ: never published with the wrong format.
    tweaked = qwen3.replace("{{- '\\n</tool_response>' }}", "{{- '\\n</tool_response>\\n' }}")
    assert tweaked != qwen3 and detect_family(tweaked).name == "qwen3"
    tokens = TemplateTokens(None, "<|im_end|>", engine_adds_bos=False)
    with pytest.raises(UnsupportedChatTemplate, match="renders differently on: tool-call-and-result"):
        convert_template(tweaked, tokens, settings)


def test_a_refusal_names_the_constructs_go_cannot_express(tree: tuple[Path, str]) -> None:
    fire = (tree[0] / "fireworks-ai-llama-3-firefunction-v2.jinja").read_text(encoding="utf-8")
    row = classify("firefunction", fire)
    assert row.kind == "refused" and "it uses what Go templates cannot express: " in row.reason
    # each construct with the line where the template first uses it
    at = go_blockers_at(fire)
    trim_line = next(n for n, line in enumerate(fire.split("\n"), 1) if "| trim -%}" in line)
    assert f"stripping whitespace (.strip / trim) at line {trim_line} (" in " ".join(at), at
    assert all(a in row.reason for a in at)
    assert "splitting strings (.split)" in go_blockers((tree[0] / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8"))
    assert go_blockers("{% for m in messages %}{{ m.content }}{% endfor %}") == []
    assert go_blockers("{{ messages|length - 1 }}{{ x | trim }}") == ["stripping whitespace (.strip / trim)",
                                                                      "arithmetic"]
