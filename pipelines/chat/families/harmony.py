"""OpenAI gpt-oss (harmony: <|start|>role<|channel|>…<|message|>…<|end|>, tools as a TypeScript namespace).
"""

from __future__ import annotations

from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import _LOOP_HEAD, _fill, _has_all, golit
from pipelines.chat.gojson import json_defines

# ---------------------------------------------------------------- gpt-oss (harmony)
#
# Ollama renders gpt-oss through a TEMPLATE (it has no harmony RENDERER) and sets PARSER harmony itself for a
# gpt-oss model (server/routes.go:2662-2671 at v0.33.0-rc2). This TEMPLATE is proven on the suite.

_IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."

# render_typescript_type for what Ollama's tool schema holds: enums as a union of strings, arrays of a basic type
# as T[], several types joined with " | ".
_TS_TYPE = (
    '{{- define "mm_tstype" }}{{ if gt (len .Type) 1 }}{{ range $i, $t := .Type }}{{ if $i }} | {{ end }}{{ $t }}{{ end }}'
    '{{ else if eq (len .Type) 0 }}any{{ else }}{{ $t := index .Type 0 }}'
    '{{ if eq $t "array" }}{{ template "mm_tsitems" .Items }}'
    '{{ else if eq $t "string" }}{{ if .Enum }}{{ range $i, $e := .Enum }}{{ if $i }} | {{ end }}"{{ $e }}"{{ end }}'
    '{{ else }}string{{ end }}'
    '{{ else if or (eq $t "number") (eq $t "integer") }}number{{ else if eq $t "boolean" }}boolean'
    '{{ else if eq $t "object" }}object{{ else }}any{{ end }}{{ end }}{{ end }}\n'
    '{{- define "mm_tsitems" }}{{ if not . }}any[]{{ else }}{{ $it := printf "%v" (index . "type") }}'
    '{{ if eq $it "string" }}string[]{{ else if or (eq $it "number") (eq $it "integer") }}number[]'
    '{{ else if eq $it "boolean" }}boolean[]{{ else }}any[]{{ end }}{{ end }}{{ end }}\n'
)


def _detect_gpt_oss(src: str) -> bool:
    return _has_all(
        src, "<|start|>", "<|channel|>", "<|message|>", "<|call|>", "render_typescript_type", "render_tool_namespace",
        "# Valid channels: analysis, commentary, final. Channel must be included for every message.", _IDENTITY,
        '"Knowledge cutoff: 2024-06\\n"', "future_final_message",
    )


def _build_gpt_oss(src: str, tokens: TemplateTokens) -> str:
    return json_defines() + _TS_TYPE + _fill(
        """
{{- $msgs := .Messages }}{{ $dev := "" }}{{ $hasDev := and $msgs (eq (index $msgs 0).Role "system") }}
{{- if $hasDev }}{{ $dev = (index $msgs 0).Content }}{{ end }}
{{- «BOS» }}<|start|>system<|message|>«IDENTITY»{{ "\\nKnowledge cutoff: 2024-06\\nCurrent date: " }}{{ currentDate }}{{ "\\n\\nReasoning: " }}
{{- if and .IsThinkSet (not .Think) }}low{{ else if .ThinkLevel }}{{ .ThinkLevel }}{{ else }}medium{{ end }}{{ "\\n\\n" }}
{{- "# Valid channels: analysis, commentary, final. Channel must be included for every message." }}
{{- if .Tools }}{{ "\\nCalls to these tools must go to the commentary channel: 'functions'." }}{{ end }}<|end|>
{{- if or $dev .Tools }}<|start|>developer<|message|>
    {{- if $dev }}{{ "# Instructions\\n\\n" }}{{ $dev }}{{ "\\n\\n" }}{{ end }}
    {{- if .Tools }}{{ "# Tools\\n\\n## functions\\n\\nnamespace functions {\\n\\n" }}
        {{- range .Tools }}{{ with .Function }}// {{ .Description }}{{ "\\n" }}type {{ .Name }} = {{ $params := .Parameters }}
            {{- if .Parameters.Properties }}{{ "(_: {\\n" }}
                {{- range $k, $v := .Parameters.Properties }}
                    {{- if $v.Description }}// {{ $v.Description }}{{ "\\n" }}{{ end }}{{ $k }}
                    {{- $req := false }}{{ range $params.Required }}{{ if eq . $k }}{{ $req = true }}{{ end }}{{ end }}
                    {{- if not $req }}?{{ end }}: {{ template "mm_tstype" $v }},{{ "\\n" }}
                {{- end }}{{ "}) => any;\\n\\n" }}
            {{- else }}{{ "() => any;\\n\\n" }}{{ end }}
        {{- end }}{{ end }}{{ "} // namespace functions" }}
    {{- end }}<|end|>
{{- end }}
{{- $lastCall := "" }}{{ $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if and (eq .Role "assistant") .ToolCalls }}
        {{- $future := false }}{{ range $j, $n := $msgs }}{{ if and (gt $j $i) (eq $n.Role "assistant") (not $n.ToolCalls) }}{{ $future = true }}{{ end }}{{ end }}
        {{- if and .Content (not $future) }}<|start|>assistant<|channel|>analysis<|message|>{{ .Content }}<|end|>
        {{- else if and .Thinking (not $future) }}<|start|>assistant<|channel|>analysis<|message|>{{ .Thinking }}<|end|>{{ end }}
        {{- with index .ToolCalls 0 }}<|start|>assistant to=functions.{{ .Function.Name }}<|channel|>commentary json<|message|>
            {{- template "mm_args" .Function.Arguments }}<|call|>{{ $lastCall = .Function.Name }}{{ end }}
    {{- else if eq .Role "assistant" }}
        {{- if $last }}{{ if .Thinking }}<|start|>assistant<|channel|>analysis<|message|>{{ .Thinking }}<|end|>{{ end }}
            {{- "" }}<|start|>assistant<|channel|>final<|message|>{{ .Content }}
        {{- else }}<|start|>assistant<|channel|>final<|message|>{{ .Content }}<|end|>{{ $lastCall = "" }}{{ end }}
    {{- else if eq .Role "tool" }}<|start|>functions.{{ $lastCall }} to=assistant<|channel|>commentary<|message|>{{ printf "%q" .Content }}<|end|>
    {{- else if eq .Role "user" }}<|start|>user<|message|>{{ .Content }}<|end|>
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<|start|>assistant{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        IDENTITY=golit(_IDENTITY),
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="gpt-oss",
    title="OpenAI gpt-oss (harmony: <|start|>…<|channel|>…<|message|>, tools as a TypeScript namespace)",
    detect=_detect_gpt_oss,
    build=_build_gpt_oss,
    stop=("<|return|>", "<|call|>"),
    thinking=True,
    reasoning_key="thinking",
    # Ollama's think false, true (and 'medium') reach the TEMPLATE as reasoning efforts low and medium
    think_variable="reasoning_effort",
    think_values=("low", "medium"),
    content_none_ok=False,
    markers=("<|start|>", "<|channel|>", "<|message|>", "<|call|>", "render_typescript_type"),
    tool_calls=("PARSER harmony, which Ollama sets itself for a gpt-oss model whose TEMPLATE holds <|start|> and "
                "<|end|> (server/routes.go:77-87, 2662-2671), returns the reasoning and the call (one per message, as "
                "the Jinja writes it)"),
    notes=(
        "Ollama's think false, which gpt-oss cannot honour, becomes 'Reasoning: low'; true is 'medium', as is no "
        "think setting; a think level ('low', 'high') is used as it is",
        "the Jinja renders only the first tool call of an assistant message; so does the TEMPLATE",
        "TypeScript types follow what Ollama's tool schema holds: nested objects print as 'object', arrays of "
        "objects as 'any[]', and no 'nullable' or 'default' (Ollama's API drops them)",
        "builtin_tools and model_identity are not Ollama settings: the TEMPLATE follows their absence",
        "a tool result prints with Go's %q, equal to the Jinja's tojson for printable text",
    ),
))
