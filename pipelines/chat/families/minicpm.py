"""MiniCPM 5 (ChatML, <function name=…><param name=…> tool calls, hybrid thinking).
"""

from __future__ import annotations

from pipelines.chat.families.apriel import _PYREPR_DEFINE
from pipelines.chat.families.blocks import chatml_query_loop, chatml_tool_turn
from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import (
    _fill,
    _has_all,
    _jinja_string_starting,
    _jinja_strings,
    golit,
)
from pipelines.chat.gojson import json_defines

# ---------------------------------------------------------------- MiniCPM 5

_TOOLS_HEAD = "# Tools\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>"
_TOOLS_TAIL = "\n</tools>\n\nTool usage guidelines:\n"


def _detect_minicpm5(src: str) -> bool:
    return (
        _has_all(src, "<|im_start|>", "<tool_def_sep>", "<tool_sep>", "<function name=\"' ~ tool_call.name ~ '\">",
                 "'<param name=\"' ~ param_name ~ '\">'", "not has_tool_sep", "multi_step_tool=true")
        and _TOOLS_HEAD in _jinja_strings(src) and _jinja_string_starting(src, _TOOLS_TAIL) is not None
    )


def _build_minicpm5(src: str, tokens: TemplateTokens) -> str:
    tail = _jinja_string_starting(src, _TOOLS_TAIL)
    assert tail is not None
    # A call as the Jinja writes it: <function name="…"><param name="…">value</param>…</function>, a string value
    # as it is (the Jinja wraps one holding '<', '&' or a line break in CDATA), any other as Python's str().
    call = ('<function name="{{ .Function.Name }}">{{ range $k, $v := .Function.Arguments }}<param name="{{ $k }}">'
            '{{ if eq (printf "%T" $v) "string" }}{{ $v }}{{ else }}{{ template "mm_pyrepr" $v }}{{ end }}</param>'
            '{{ end }}</function>')
    return json_defines() + _PYREPR_DEFINE + _fill(
        """
{{- $msgs := .Messages }}{{ $hasSys := and $msgs (eq (index $msgs 0).Role "system") }}
{{- «BOS» }}
{{- if .Tools }}<|im_start|>system{{ "\\n" }}{{ if $hasSys }}{{ (index $msgs 0).Content }}{{ "\\n\\n" }}{{ end }}
    {{- «HEAD» }}{{ range .Tools }}{{ "\\n" }}{{ template "mm_tool" . }}{{ end }}{{ «TAIL» }}<|im_end|>{{ "\\n" }}
«QUERY_LOOP»
    {{- if or (eq .Role "user") (and (eq .Role "system") $i) }}<|im_start|>{{ .Role }}{{ "\\n" }}{{ .Content }}<|im_end|>{{ "\\n" }}
    {{- else if eq .Role "assistant" }}<|im_start|>assistant{{ "\\n" }}
        {{- if and (gt $i $lastQuery) .Thinking }}<think>«NL»{{ .Thinking }}«NL»</think>«NL»«NL»{{ end }}{{ .Content }}
        {{- range $j, $c := .ToolCalls }}{{ if or $j $m.Content }}{{ "\\n" }}{{ end }}«CALL»{{ end }}
        {{- if not (and $last (not .ToolCalls)) }}<|im_end|>{{ "\\n" }}{{ end }}
«TOOL_TURN»
{{- if ne $prev "assistant" }}<|im_start|>assistant{{ "\\n" }}
    {{- if .IsThinkSet }}{{ if .Think }}<think>{{ "\\n" }}{{ else }}<think>{{ "\\n\\n</think>\\n\\n" }}{{ end }}{{ end }}
{{- end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        HEAD=golit(_TOOLS_HEAD)[3:-3],
        TAIL=golit(tail)[3:-3],
        CALL=call,
        QUERY_LOOP=chatml_query_loop("$hasSys"),
        TOOL_TURN=chatml_tool_turn('{{- if ne $prev "tool" }}<|im_start|>user{{ end }}{{ "\\n<tool_response>\\n" }}{{ .Content }}{{ "\\n</tool_response>" }}'),
    )


register(ChatFamily(
    name="minicpm5",
    title="MiniCPM 5 (ChatML, <function name=…><param name=…> tool calls, enable_thinking)",
    detect=_detect_minicpm5,
    build=_build_minicpm5,
    stop=("<|im_end|>", "<|im_start|>"),
    bos_in_template=True,
    thinking=True,
    reasoning_key="reasoning_content",
    markers=("<|im_start|>", "<tool_def_sep>", "<tool_sep>", "<function name=", "<param name="),
    tool_calls=("none structured: <function name=…><param name=…> XML is not JSON, and Ollama ships no MiniCPM "
                "PARSER"),
    notes=(
        "the Jinja's <tool_sep> placement of calls inside the content is lost to its own loop scoping (the content "
        "it builds is discarded), so calls print once after the content; so does the TEMPLATE",
        "the Jinja splits a content holding <tool_sep> to put each call at its place, and replaces "
        "<tool_def_sep> in a system prompt by the tool definitions; Go templates cannot split or replace text",
        "the Jinja wraps a string argument holding '<', '&' or a line break in CDATA; Go templates cannot test "
        "substrings, so the TEMPLATE prints it as it is",
        "the Jinja counts a user message that is wholly '<tool_response>…</tool_response>' as no query; the "
        "TEMPLATE counts every user message",
    ),
))
