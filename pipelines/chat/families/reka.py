"""Reka Edge (system: / human: / assistant: turns ended by <sep>, <tool_call> JSON calls, enable_thinking).
"""

from __future__ import annotations

from pipelines.chat.families.blocks import QUERY_LOOP
from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import _fill, _has_all, golit
from pipelines.chat.gojson import json_defines

# ---------------------------------------------------------------- Reka Edge

_TOOLS_HEAD = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
               "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
_TOOLS_TAIL = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
               "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
               "<args-json-object>}\n</tool_call>")


def _detect_reka(src: str) -> bool:
    return _has_all(
        src, '"system: "', '"human: "', '"assistant: "', '"\\n\\n<sep>"', "<REKA_IMG_TOKEN>", "include_thinking",
        '"assistant: <think>\\n"', "tool | tojson(ensure_ascii=True)", '"<tool_call>\\n"',
    )


def _build_reka(src: str, tokens: TemplateTokens) -> str:
    call = ('<tool_call>{{ "\\n" }}{"name": "{{ .Function.Name }}", "arguments": '
            '{{ template "mm_args" .Function.Arguments }}}{{ "\\n" }}</tool_call>')
    return json_defines() + _fill(
        """
{{- $msgs := .Messages }}{{ $sys := "" }}{{ $hasSys := and $msgs (eq (index $msgs 0).Role "system") }}
{{- if $hasSys }}{{ $sys = (index $msgs 0).Content }}{{ end }}
{{- $thinking := and .IsThinkSet .Think }}
{{- «BOS» }}
{{- if or .Tools $sys }}{{ if $sys }}system: {{ $sys }}{{ end }}
    {{- if .Tools }}{{ if $sys }}{{ "\\n\\n" }}{{ else }}system: {{ end }}{{ «HEAD» }}{{ range .Tools }}{{ "\\n" }}{{ template "mm_tool" . }}{{ end }}{{ «TAIL» }}{{ end }}
    {{- "\\n\\n" }}<sep>
{{- end }}
«QUERY_LOOP»
    {{- /* Never renders: names <tool_call> as the tag Ollama's tool parser waits for. */}}
    {{- if and false .ToolCalls }}<tool_call>{{ end }}
    {{- if or $i (not $hasSys) }}
        {{- if eq .Role "user" }}human: {{ .Content }}<sep>
        {{- else if eq .Role "assistant" }}{{ "assistant: " }}
            {{- if and $thinking (gt $i $lastQuery) (or $last .Thinking) }}<think>«NL»{{ .Thinking }}«NL»</think>«NL»«NL»{{ end }}{{ .Content }}
            {{- if and .ToolCalls .Content }}{{ "\\n" }}{{ end }}
            {{- range .ToolCalls }}«CALL»{{ end }}
            {{- if not $last }}{{ "\\n\\n" }}<sep>{{ end }}
        {{- else if eq .Role "tool" }}
            {{- if ne $prev "tool" }}human: {{ end }}<tool_response>{{ "\\n" }}{{ .Content }}{{ "\\n" }}</tool_response>
            {{- if ne $next "tool" }}<sep>{{ end }}
        {{- end }}
        {{- $prev = .Role }}
    {{- end }}
{{- end }}
{{- if ne $prev "assistant" }}{{ if $thinking }}assistant: <think>{{ "\\n" }}{{ else }}assistant:{{ end }}{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        HEAD=golit(_TOOLS_HEAD)[3:-3],
        TAIL=golit(_TOOLS_TAIL)[3:-3],
        CALL=call,
        QUERY_LOOP=QUERY_LOOP,
    )


register(ChatFamily(
    name="reka-edge",
    title="Reka Edge (system: / human: / assistant: turns ended by <sep>, <tool_call> JSON calls)",
    detect=_detect_reka,
    build=_build_reka,
    stop=("<sep>",),
    bos_in_template=True,
    thinking=True,
    reasoning_key="reasoning_content",
    markers=("human: ", "assistant: ", "<sep>", "<REKA_IMG_TOKEN>", "include_thinking"),
    tool_calls=("TEMPLATE: Ollama's tool parser waits for <tool_call> (named by a never-rendered block), then reads "
                "each call's name and JSON arguments; checked on the model's own output for the suite's tool-call "
                "conversations"),
    notes=(
        "the Jinja prints tools and arguments with tojson(ensure_ascii=True); the TEMPLATE keeps non-ASCII "
        "characters as they are",
        "the Jinja strips a turn's reasoning and adds a line break before tool calls only when the content does "
        "not end with one; Go templates cannot strip or test a suffix",
        "the Jinja counts a user message that is wholly '<tool_response>…</tool_response>' as no query; the "
        "TEMPLATE counts every user message",
    ),
))
