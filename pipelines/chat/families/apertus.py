"""Swiss AI Apertus (<|system_start|>/<|developer_start|>/<|user_start|>/<|assistant_start|> tokens, Deliberation
switch, tools as TypeScript types, <|tools_prefix|>[{"name": arguments}] calls, tool results in the assistant turn).
"""

from __future__ import annotations

from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import _LOOP_HEAD, _fill, _has_all, golit
from pipelines.chat.gojson import json_defines

# ---------------------------------------------------------------- Apertus

_DEFAULT_SYSTEM = "You are Apertus, a helpful assistant created by the SwissAI initiative.\nKnowledge cutoff: 2024-04\n"

# render_typescript_type for what Ollama's tool schema holds: arrays of a basic type as T[] (any[] otherwise),
# string enums as a union, numbers and integers as number, an object as object.
_AP_TYPE = (
    '{{- define "mm_aptype" }}{{ if ne (len .Type) 1 }}{{ range $i, $t := .Type }}{{ if $i }} | {{ end }}{{ $t }}{{ end }}'
    '{{ else }}{{ $t := index .Type 0 }}'
    '{{ if eq $t "array" }}{{ template "mm_apitems" .Items }}'
    '{{ else if eq $t "string" }}{{ if .Enum }}{{ range $i, $e := .Enum }}{{ if $i }} | {{ end }}"{{ $e }}"{{ end }}'
    '{{ else }}string{{ end }}'
    '{{ else if or (eq $t "number") (eq $t "integer") }}number{{ else if eq $t "boolean" }}boolean'
    '{{ else if eq $t "object" }}object{{ else }}any{{ end }}{{ end }}{{ end }}\n'
    '{{- define "mm_apitems" }}{{ if not . }}any[]{{ else }}{{ $it := printf "%v" (index . "type") }}'
    '{{ if eq $it "string" }}string[]{{ else if or (eq $it "number") (eq $it "integer") }}number[]'
    '{{ else if eq $it "boolean" }}boolean[]{{ else }}any[]{{ end }}{{ end }}{{ end }}\n'
)


def _detect_apertus(src: str) -> bool:
    return _has_all(
        src, "'<|system_start|>'", "'<|developer_start|>'", "'<|assistant_start|>'", "'<|tools_prefix|>'",
        "'<|inner_prefix|>'", "'Deliberation: '", "render_typescript_type", "'Tool Capabilities:\\n'",
        _DEFAULT_SYSTEM.replace("\n", "\\n") + "Current date: ",
    )


def _build_apertus(src: str, tokens: TemplateTokens) -> str:
    return json_defines() + _AP_TYPE + _fill(
        """
{{- $msgs := .Messages }}{{ $hasSys := and $msgs (eq (index $msgs 0).Role "system") }}
{{- «BOS» }}<|system_start|>{{ if $hasSys }}{{ (index $msgs 0).Content }}{{ else }}«DEFAULT»Current date: {{ currentDate }}{{ end }}<|system_end|>
{{- "" }}<|developer_start|>Deliberation: {{ if and .IsThinkSet .Think }}enabled{{ else }}disabled{{ end }}{{ "\\n" }}
{{- if .Tools }}Tool Capabilities:{{ "\\n" }}
    {{- range $j, $t := .Tools }}{{ if $j }}{{ "\\n" }}{{ end }}{{ with .Function }}// {{ .Description }}{{ "\\n" }}type {{ .Name }} = {{ $params := .Parameters }}
        {{- if .Parameters.Properties }}(_: {{ "{\\n" }}
            {{- $first := true }}
            {{- range $k, $v := .Parameters.Properties }}
                {{- if not $first }},{{ "\\n" }}{{ end }}{{ $first = false }}
                {{- if $v.Description }}// {{ $v.Description }}{{ "\\n" }}{{ end }}{{ $k }}
                {{- $req := false }}{{ range $params.Required }}{{ if eq . $k }}{{ $req = true }}{{ end }}{{ end }}
                {{- if not $req }}?{{ end }}: {{ template "mm_aptype" $v }}
            {{- end }}{{ "\\n}) => any;" }}
        {{- else }}() => any;{{ end }}
    {{- end }}{{ end }}
{{- else }}Tool Capabilities: disabled
{{- end }}<|developer_end|>
{{- $inAsst := false }}{{ $inTool := false }}{{ $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- /* Never renders: names <|tools_prefix|> as the tag Ollama's tool parser waits for. */}}
    {{- if and false .ToolCalls }}<|tools_prefix|>{{ end }}
    {{- if or $i (not $hasSys) }}
        {{- if eq .Role "user" }}
            {{- if $inTool }}]{{ $inTool = false }}{{ end }}
            {{- if $inAsst }}<|assistant_end|>{{ $inAsst = false }}{{ end }}<|user_start|>{{ .Content }}<|user_end|>
        {{- else if eq .Role "assistant" }}
            {{- if not $inAsst }}<|assistant_start|>{{ $inAsst = true }}{{ end }}
            {{- if .Content }}{{ if $inTool }}]{{ $inTool = false }}{{ end }}{{ .Content }}{{ end }}
            {{- if .ToolCalls }}<|tools_prefix|>[
                {{- range $j, $c := .ToolCalls }}{{ if $j }}, {{ end }}{"{{ .Function.Name }}": {{ template "mm_args" .Function.Arguments }}}{{ end }}]<|tools_suffix|>
            {{- end }}
        {{- else if eq .Role "tool" }}
            {{- if $inTool }}, {{ else }}[{{ $inTool = true }}{{ end }}{{ .Content }}
        {{- end }}
        {{- $prev = .Role }}
    {{- end }}
{{- end }}
{{- if $inTool }}]{{ end }}
{{- if ne $prev "assistant" }}<|assistant_start|>{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        DEFAULT=golit(_DEFAULT_SYSTEM),
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="apertus",
    title="Swiss AI Apertus (<|system_start|>/<|developer_start|>, Deliberation switch, TypeScript tools, "
          "<|tools_prefix|> calls)",
    detect=_detect_apertus,
    build=_build_apertus,
    stop=("<|assistant_end|>",),
    bos_in_template=True,
    jinja_date="%Y-%m-%d",
    markers=("<|system_start|>", "<|developer_start|>", "<|assistant_start|>", "<|tools_prefix|>",
             "Deliberation: ", "render_typescript_type"),
    tool_calls=("TEMPLATE: Ollama's tool parser waits for <|tools_prefix|> (named by a never-rendered block), then "
                "finds each call's tool name as the key of a {\"NAME\": arguments} object after it; checked on the "
                "model's own output for the suite's tool-call conversations"),
    notes=(
        "the Jinja reads reasoning from content blocks ({'blocks': [{'type': 'thoughts'}]}), which Ollama's messages "
        "cannot hold: the TEMPLATE writes no <|inner_prefix|> reasoning",
        "an assistant message with empty content closes an open tool-result list (']') in the Jinja; Ollama passes "
        "an absent content as empty, so the TEMPLATE closes it only before a non-empty content",
        "the TEMPLATE does not follow an object parameter's own properties (the Jinja writes them as a nested "
        "type; it prints object), and oneOf, nullable and default are not held by Ollama's tool schema: it writes "
        "no '| null' or default comments",
    ),
))
