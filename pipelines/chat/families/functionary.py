"""Functionary medium v3.2 (Llama 3 headers, tools as a TypeScript namespace, '>>>recipient' messages).
"""

from __future__ import annotations

from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import _LOOP_HEAD, _fill, _has_all, _render_marked, golit
from pipelines.chat.gojson import json_defines

# ---------------------------------------------------------------- Functionary medium v3.2
#
# The system turn up to the namespace's body is taken from the Jinja rendered with a marker user message.

_MARK = "\x00mmU\x00"
_NS_OPEN = "namespace functions {\n\n"

# get_param_type and the array branch of get_parameter_typescript for what Ollama's tool schema holds: integer as
# number, several types joined with ' | ', string enums quoted, arrays as T[], (enum)[] or [].
_FN_TYPE = (
    '{{- define "mm_fnenum" }}{{ range $i, $e := . }}{{ if $i }} | {{ end }}{{ if eq (printf "%T" $e) "string" }}'
    '"{{ $e }}"{{ else }}{{ $e }}{{ end }}{{ end }}{{ end }}\n'
    '{{- define "mm_fntype1" }}{{ if or (eq . "integer") (eq . "float") }}number{{ else }}{{ . }}{{ end }}{{ end }}\n'
    '{{- define "mm_fntype" }}{{ if eq (len .Type) 0 }}any{{ else if gt (len .Type) 1 }}'
    '{{ range $i, $t := .Type }}{{ if $i }} | {{ end }}{{ $t }}{{ end }}'
    '{{ else }}{{ $t := index .Type 0 }}'
    '{{ if eq $t "object" }}{{ "{\\n}" }}'
    '{{ else if eq $t "array" }}{{ template "mm_fnitems" .Items }}'
    '{{ else if .Enum }}{{ template "mm_fnenum" .Enum }}'
    '{{ else }}{{ template "mm_fntype1" $t }}{{ end }}{{ end }}{{ end }}\n'
    '{{- define "mm_fnitems" }}{{ if not . }}[]{{ else if index . "enum" }}({{ template "mm_fnenum" index . "enum" }})[]'
    '{{ else }}{{ $it := printf "%v" (index . "type") }}{{ if eq $it "object" }}{{ "{\\n}" }}[]'
    '{{ else if eq $it "<nil>" }}any[]{{ else }}{{ template "mm_fntype1" $it }}[]{{ end }}{{ end }}{{ end }}\n'
)


def _detect_functionary_v32(src: str) -> bool:
    return _has_all(
        src, "{# version=v3.llama3 #}", "generate_schema_from_functions", "get_parameter_typescript",
        "'>>>all\\n'", "'>>>' + tool_call['function']['name'] + '\\n' + tool_call['function']['arguments']",
        "'<|start_header_id|>assistant<|end_header_id|>\\n\\n>>>'",
    )


def _system_head(src: str) -> str:
    out = _render_marked(src, [{"role": "user", "content": _MARK}], bos_token="", eos_token="")
    return out[:out.index(_NS_OPEN) + len(_NS_OPEN)]


def _build_functionary_v32(src: str, tokens: TemplateTokens) -> str:
    return json_defines() + _FN_TYPE + _fill(
        """
{{- $msgs := .Messages }}
{{- «BOS» }}{{ «HEAD» }}
{{- range .Tools }}{{ with .Function }}// {{ .Description }}{{ "\\ntype " }}{{ .Name }}{{ $params := .Parameters }}
    {{- if .Parameters.Properties }} = (_: {
        {{- range $k, $v := .Parameters.Properties }}
            {{- if $v.Description }}{{ "\\n// " }}{{ $v.Description }}.{{ end }}{{ "\\n" }}{{ $k }}
            {{- $req := false }}{{ range $params.Required }}{{ if eq . $k }}{{ $req = true }}{{ end }}{{ end }}
            {{- if not $req }}?{{ end }}: {{ template "mm_fntype" $v }},
        {{- end }}{{ "\\n}) => any;\\n\\n" }}
    {{- else }}{{ " = () => any;\\n\\n" }}{{ end }}
{{- end }}{{ end }}} // namespace functions<|eot_id|>
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "assistant" }}<|start_header_id|>assistant<|end_header_id|>{{ "\\n\\n" }}
        {{- if .Content }}>>>all{{ "\\n" }}{{ .Content }}{{ end }}
        {{- range .ToolCalls }}>>>{{ .Function.Name }}{{ "\\n" }}{{ template "mm_args" .Function.Arguments }}{{ end }}
        {{- if not $last }}<|eot_id|>{{ end }}
    {{- else }}<|start_header_id|>{{ .Role }}<|end_header_id|>{{ "\\n\\n" }}{{ .Content }}<|eot_id|>
    {{- end }}
    {{- if and $last (ne .Role "assistant") }}<|start_header_id|>assistant<|end_header_id|>{{ "\\n\\n" }}>>>{{ end }}
{{- end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        HEAD=golit(_system_head(src))[3:-3],
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="functionary-v3.2",
    title="Functionary medium v3.2 (Llama 3 headers, TypeScript tool namespace, '>>>recipient' messages and calls)",
    detect=_detect_functionary_v32,
    build=_build_functionary_v32,
    stop=("<|eot_id|>",),
    bos_in_template=True,
    string_arguments=_detect_functionary_v32,
    markers=("<|start_header_id|>", "{# version=v3.llama3 #}", "generate_schema_from_functions", ">>>all",
             "get_parameter_typescript"),
    tool_calls=("none structured: each call is '>>>NAME' and a line of its JSON arguments, in which Ollama's tool "
                "parser (bare JSON objects: the TEMPLATE names no tag) finds no tool name, and Ollama ships no "
                "Functionary PARSER"),
    notes=(
        "the Jinja ends a parameter's description with '.' unless it ends with one already; Go templates cannot "
        "test a suffix, so the TEMPLATE always adds it (a description ending in '.' gets two)",
        "the TEMPLATE does not follow an object parameter's own properties (it prints an empty type), and default, "
        "format, minimum/maximum and examples are not held by Ollama's tool schema: it writes no comments for them",
        "Ollama's tools are all of type function: the Jinja's code_interpreter system turn never applies",
    ),
))
