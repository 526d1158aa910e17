"""ByteDance Seed-OSS (<seed:bos>role … <seed:eos>, tools as Python signatures, <seed:tool_call> XML calls)."""

from __future__ import annotations

from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import _LOOP_HEAD, _fill, _has_all, golit
from pipelines.chat.families.tagged import _PYVAL_DEFINE
from pipelines.chat.gojson import json_defines

_DOUBAO = "You are Doubao, a helpful AI assistant. You may call one or more functions to assist with the user query."
_CALL_FORMAT = (
    "工具调用请遵循如下格式:\n<seed:tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>"
    "value_1</parameter>\n<parameter=example_parameter_2>This is the value for the second parameter\nthat can span\n"
    "multiple lines</parameter>\n</function>\n</seed:tool_call>\n"
)

# The Jinja's py_type macro: a JSON Schema type as the Python type name of the signature.
_PYTYPE_DEFINE = (
    '{{- define "mm_pytype" }}{{ $t := "" }}{{ if eq (len .) 1 }}{{ $t = index . 0 }}{{ end }}'
    '{{ if eq $t "string" }}str{{ else if or (eq $t "number") (eq $t "integer") }}int{{ else if eq $t "boolean" }}bool'
    '{{ else if eq $t "array" }}list{{ else }}Any{{ end }}{{ end }}\n'
    # `arg_value if arg_value is string else arg_value | string`: Python's str() of anything but a string
    '{{- define "mm_pystr" }}{{ if eq (printf "%T" .) "string" }}{{ . }}{{ else }}{{ template "mm_pyrepr" . }}'
    '{{ end }}{{ end }}\n'
)


def _detect(src: str) -> bool:
    return _has_all(
        src, "{%- set bos_token              = '<seed:bos>'               -%}", "{%- set budget_reflections_v05 = {",
        "You are Doubao, a helpful AI assistant.", "{%- macro py_type(t) -%}", _CALL_FORMAT.replace("\n", "\\n"),
        "{%- set arg_value = arg_value if arg_value is string else arg_value | string %}",
        '{{ "\\n" + think_begin_token + message.reasoning_content | trim + think_end_token }}',
        "{%- if name in item.function.parameters.required %} [必填]{% else %} [选填]{% endif %}:",
    )


def _build(src: str, tokens: TemplateTokens) -> str:
    return json_defines() + _PYVAL_DEFINE + _PYTYPE_DEFINE + _fill(
        """
{{- $msgs := .Messages }}{{ $hasSys := and $msgs (eq (index $msgs 0).Role "system") }}
{{- if $hasSys }}<seed:bos>system{{ "\\n" }}{{ (index $msgs 0).Content }}{{ else if .Tools }}<seed:bos>system{{ "\\n" }}«DOUBAO»{{ end }}
{{- range .Tools }}{{ "\\n\\nFunction:\\ndef " }}{{ .Function.Name }}(
    {{- $first := true }}{{ range $k, $v := .Function.Parameters.Properties }}{{ if not $first }},{{ end }}{{ $first = false }}{{ $k }}: {{ template "mm_pytype" $v.Type }}{{ end }}
    {{- "):\\n    \\"\\"\\"\\n    " }}{{ .Function.Description }}{{ "\\n" }}
    {{- if .Function.Parameters.Properties }}{{ "\\n    Args:" }}{{ $req := .Function.Parameters.Required }}
        {{- range $k, $v := .Function.Parameters.Properties }}{{ "\\n    - " }}{{ $k }} ({{ template "mm_pytype" $v.Type }})
            {{- $in := false }}{{ range $req }}{{ if eq . $k }}{{ $in = true }}{{ end }}{{ end }}{{ if $in }} [必填]{{ else }} [选填]{{ end }}: {{ $v.Description }}{{ end }}
    {{- end }}{{ "\\n\\n    \\"\\"\\"" }}
{{- end }}
{{- if .Tools }}{{ "\\n" }}«FORMAT»{{ end }}
{{- if or $hasSys .Tools }}<seed:eos>{{ end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if and (eq .Role "assistant") .ToolCalls }}<seed:bos>assistant
        {{- if .Thinking }}{{ "\\n" }}<seed:think>{{ .Thinking }}</seed:think>{{ end }}
        {{- if .Content }}{{ "\\n" }}{{ .Content }}{{ "\\n" }}{{ end }}
        {{- range .ToolCalls }}{{ "\\n<seed:tool_call>\\n<function=" }}{{ .Function.Name }}>{{ "\\n" }}
            {{- range $k, $v := .Function.Arguments }}<parameter={{ $k }}>{{ template "mm_pystr" $v }}</parameter>{{ "\\n" }}{{ end }}
            {{- "</function>\\n</seed:tool_call>" }}{{ end }}<seed:eos>
    {{- else if eq .Role "assistant" }}<seed:bos>assistant
        {{- if .Thinking }}{{ "\\n" }}<seed:think>{{ .Thinking }}</seed:think>{{ end }}
        {{- if .Content }}{{ "\\n" }}{{ .Content }}{{ if not $last }}<seed:eos>{{ end }}{{ end }}
    {{- else if or $i (not $hasSys) }}<seed:bos>{{ .Role }}{{ "\\n" }}{{ .Content }}<seed:eos>
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<seed:bos>assistant{{ "\\n" }}{{ end }}
""",
        DOUBAO=golit(_DOUBAO), FORMAT=golit(_CALL_FORMAT), LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="seed-oss",
    title="ByteDance Seed-OSS (<seed:bos>role … <seed:eos>, tools as Python signatures, <seed:tool_call> calls)",
    detect=_detect,
    build=_build,
    stop=("<seed:eos>",),
    thinking=True,
    reasoning_key="reasoning_content",
    markers=("<seed:bos>", "<seed:eos>", "<seed:tool_call>", "<seed:think>", "You are Doubao"),
    tool_calls="none structured: <seed:tool_call><function=…><parameter=…> XML is not JSON, and Ollama ships no Seed "
               "PARSER",
    notes=(
        "the Jinja trims contents, reasoning and tool descriptions; Go templates cannot, so text with surrounding "
        "whitespace prints differently",
        "tool-call arguments that are not strings print as Python's str() does (True, None, single-quoted strings "
        "inside lists and objects); floats with no fraction (2.0) print as 2",
        "thinking_budget and use_json_tooldef are not Ollama settings: the TEMPLATE follows their defaults (no "
        "budget, Python signatures)",
    ),
))
