"""Tool calling end to end: the PARSER side. What a model writes for a tool call, in its Jinja's own format, parsed
back the way Ollama's PARSER does.

Ollama's parsers are reimplemented in tests/ollama_parsers.py from model/parsers/*.go at the pinned commit and
checked on cases of Ollama's own parser tests (tests/data/ollama_parser_vectors.json). Then, for every published
family that names a PARSER, the model's own output for each tool-call conversation of the suite (what its Jinja
writes after the generation prompt for the assistant message holding the calls, up to the end of the turn) is
parsed, and must give back the calls the conversation held (name, arguments, in order). A family on which it does
not is refused for tool use with the reason (ChatFamily.tool_use_refused).
"""

from __future__ import annotations

import contextlib
import json
import os
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from pipelines.chat.coverage import templates_tree
from pipelines.chat.families import FAMILIES, TemplateTokens
from pipelines.chat.gotemplate import analyze
from pipelines.chat.proof import SUITE, Conversation, render_hf
from pipelines.core.errors import UnsupportedModel
from pipelines.core.settings import Settings
from tests.ollama_parsers import (
    PARSERS,
    HarmonyEvents,
    HarmonyNames,
    TemplateToolsParser,
    _harmony_header,
    harmony_valid_chars,
    new_parser,
    parse,
    parse_qwen_tool_call,
)
from tests.test_ollama_templates import CLAIMED, OLLAMA_READING, llamacpp_tojson

VECTORS = json.loads((Path(__file__).parent / "data" / "ollama_parser_vectors.json").read_text(encoding="utf-8"))
TODAY = date(2026, 11, 26)

# Every published family that names a PARSER, with the template it is proven on and the special tokens its Jinja prints.
WITH_PARSER: dict[str, tuple[str, TemplateTokens]] = {
    "lfm2": ("LFM2-8B-A1B.jinja", TemplateTokens("<|startoftext|>", "<|im_end|>")),
    "lfm2.5": ("LFM2.5-Instruct.jinja", TemplateTokens("<|startoftext|>", "<|im_end|>")),
    "lfm2.5-moe": ("LFM2.5-8B-A1B.jinja", TemplateTokens("<|startoftext|>", "<|im_end|>")),
    "step3.5": ("StepFun3.5-Flash.jinja", TemplateTokens("<s>", "<|im_end|>")),
    "qwen3-coder": ("Qwen3-Coder.jinja", TemplateTokens(None, "<|im_end|>", engine_adds_bos=False)),
    "qwen3.5": ("Qwen3.5-4B.jinja", TemplateTokens(None, "<|im_end|>", engine_adds_bos=False)),
    "ministral3": ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", TemplateTokens("<s>", "</s>")),
    "glimmer": ("muse-glimmer.jinja", TemplateTokens("<|begin_of_text|>", "<|eot|>")),
}

TOOL_CONVERSATIONS = [c for c in SUITE if any(m.get("tool_calls") for m in c.messages)]


@pytest.fixture(scope="module")
def templates_dir(settings: Settings) -> Path:
    return templates_tree(settings)[0]


@pytest.mark.parametrize("case", VECTORS["cases"], ids=lambda c: f"{c['parser']}:{c['name']}")
def test_the_reimplementation_parses_what_ollamas_own_tests_expect(case: dict[str, Any]) -> None:
    assert case["parser"] in PARSERS
    parser = new_parser(case["parser"], case["tools"], case["last"], case["think"])
    for step in case["steps"]:
        content, thinking, calls = parser.add(step["add"], step["done"])
        assert (content, thinking, calls) == (step["content"], step["thinking"], step["calls"])


@pytest.mark.parametrize("case", VECTORS["raw_tool_calls"], ids=lambda c: c["name"])
def test_a_raw_qwen_tool_call_parses_as_in_ollamas_tests(case: dict[str, Any]) -> None:
    assert parse_qwen_tool_call(case["raw"], case["tools"]) == case["call"]


@pytest.mark.parametrize("case", VECTORS["template_tools"], ids=lambda c: c["name"])
def test_the_template_tool_parser_parses_as_in_ollamas_tests(case: dict[str, Any]) -> None:
    parser = TemplateToolsParser(case["tools"], case["tag"])
    calls, content = [], ""
    for chunk in case["inputs"]:
        got, text = parser.add(chunk)
        calls += got
        content += text
    assert (content, calls) == (case["content"], case["calls"])


_GLIMMER_ATEM = '<atem:function_calls>\n<atem:invoke name="{}">\n{}</atem:invoke>\n</atem:function_calls>'
_GLIMMER_STREAMED = [
    # glimmer_test.go:67-103 TestGlimmerParserStreamingATEMAtEveryBoundary
    ([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}],
     " to=get_weather<|message|>" + _GLIMMER_ATEM.format("get_weather", '<atem:parameter name="city">SF</atem:parameter>\n')
     + "<|eot|>", "", [{"name": "get_weather", "arguments": {"city": "SF"}}]),
    # glimmer_test.go:179-216 TestGlimmerParserMultipleMessagesAndIndices
    ([{"type": "function", "function": {"name": "first", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}}}},
      {"type": "function", "function": {"name": "second", "parameters": {"type": "object"}}}],
     " to=self<|message|>Think<|eom|><|start|>assistant to=first<|message|>"
     + _GLIMMER_ATEM.format("first", '<atem:parameter name="x">1</atem:parameter>\n') + "<|eom|>"
     + "<|start|>assistant to=second<|message|>" + _GLIMMER_ATEM.format("second", "") + "<|eot|>",
     "Think", [{"name": "first", "arguments": {"x": 1}}, {"name": "second", "arguments": {}}]),
]


@pytest.mark.parametrize(("tools", "text", "thinking", "calls"), _GLIMMER_STREAMED, ids=["one-call", "two-calls"])
def test_the_glimmer_parser_reads_a_call_split_at_every_boundary(
        tools: list[dict[str, Any]], text: str, thinking: str, calls: list[dict[str, Any]]) -> None:
    for split in range(len(text) + 1):
        parser = new_parser("glimmer", tools)
        got = [parser.add(chunk, i == 1) for i, chunk in enumerate((text[:split], text[split:]))]
        assert ("".join(g[0] for g in got), "".join(g[1] for g in got), [c for g in got for c in g[2]]) == \
            ("", thinking, calls), split


def test_every_reimplemented_parser_has_vectors() -> None:
    counts = {p: sum(c["parser"] == p for c in VECTORS["cases"] + VECTORS["raw_tool_calls"]) for p in PARSERS}
    assert all(n >= 2 for n in counts.values()), counts


def test_every_published_parser_is_checked() -> None:
    published = {f.name for f in FAMILIES.values() if f.parser and not f.renderer_differs}
    assert published == set(WITH_PARSER)
    assert {FAMILIES[f].parser for f in WITH_PARSER} <= set(PARSERS)


def model_output(jinja: str, conv: Conversation, family_name: str, tokens: TemplateTokens) -> str:
    """What the Jinja writes for the conversation's first assistant message with tool calls, after the generation
    prompt that precedes it, up to the first stop string or the EOS token (where Ollama stops generating)."""
    fam = FAMILIES[family_name]
    at = next(i for i, m in enumerate(conv.messages) if m.get("tool_calls"))
    before = render_hf(jinja, Conversation("prompt", conv.messages[:at], conv.tools, conv.think), fam, tokens, now=TODAY)
    after = render_hf(jinja, Conversation("turn", conv.messages[:at + 2], conv.tools, conv.think), fam, tokens,
                      now=TODAY)
    common = before[:next((i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b), len(before))]
    common = common[:len(after)]
    if common != before:
        # The Jinja writes the generation prompt otherwise than an assistant message's opening (QwQ opens <think>
        # there): the message's text starts at the line where the two renderings part, provided the messages
        # before it print the same in both.
        last = conv.messages[at - 1].get("content") or ""
        if before.rfind(last) + len(last) > len(common):
            raise UnsupportedModel("the Jinja prints the earlier messages otherwise once the assistant message follows")
        common = common[:common.rfind("\n") + 1]
    out = after[len(common):]
    ends = [i for i in (out.find(s) for s in (*fam.stop, tokens.eos) if s) if i >= 0]
    return out[:min(ends)] if ends else out


def _recovered(templates_dir: Path, family_name: str) -> dict[str, bool]:
    name, tokens = WITH_PARSER[family_name]
    fam = FAMILIES[family_name]
    assert fam.parser is not None
    jinja = (templates_dir / name).read_text(encoding="utf-8")
    out = {}
    for conv in TOOL_CONVERSATIONS:
        held = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                for c in next(m for m in conv.messages if m.get("tool_calls"))["tool_calls"]]
        _content, _thinking, calls = parse(fam.parser, model_output(jinja, conv, family_name, tokens),
                                           list(conv.tools or ()), think=conv.think)
        out[conv.name] = calls == held
    return out


@pytest.mark.parametrize("family_name", sorted(WITH_PARSER))
def test_the_parser_recovers_the_calls_from_the_models_own_format_or_tool_use_is_refused(
        templates_dir: Path, family_name: str) -> None:
    fam = FAMILIES[family_name]
    recovered = _recovered(templates_dir, family_name)
    if all(recovered.values()):
        assert fam.tool_use_refused == "", f"{family_name}: its PARSER recovers every call, yet it is refused"
    else:
        assert fam.tool_use_refused, f"{family_name}: PARSER {fam.parser} does not recover the calls on " + ", ".join(
            c for c, ok in recovered.items() if not ok)
        assert fam.tool_calls.startswith("refused for tool use")


def test_the_model_output_is_the_format_the_parser_reads(templates_dir: Path) -> None:
    # The check can fail: Step 3.5's own output parses, and with one character of its XML changed it does not.
    name, tokens = WITH_PARSER["step3.5"]
    jinja = (templates_dir / name).read_text(encoding="utf-8")
    conv = next(c for c in TOOL_CONVERSATIONS if c.name == "tool-call-nested-arguments")
    out = model_output(jinja, conv, "step3.5", tokens)
    assert out.startswith("\n</think>\n<tool_call>\n<function=search>")
    _c, _t, calls = parse("qwen3.5", out, list(conv.tools or ()))
    assert calls == [{"name": "search", "arguments": {"max_results": 3, "query": 'llama.cpp "GGUF"',
                                                      "tags": ["ml", "quantization"]}}]
    _c, _t, calls = parse("qwen3.5", out.replace("<parameter=tags>", "<parameter=tag>"), list(conv.tools or ()))
    assert calls[0]["arguments"] != conv.messages[1]["tool_calls"][0]["function"]["arguments"]


def test_the_cli_names_the_tool_use_refusal(templates_dir: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "template", str(templates_dir / "LFM2.5-Instruct.jinja")],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "400"})
    said = " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr
    assert "tool calls: refused for tool use" in said and "PARSER lfm2" in said


# ---------------------------------------------------------------- TEMPLATE families: Ollama's tool parsing without PARSER

# The templates of proven TEMPLATE families that print tools and name no PARSER, with the tool-call conversations
# on which Ollama's tool parser (tools/, the tag from the TEMPLATE) gives back the calls the conversation held.
TEMPLATE_TOOLS = sorted(n for n, (tools, _tag, _think) in OLLAMA_READING.items()
                        if tools and not FAMILIES[CLAIMED[n][0]].parser)
NOT_RECOVERED = {
    # <arg_key>/<arg_value> pairs: no JSON object for the parser to find
    "GLM-4.6.jinja", "GLM-4.7-Flash.jinja", "Spark2.5.jinja", "inclusionai-ling-3.0-flash.jinja", "poolside-Laguna-S-2.1.jinja",
    "poolside-Laguna-XS-2.1.jinja",
    # the Jinja writes nothing for an assistant message's tool calls
    "ibm-granite-granite-3.3-2B-Instruct.jinja",
    # a ```json fenced object of the arguments alone: the parser finds no name in it
    "llama-cpp-deepseek-r1.jinja",
    # the tag the TEMPLATE gives never starts the model's turn, and the calls name their tool as "tool_name"
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",
    # an 'Action:' list of {"tool_name", "parameters"}: no "name" for the parser to find
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja",
    # Cohere2 MoE: the tag never starts the model's turn (as for Command R+), and the calls name their tool as
    # "tool_name"
    "Cohere2MoE.jinja",
    # <|open|>call …<|sep|> tags with typed <argument>s: no JSON object
    "Kimi-K3.jinja",
    # <function name=…><param name=…> XML: no JSON object
    "openbmb-MiniCPM5-1B.jinja",
    # '>>>NAME' and the arguments alone: the parser finds no name in them
    "meetkai-functionary-medium-v3.2.jinja",
    # GigaChat 3: the call is a turn of its own after <|message_sep|>, a stop string that ends the model's turn
    "GigaChat3-10B-A1.8B.jinja",
}
# Templates whose Jinja renders tools only with llama.cpp's tojson (test_ollama_templates.llamacpp_tojson).
LLAMACPP_TOJSON = {"llama-cpp-deepseek-r1.jinja"}
# Recovered except on these conversations, with what the family's claim must say about them: Solar Open writes
# <|end|>, one of its stop strings, after its reasoning, so a turn that reasons before calling a tool ends there;
# GigaChat 3.1's Jinja writes only the first call of a message.
PARTLY_RECOVERED = {"upstage-Solar-Open-100B.jinja": {"reasoning-in-tool-loop"},
                    "GigaChat3.1-10B-A1.8B.jinja": {"parallel-tool-calls"}}
PARTLY_SAYS = {"upstage-Solar-Open-100B.jinja": "stop string", "GigaChat3.1-10B-A1.8B.jinja": "only the first call"}


def _template_recovered(settings: Settings, templates_dir: Path, name: str) -> dict[str, bool]:
    family_name, tokens = CLAIMED[name]
    fam = FAMILIES[family_name]
    jinja = (templates_dir / name).read_text(encoding="utf-8")
    reading = analyze(fam.template(jinja, tokens), settings)
    out = {}
    for conv in TOOL_CONVERSATIONS:
        try:
            with llamacpp_tojson() if name in LLAMACPP_TOJSON else contextlib.nullcontext():
                text = model_output(jinja, conv, family_name, tokens)
        except UnsupportedModel:  # the Jinja refuses the conversation (Llama 3.2: one call per turn)
            continue
        if reading.thinking_tags and text.lstrip().startswith(reading.thinking_tags[0]) and reading.thinking_tags[1] in text:
            text = text.split(reading.thinking_tags[1], 1)[1]  # Ollama's thinking parser takes the reasoning first
        held = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                for c in next(m for m in conv.messages if m.get("tool_calls"))["tool_calls"]]
        calls, _content = TemplateToolsParser(list(conv.tools or ()), reading.tool_tag).add(text)
        out[conv.name] = calls == held
    return out


@pytest.mark.parametrize("name", TEMPLATE_TOOLS)
def test_ollamas_tool_parser_recovers_a_template_familys_calls_as_its_claim_says(
        settings: Settings, templates_dir: Path, name: str) -> None:
    fam = FAMILIES[CLAIMED[name][0]]
    recovered = _template_recovered(settings, templates_dir, name)
    failing = {c for c, ok in recovered.items() if not ok}
    assert recovered and failing == (set(recovered) if name in NOT_RECOVERED else PARTLY_RECOVERED.get(name, set()))
    if name in NOT_RECOVERED:
        assert fam.tool_calls.startswith(("none structured", "refused for tool use")), fam.tool_calls
    else:
        assert fam.tool_calls.startswith("TEMPLATE:") and "not guaranteed" not in fam.tool_calls, fam.tool_calls
    if name in PARTLY_RECOVERED:
        assert PARTLY_SAYS[name] in fam.tool_calls


def test_a_family_refused_for_tool_use_says_so_where_users_read_its_tool_calls() -> None:
    for fam in FAMILIES.values():
        assert bool(fam.tool_use_refused) == fam.tool_calls.startswith("refused for tool use"), fam.name


# ---------------------------------------------------------------- harmony (gpt-oss)
#
# gpt-oss is published with a proven TEMPLATE and no PARSER line: Ollama switches PARSER harmony on itself for a
# gpt-oss model whose TEMPLATE holds <|start|> and <|end|> (server/routes.go:77-87, 2662-2671; the TEMPLATE side is
# tests/test_ollama_templates.py). Its tool calls are checked here like those of the families that name a PARSER.


@pytest.mark.parametrize("case", VECTORS["harmony_headers"]["cases"], ids=lambda c: c["in"])
def test_the_harmony_header_parses_as_in_ollamas_tests(case: dict[str, Any]) -> None:
    assert _harmony_header(case["in"]) == {k: case[k] for k in ("role", "channel", "recipient")}


@pytest.mark.parametrize("case", VECTORS["harmony_events"]["cases"], ids=lambda c: c["in"])
def test_the_harmony_message_stream_gives_ollamas_events(case: dict[str, Any]) -> None:
    events = HarmonyEvents()
    if case["implicit_start"]:
        events.add_implicit_start()
    assert [list(e) for e in events.add(case["in"])] == case["events"]


def test_harmony_tool_names_convert_as_in_ollamas_tests() -> None:
    names = VECTORS["harmony_names"]
    assert [harmony_valid_chars(given) for given, _ in names["valid_chars"]] == [want for _, want in names["valid_chars"]]
    for given, want in names["convert_and_add"]:
        table = HarmonyNames()
        assert [table.convert_and_add(n) for n in given] == want
        assert [table.original(w) for w in want] == given


GPT_OSS = ("openai-gpt-oss-120b.jinja", TemplateTokens(None, "<|return|>", engine_adds_bos=False))


@pytest.mark.parametrize("conv", TOOL_CONVERSATIONS, ids=lambda c: c.name)
def test_harmony_recovers_gpt_oss_tool_calls_from_the_models_own_format(templates_dir: Path, conv: Conversation) -> None:
    name, tokens = GPT_OSS
    fam = FAMILIES["gpt-oss"]
    assert fam.parser is None and "harmony" in fam.tool_calls and "not reimplemented" not in fam.tool_calls
    jinja = (templates_dir / name).read_text(encoding="utf-8")
    output = model_output(jinja, conv, "gpt-oss", tokens)
    message = next(m for m in conv.messages if m.get("tool_calls"))
    # the Jinja writes only the first call of a message (harmony has one recipient per message); the rest are not
    # in the model's output to parse
    held = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in message["tool_calls"][:1]]
    assert output.count("<|start|>assistant to=") + output.startswith(" to=") == 1, output
    content, thinking, calls = parse("harmony", output, list(conv.tools or ()), think=conv.think)
    assert (content, calls) == ("", held)
    assert thinking == (message.get("reasoning") or "")


def test_harmony_reads_gpt_oss_output_streamed_in_pieces(templates_dir: Path) -> None:
    # Ollama hands the parser the output as it streams: every cut of a call with reasoning gives the same result
    name, tokens = GPT_OSS
    jinja = (templates_dir / name).read_text(encoding="utf-8")
    conv = next(c for c in TOOL_CONVERSATIONS if c.name == "reasoning-in-tool-loop")
    output = model_output(jinja, conv, "gpt-oss", tokens)
    whole = parse("harmony", output, list(conv.tools or ()))
    assert whole[1] == "I need the weather tool." and whole[2][0]["name"] == "get_weather"
    for cut in range(1, len(output)):
        parser = new_parser("harmony", list(conv.tools or ()))
        first, second = parser.add(output[:cut], False), parser.add(output[cut:], True)
        assert (first[0] + second[0], first[1] + second[1], first[2] + second[2]) == whole, cut


def test_harmony_gives_back_a_renamed_tool_under_the_users_name() -> None:
    # a tool name harmony cannot hold is renamed for the prompt (harmonyparser.go:413-424) and mapped back
    tools = [{"type": "function", "function": {"name": "get-weather", "parameters": {"type": "object"}}}]
    out = ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'
    assert parse("harmony", out, tools)[2] == [{"name": "get-weather", "arguments": {"city": "Paris"}}]
    with pytest.raises(ValueError, match="error parsing tool call"):
        parse("harmony", ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": ', tools)
