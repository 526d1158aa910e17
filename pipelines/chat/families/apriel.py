"""ServiceNow Apriel 1.5 (Unsloth's fixed template: <|system|>/<|user|>/<|assistant|> … <|end|>, tools as Python str())."""

from __future__ import annotations

from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import _LOOP_HEAD, _fill, _has_all, golit
from pipelines.chat.families.tagged import _PYVAL_DEFINE
from pipelines.chat.gojson import json_defines

_REASONING = (
    "You are a thoughtful and systematic AI assistant built by ServiceNow Language Models (SLAM) lab. Before providing "
    "an answer, analyze the problem carefully and present your reasoning step by step. After explaining your thought "
    "process, provide the final solution in the following format: [BEGIN FINAL RESPONSE] ... [END FINAL RESPONSE]."
)
_TOOLS = (
    "You are provided with function signatures within <available_tools></available_tools> XML tags. You may call one "
    "or more functions to assist with the user query. Don't make assumptions about the arguments. You should infer "
    "the argument values from previous user responses and the system message. Here are the available tools:\n"
    "<available_tools>\n"
)
_OUTPUT = (
    "Return all function calls as a list of json objects within <tool_call></tool_call> XML tags. Each json object "
    'should contain a function name and arguments as follows:\n<tool_calls>[{"name": <function-name-1>, "arguments": '
    '<args-dict-1>}, {"name": <function-name-2>, "arguments": <args-dict-2>},...]</tool_calls>'
)

# `tool|string`: Python's str() of the tool dict, in the key order Ollama's API holds a tool in.
_PYTOOL_DEFINE = (
    '{{- define "mm_pyprop" }}{{ "{" }}{{ $sep := "" }}'
    "{{- if .AnyOf }}{{ $sep }}'anyOf': [{{ range $i, $a := .AnyOf }}{{ if $i }}, {{ end }}{{ template \"mm_pyprop\" $a }}"
    "{{ end }}]{{ $sep = \", \" }}{{ end }}"
    "{{- if .Type }}{{ $sep }}'type': {{ if eq (len .Type) 1 }}'{{ index .Type 0 }}'{{ else }}[{{ range $i, $t := .Type }}"
    "{{ if $i }}, {{ end }}'{{ $t }}'{{ end }}]{{ end }}{{ $sep = \", \" }}{{ end }}"
    "{{- if .Items }}{{ $sep }}'items': {{ template \"mm_pyrepr\" .Items }}{{ $sep = \", \" }}{{ end }}"
    "{{- if .Enum }}{{ $sep }}'enum': [{{ range $i, $e := .Enum }}{{ if $i }}, {{ end }}{{ template \"mm_pyrepr\" $e }}"
    "{{ end }}]{{ $sep = \", \" }}{{ end }}"
    "{{- if .Description }}{{ $sep }}'description': '{{ .Description }}'{{ end }}{{ \"}\" }}{{ end }}\n"
    '{{- define "mm_pytool" }}{{ "{" }}\'type\': \'{{ .Type }}\', \'function\': {{ "{" }}{{ with .Function }}'
    "'name': '{{ .Name }}'{{ if .Description }}, 'description': '{{ .Description }}'{{ end }}, 'parameters': "
    "{{ \"{\" }}{{ with .Parameters }}'type': '{{ .Type }}', 'properties': {{ \"{\" }}{{ $first := true }}"
    "{{ range $k, $v := .Properties }}{{ if not $first }}, {{ end }}{{ $first = false }}'{{ $k }}': "
    "{{ template \"mm_pyprop\" $v }}{{ end }}{{ \"}\" }}{{ if .Required }}, 'required': [{{ range $i, $r := .Required }}"
    "{{ if $i }}, {{ end }}'{{ $r }}'{{ end }}]{{ end }}{{ end }}{{ \"}}}\" }}{{ end }}{{ end }}\n"
)


def _detect(src: str) -> bool:
    return _has_all(
        src, "{# Unsloth template fixes #}", "{{ tool|string }}", "{%- set reasoning_prompt='You are a thoughtful and "
        "systematic AI assistant built by ServiceNow Language Models (SLAM) lab.", "{%- set add_tool_id = true -%}",
        "{{- '\\n<|end|>\\n' + eos_token -}}", "{{- '<|tool_result|>\\n' + tool_message|string + '\\n<|end|>\\n' -}}",
        "{%- if messages|selectattr('role', 'equalto', 'system')|list|length == 0 -%}",
    ) and "reasoning_content" not in src


def _build(src: str, tokens: TemplateTokens) -> str:
    return json_defines() + _PYVAL_DEFINE + _PYTOOL_DEFINE + _fill(
        """
{{- $msgs := .Messages }}{{ $hasSys := false }}{{ range $msgs }}{{ if eq .Role "system" }}{{ $hasSys = true }}{{ end }}{{ end }}
{{- $tools := .Tools }}
{{- «BOS» }}
{{- if and .Tools (not (and $msgs (eq (index $msgs 0).Role "system"))) }}<|system|>{{ "\\n" }}«REASONING»«TOOLS»{{ range .Tools }}{{ template "mm_pytool" . }}{{ "\\n" }}{{ end }}</available_tools>{{ "\\n" }}«OUTPUT»{{ "\\n<|end|>\\n" }}{{ end }}
{{- if not $hasSys }}<|system|>{{ "\\n" }}«REASONING»{{ "\\n<|end|>\\n" }}{{ end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}<|user|>{{ "\\n" }}{{ .Content }}{{ "\\n<|end|>\\n" }}
    {{- else if eq .Role "system" }}<|system|>{{ "\\n" }}«REASONING»{{ .Content }}{{ "\\n" }}
        {{- if $tools }}«TOOLS»{{ range $tools }}{{ template "mm_pytool" . }}{{ "\\n" }}{{ end }}</available_tools>{{ "\\n" }}{{ end }}<|end|>{{ "\\n" }}
    {{- else if eq .Role "assistant" }}<|assistant|>{{ "\\n" }}{{ .Content }}
        {{- if .ToolCalls }}{{ "\\n<tool_calls>[" }}{{ range $j, $c := .ToolCalls }}{{ if $j }}, {{ end }}{"name": "{{ .Function.Name }}", "arguments": {{ template "mm_args" .Function.Arguments }}
            {{- if not $last }}, "id": "{{ .ID }}"{{ end }}{{ "}" }}{{ end }}]</tool_calls>{{ end }}
        {{- if not (and $last (not $m.ToolCalls)) }}{{ "\\n<|end|>\\n" }}{{ «EOS» }}{{ end }}
    {{- else if eq .Role "tool" }}<|tool_result|>{{ "\\n" }}{{ .Content }}{{ "\\n<|end|>\\n" }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<|assistant|>{{ "\\n" }}{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3], EOS=golit(tokens.eos or "")[3:-3], REASONING=golit(_REASONING),
        TOOLS=golit(_TOOLS), OUTPUT=golit(_OUTPUT), LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="apriel-1.5",
    title="ServiceNow Apriel 1.5 (Unsloth's fixed template: <|system|>/<|user|>/<|assistant|> … <|end|>, "
          "<tool_calls>[…] JSON calls)",
    detect=_detect,
    build=_build,
    stop=("<|end|>",),
    bos_in_template=True,
    markers=("<|system|>", "<|user|>", "<|assistant|>", "<|tool_result|>", "ServiceNow Language Models",
             "Unsloth template fixes"),
    tool_calls="none structured: Ollama's tool parser would need <tool_calls>[ and the calls carry their id; Ollama "
               "ships no Apriel PARSER",
    notes=(
        "the Jinja lists tools with Python's str() of each tool; the TEMPLATE prints the same, in the key order "
        "Ollama's API holds a tool in, with strings in single quotes unescaped (a quote or backslash inside a "
        "description prints differently)",
        "add_thoughts and tool_output_format are not Ollama settings: the TEMPLATE follows their defaults",
        "the Jinja's 'content' role and image chunks have no counterpart in Ollama's messages",
    ),
))
