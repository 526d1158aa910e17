"""Kimi K3 (<|open|>tag attrs<|sep|> … <|close|>tag<|sep|>, tools as sorted compact JSON, typed <argument> calls).
"""

from __future__ import annotations

from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import _LOOP_HEAD, _fill, _has_all, golit
from pipelines.chat.gojson import json_defines

# ---------------------------------------------------------------- Kimi K3 (XTML tags)

_EFFORT = ("`thinking_effort` guides on how much to think in your thinking channel (not including the response "
           "channel), supported values include `low`, `medium`, `high`, and `max`.\nNow the system is invoked with "
           "`thinking_effort=")

# json_sorted of the Jinja over what Ollama holds: compact, keys in sorted order, strings quoted (%q).
_SORTED_DEFINE = (
    '{{- define "mm_sjson" }}{{ $t := printf "%T" . }}{{ if eq $t "string" }}{{ printf "%q" . }}'
    '{{ else if eq $t "map[string]interface {}" }}{{ "{" }}{{ $first := true }}{{ range $k, $v := . }}'
    '{{ if not $first }},{{ end }}{{ $first = false }}{{ printf "%q" $k }}:{{ template "mm_sjson" $v }}{{ end }}{{ "}" }}'
    '{{ else if eq $t "[]interface {}" }}[{{ range $i, $v := . }}{{ if $i }},{{ end }}{{ template "mm_sjson" $v }}'
    '{{ end }}]{{ else }}{{ json . }}{{ end }}{{ end }}\n'
    '{{- define "mm_sprop" }}{{ "{" }}{{ $sep := "" }}'
    '{{- if .AnyOf }}{{ $sep }}"anyOf":[{{ range $i, $a := .AnyOf }}{{ if $i }},{{ end }}{{ template "mm_sprop" $a }}'
    '{{ end }}]{{ $sep = "," }}{{ end }}'
    '{{- if .Description }}{{ $sep }}"description":{{ printf "%q" .Description }}{{ $sep = "," }}{{ end }}'
    '{{- if .Enum }}{{ $sep }}"enum":[{{ range $i, $e := .Enum }}{{ if $i }},{{ end }}{{ template "mm_sjson" $e }}'
    '{{ end }}]{{ $sep = "," }}{{ end }}'
    '{{- if .Items }}{{ $sep }}"items":{{ template "mm_sjson" .Items }}{{ $sep = "," }}{{ end }}'
    '{{- if .Type }}{{ $sep }}"type":{{ if eq (len .Type) 1 }}{{ printf "%q" (index .Type 0) }}{{ else }}['
    '{{ range $i, $t := .Type }}{{ if $i }},{{ end }}{{ printf "%q" $t }}{{ end }}]{{ end }}{{ end }}{{ "}" }}{{ end }}\n'
    '{{- define "mm_stool" }}{{ "{" }}"function":{{ "{" }}{{ with .Function }}'
    '{{ if .Description }}"description":{{ printf "%q" .Description }},{{ end }}"name":{{ printf "%q" .Name }},'
    '"parameters":{{ "{" }}"properties":{{ "{" }}{{ $first := true }}{{ range $k, $v := .Parameters.Properties }}'
    '{{ if not $first }},{{ end }}{{ $first = false }}{{ printf "%q" $k }}:{{ template "mm_sprop" $v }}{{ end }}{{ "}" }}'
    '{{ if .Parameters.Required }},"required":[{{ range $i, $r := .Parameters.Required }}{{ if $i }},{{ end }}'
    '{{ printf "%q" $r }}{{ end }}]{{ end }},"type":{{ printf "%q" .Parameters.Type }}{{ "}" }}{{ end }}{{ "}" }},'
    '"type":{{ printf "%q" .Type }}{{ "}" }}{{ end }}\n'
    '{{- define "mm_xtype" }}{{ $t := printf "%T" . }}{{ if eq $t "bool" }}boolean{{ else if eq $t "<nil>" }}null'
    '{{ else if or (eq $t "float64") (eq $t "int") }}number{{ else if eq $t "string" }}string'
    '{{ else if eq $t "map[string]interface {}" }}object{{ else }}array{{ end }}{{ end }}\n'
    '{{- define "mm_xvalue" }}{{ if eq (printf "%T" .) "string" }}{{ . }}{{ else }}{{ template "mm_json" . }}'
    '{{ end }}{{ end }}\n'
)


def _detect_kimi_k3(src: str) -> bool:
    return _has_all(
        src, "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", "macro json_sorted(value)", "render_tool_declare",
        "'# Tools\\nHere are the available tools, described in JSONSchema.\\n\\n```json\\n'", "thinking-effort",
        "Kimi K3",
    )


def _build_kimi_k3(src: str, tokens: TemplateTokens) -> str:
    return json_defines() + _SORTED_DEFINE + _fill(
        """
{{- $msgs := .Messages }}{{ $thinking := not (and .IsThinkSet (not .Think)) }}
{{- $effort := "max" }}{{ if or (eq .ThinkLevel "low") (eq .ThinkLevel "high") (eq .ThinkLevel "max") }}{{ $effort = .ThinkLevel }}{{ end }}
{{- «BOS» }}
{{- if .Tools }}<|open|>message role="system" type="tool-declare"<|sep|>«TOOLS_HEAD»[
    {{- range $i, $t := .Tools }}{{ if $i }},{{ end }}{{ template "mm_stool" $t }}{{ end }}]{{ "\\n```" }}<|close|>message<|sep|><|end_of_msg|>
{{- end }}
{{- if $thinking }}<|open|>message role="system" type="thinking-effort"<|sep|>«EFFORT»{{ $effort }}`.<|close|>message<|sep|><|end_of_msg|>{{ end }}
{{- $prev := "" }}{{ $toolIdx := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}<|open|>message role="user"<|sep|>{{ .Content }}<|close|>message<|sep|><|end_of_msg|>
    {{- else if eq .Role "system" }}<|open|>message role="system"<|sep|>{{ .Content }}<|close|>message<|sep|><|end_of_msg|>
    {{- else if eq .Role "assistant" }}{{ $toolIdx = "" }}<|open|>message role="assistant"<|sep|>
        {{- if $thinking }}<|open|>think<|sep|>{{ .Thinking }}<|close|>think<|sep|>{{ end }}<|open|>response<|sep|>{{ .Content }}
        {{- if or .ToolCalls (not $last) }}<|close|>response<|sep|>{{ end }}
        {{- if .ToolCalls }}<|open|>tools<|sep|>
            {{- $ci := "" }}{{ range $j, $c := .ToolCalls }}{{ $ci = printf "%sx" $ci }}<|open|>call tool="{{ .Function.Name }}" index="{{ len $ci }}"<|sep|>
                {{- range $k, $v := .Function.Arguments }}<|open|>argument key="{{ $k }}" type="{{ template "mm_xtype" $v }}"<|sep|>{{ template "mm_xvalue" $v }}<|close|>argument<|sep|>{{ end }}
                {{- "" }}<|close|>call<|sep|>
            {{- end }}<|close|>tools<|sep|>
        {{- end }}
        {{- if or .ToolCalls (not $last) }}<|close|>message<|sep|><|end_of_msg|>{{ end }}
    {{- else if eq .Role "tool" }}{{ $toolIdx = printf "%sx" $toolIdx }}<|open|>message role="tool" tool="{{ .ToolName }}" index="{{ len $toolIdx }}"<|sep|>{{ .Content }}<|close|>message<|sep|><|end_of_msg|>
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<|open|>message role="assistant"<|sep|>{{ if $thinking }}<|open|>think<|sep|>{{ else }}<|open|>response<|sep|>{{ end }}{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        TOOLS_HEAD=golit("# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n"),
        EFFORT=golit(_EFFORT),
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="kimi-k3",
    title="Kimi K3 (<|open|>…<|sep|>…<|close|> tags, tools as sorted JSON, typed <argument> tool calls)",
    detect=_detect_kimi_k3,
    build=_build_kimi_k3,
    stop=("<|end_of_msg|>",),
    thinking=True,
    reasoning_key="reasoning_content",
    think_variable="thinking",
    markers=("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", "json_sorted", "thinking-effort"),
    tool_calls=("none structured: each call is <|open|>call tool=…<|sep|> with typed <argument> tags, not JSON, and "
                "Ollama ships no Kimi K3 PARSER"),
    notes=(
        "the Jinja escapes '&' and '\"' in tag attributes (tool names, argument keys); Go templates cannot replace "
        "text, so such names print as they are",
        "the Jinja orders a run of tool results by the calls they answer when every result names its call; the "
        "TEMPLATE keeps the order of the messages (the same when results come in call order, as Ollama clients "
        "send them)",
        "Ollama's think false switches the thinking channel off; true and unset give thinking_effort max, the "
        "Jinja's default; a think level low, high or max is used as it is",
        "image prompts, tool_choice and response_format are not Ollama settings: the TEMPLATE follows their absence",
    ),
))
