"""NVIDIA Nemotron Nano v2 (<SPECIAL_10>System / <SPECIAL_11>User / <SPECIAL_11>Assistant … <SPECIAL_12>, <TOOLCALL>
JSON calls, <TOOL_RESPONSE> lists, a <think> generation prompt).
"""

from __future__ import annotations

from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import _LOOP_HEAD, _fill, _has_all, golit
from pipelines.chat.gojson import json_defines

# ---------------------------------------------------------------- NVIDIA Nemotron Nano v2

_TOOLS_HEAD = "You can use the following tools to assist the user if required:\n<AVAILABLE_TOOLS>["
_TOOLS_TAIL = (
    "]</AVAILABLE_TOOLS>\n\nIf you decide to call any tool(s), use the following format:\n"
    '<TOOLCALL>[{{"name": "tool_name1", "arguments": "tool_args1"}}, '
    '{{"name": "tool_name2", "arguments": "tool_args2"}}]</TOOLCALL>\n\n'
    "The user will execute tool-calls and return responses from tool(s) in this format:\n"
    '<TOOL_RESPONSE>[{{"tool_response1"}}, {{"tool_response2"}}]</TOOL_RESPONSE>\n\n'
    "Based on the tool responses, you can call additional tools if needed, correct tool calls if any errors are "
    "found, or just respond to the user."
)


def _detect_nemotron_nano2(src: str) -> bool:
    return _has_all(
        src, "<SPECIAL_10>System", "<SPECIAL_11>User", "<SPECIAL_11>Assistant", "<SPECIAL_12>", "<TOOLCALL>[",
        "<TOOL_RESPONSE>[", "ns.last_turn_assistant_content", "'You can use the following tools to assist the user "
        "if required:'",
    )


def _build_nemotron_nano2(src: str, tokens: TemplateTokens) -> str:
    calls = ('<TOOLCALL>[{{ range $j, $c := .ToolCalls }}{{ if $j }}, {{ end }}{"name": "{{ .Function.Name }}", '
             '"arguments": {{ template "mm_args" .Function.Arguments }}}{{ end }}]</TOOLCALL>')
    return json_defines() + _fill(
        """
{{- $msgs := .Messages }}{{ $sys := "" }}{{ $hasSys := and $msgs (eq (index $msgs 0).Role "system") }}
{{- if $hasSys }}{{ $sys = (index $msgs 0).Content }}{{ end }}
{{- «BOS» }}<SPECIAL_10>System«NL»{{ $sys }}
{{- if .Tools }}{{ if $sys }}{{ "\\n\\n" }}{{ end }}{{ «HEAD» }}
    {{- range $j, $t := .Tools }}{{ if $j }}, {{ end }}{{ template "mm_function" .Function }}{{ end }}{{ «TAIL» }}
{{- end }}{{ "\\n\\n" }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if and false .ToolCalls }}<TOOLCALL>[{{ end }}
    {{- if or $i (not $hasSys) }}
        {{- if eq .Role "user" }}<SPECIAL_11>User«NL»{{ .Content }}{{ "\\n" }}
        {{- else if eq .Role "tool" }}
            {{- if ne $prev "tool" }}<SPECIAL_11>User«NL»<TOOL_RESPONSE>[{{ end }}{{ .Content }}
            {{- if eq $next "tool" }}, {{ else }}]</TOOL_RESPONSE>{{ end }}
        {{- else if and (eq .Role "assistant") $last }}<SPECIAL_11>Assistant«NL»<think>«NL»{{ .Content }}
        {{- else if eq .Role "assistant" }}<SPECIAL_11>Assistant«NL»{{ .Content }}
            {{- if .ToolCalls }}{{ if .Content }}{{ "\\n" }}{{ end }}«CALLS»{{ end }}{{ "\\n" }}<SPECIAL_12>{{ "\\n" }}
        {{- end }}
        {{- $prev = .Role }}
    {{- end }}
{{- end }}
{{- if ne $prev "assistant" }}<SPECIAL_11>Assistant«NL»<think>«NL»{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        HEAD=golit(_TOOLS_HEAD)[3:-3],
        TAIL=golit(_TOOLS_TAIL)[3:-3],
        CALLS=calls,
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="nemotron-nano-v2",
    title="NVIDIA Nemotron Nano v2 (<SPECIAL_10>System, <SPECIAL_11>User/Assistant, <TOOLCALL> JSON calls)",
    detect=_detect_nemotron_nano2,
    build=_build_nemotron_nano2,
    stop=("<SPECIAL_12>",),
    markers=("<SPECIAL_10>System", "<SPECIAL_11>User", "<SPECIAL_11>Assistant", "<SPECIAL_12>", "<TOOLCALL>[",
             "<TOOL_RESPONSE>["),
    tool_calls=("TEMPLATE: Ollama's tool parser waits for <TOOLCALL>[ (named by a never-rendered block), then reads "
                "each {\"name\", \"arguments\"} object after it; checked on the model's own output for the suite's tool-call "
                "conversations"),
    notes=(
        "the Jinja switches thinking with '/think' and '/no_think' inside a user or system message (and removes "
        "them from the text) and ignores enable_thinking; Go templates cannot test or replace a substring, so the "
        "TEMPLATE always opens <think> and keeps such markers as they are",
        "the Jinja strips message contents and cuts an assistant content at '</think>'; Go templates cannot strip "
        "or split, so the TEMPLATE prints them as Ollama passes them (its reasoning comes in .Thinking, not printed, "
        "as the Jinja prints none)",
        "a system message after the first is dropped by the Jinja; so is it by the TEMPLATE",
        "the Jinja writes a final assistant message holding tool calls again after the history; the TEMPLATE "
        "continues it as it does any final assistant message",
    ),
))
