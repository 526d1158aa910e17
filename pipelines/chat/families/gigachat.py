"""GigaChat 3 and 3.1 (role<|role_sep|> … <|message_sep|> turns, a fixed developer system turn, tools as a TypeScript
namespace, one JSON function call per assistant message).
"""

from __future__ import annotations

from typing import Any

from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import _LOOP_HEAD, _fill, _has_all, _has_none, _render_marked, golit
from pipelines.chat.gojson import json_defines

# ---------------------------------------------------------------- GigaChat 3 / 3.1
#
# The developer system turn is taken from the Jinja itself, rendered with a marker user message. The tool namespace
# follows json_schema_to_typescript for what Ollama's tool schema holds (see the notes for what it cannot follow).

_MARK = "\x00mmU\x00"
_SEP = "<|message_sep|>\n\n"

# json_schema_to_typescript for one property of the parameters (indent "  "): string enums as a union of quoted
# values, number enums joined as they are, arrays of a basic type as T[], no type or several types as any.
_GC_TYPE = (
    '{{- define "mm_gctype" }}{{ if ne (len .Type) 1 }}any{{ else }}{{ $t := index .Type 0 }}'
    '{{ if eq $t "object" }}{{ "{\\n  }" }}'
    '{{ else if eq $t "string" }}{{ if .Enum }}{{ range $i, $e := .Enum }}{{ if $i }} | {{ end }}"{{ $e }}"{{ end }}'
    '{{ else }}string{{ end }}'
    '{{ else if or (eq $t "number") (eq $t "integer") }}{{ if .Enum }}{{ range $i, $e := .Enum }}{{ if $i }} | {{ end }}'
    '{{ $e }}{{ end }}{{ else }}number{{ end }}'
    '{{ else if eq $t "boolean" }}boolean'
    '{{ else if eq $t "array" }}{{ template "mm_gcitems" .Items }}'
    '{{ else }}any{{ end }}{{ end }}{{ end }}\n'
    '{{- define "mm_gcitems" }}{{ if not . }}Array<any>{{ else }}{{ $it := printf "%v" (index . "type") }}'
    '{{ if eq $it "string" }}string[]{{ else if or (eq $it "number") (eq $it "integer") }}number[]'
    '{{ else if eq $it "boolean" }}boolean[]{{ else }}any[]{{ end }}{{ end }}{{ end }}\n'
)


def _detect_gigachat(src: str) -> bool:
    return _has_all(
        src, 'role_sep="<|role_sep|>\\n"', 'message_sep="<|message_sep|>\\n\\n"', "json_schema_to_typescript",
        "render_tool_namespace", "'function descriptions'", "'function result'", '"developer system"',
    )


def _detect_gigachat3(src: str) -> bool:
    return _detect_gigachat(src) and "'function call'" in src and _has_none(src, "<|function_call|>")


def _detect_gigachat31(src: str) -> bool:
    return _detect_gigachat(src) and "<|function_call|>" in src and _has_none(src, "'function call'")


def _developer_turn(src: str) -> str:
    """What the Jinja prints before the first message: the developer system turn."""
    out = _render_marked(src, [{"role": "user", "content": _MARK}], bos_token="", eos_token="")
    return out[:out.index("user<|role_sep|>\n" + _MARK)]


def _build_gigachat(src: str, tokens: TemplateTokens, *, call_turn: bool) -> str:
    call = '{"name": "{{ .Function.Name }}", "arguments": {{ template "mm_args" .Function.Arguments }}}'
    if call_turn:  # GigaChat 3: the call is a 'function call' turn after the assistant's
        assistant = ('{{- else if eq .Role "assistant" }}assistant<|role_sep|>«NL»{{ .Content }}{{ if not $last }}«SEP»{{ end }}'
                     '{{ with .ToolCalls }}{{ with index . 0 }}function call<|role_sep|>«NL»«CALL»«SEP»{{ end }}{{ end }}')
    else:  # GigaChat 3.1: <|function_call|> and the call inside the assistant's turn
        assistant = ('{{- else if eq .Role "assistant" }}assistant<|role_sep|>«NL»{{ .Content }}'
                     '{{ if .ToolCalls }}<|function_call|>{{ with index .ToolCalls 0 }}«CALL»{{ end }}{{ end }}'
                     '{{ if not $last }}«SEP»{{ end }}')
    return json_defines() + _GC_TYPE + _fill(
        """
{{- $msgs := .Messages }}{{ $hasSys := and $msgs (eq (index $msgs 0).Role "system") }}
{{- «BOS» }}{{ «DEV» }}
{{- if $hasSys }}system<|role_sep|>«NL»{{ (index $msgs 0).Content }}«SEP»{{ end }}
{{- if .Tools }}function descriptions<|role_sep|>«NL»namespace functions {
    {{- range .Tools }}{{ with .Function }}«NL»{{ if .Description }}// {{ .Description }}«NL»{{ end }}type {{ .Name }} = {{ $params := .Parameters }}
        {{- if .Parameters.Properties }}(_: {{ "{\\n" }}
            {{- range $k, $v := .Parameters.Properties }}
                {{- if $v.Description }}  // {{ $v.Description }}«NL»{{ end }}  {{ $k }}
                {{- $req := false }}{{ range $params.Required }}{{ if eq . $k }}{{ $req = true }}{{ end }}{{ end }}
                {{- if not $req }}?{{ end }}: {{ template "mm_gctype" $v }},{{ "\\n" }}
            {{- end }}}) => any;{{ "\\n" }}
        {{- else }}() => any;«NL»{{ end }}
    {{- end }}{{ end }}«NL»} // namespace functions«NL»«NL»«SEP»
{{- end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if or $i (not $hasSys) }}
        {{- if eq .Role "tool" }}function result<|role_sep|>«NL»{{ .Content }}{{ if not $last }}«SEP»{{ end }}
        «ASSISTANT»
        {{- else }}{{ .Role }}<|role_sep|>«NL»{{ .Content }}{{ if not $last }}«SEP»{{ end }}
        {{- end }}
        {{- if and $last (ne .Role "assistant") }}«SEP»assistant<|role_sep|>«NL»{{ end }}
        {{- $prev = .Role }}
    {{- end }}
{{- end }}
""",
        ASSISTANT=assistant,
        CALL=call,
        SEP=golit(_SEP),
        BOS=golit(tokens.bos_text)[3:-3],
        DEV=golit(_developer_turn(src))[3:-3],
        LOOP_HEAD=_LOOP_HEAD,
    )


def _gigachat_notes(*extra: str) -> tuple[str, ...]:
    return (
        "the Jinja prints only the first tool call of an assistant message; so does the TEMPLATE",
        "the Jinja splits a tool's and a parameter's description into lines and drops the blank ones; Go templates "
        "cannot split strings, so a description holding a blank line keeps it",
        "the Jinja writes an object parameter's own properties as a nested TypeScript type; the TEMPLATE does not "
        "follow them (a nested type needs a recursive indent Go templates cannot pass), so an object parameter "
        "prints as an empty type, and an array of objects as any[]",
        "format, minimum/maximum, pattern, default and return_parameters are not held by Ollama's tool schema: the "
        "TEMPLATE writes none of the comments the Jinja writes for them",
        *extra,
    )


def _register(name: str, title: str, detect: Any, *, call_turn: bool, tool_calls: str, notes: tuple[str, ...],
              markers: tuple[str, ...]) -> None:
    register(ChatFamily(
        name=name,
        title=title,
        detect=detect,
        build=lambda src, tokens: _build_gigachat(src, tokens, call_turn=call_turn),
        stop=("<|message_sep|>",),
        bos_in_template=True,
        markers=markers,
        tool_calls=tool_calls,
        notes=notes,
    ))


_MARKERS = ("<|role_sep|>", "<|message_sep|>", "developer system", "function descriptions", "function result",
            "json_schema_to_typescript")
_register(
    "gigachat3", "GigaChat 3 (role<|role_sep|> turns, developer system turn, TypeScript tools, 'function call' turns)",
    _detect_gigachat3, call_turn=True, markers=(*_MARKERS, "'function call'"),
    tool_calls=("none structured: the call is a 'function call' turn of {\"name\", \"arguments\"} JSON; Ollama's tool "
                "parser (bare JSON objects: the TEMPLATE names no tag) would find it, but the model's turn ends at "
                "<|message_sep|>, a stop string, before the call, and Ollama ships no GigaChat PARSER"),
    notes=_gigachat_notes(),
)
_register(
    "gigachat3.1", "GigaChat 3.1 (role<|role_sep|> turns, developer system turn, TypeScript tools, <|function_call|>)",
    _detect_gigachat31, call_turn=False, markers=(*_MARKERS, "<|function_call|>"),
    tool_calls=("TEMPLATE: Ollama's tool parser waits for <|function_call|>, then reads the {\"name\", \"arguments\"} "
                "JSON after it; checked on the model's own output for the suite's tool-call conversations, except "
                "parallel calls: the Jinja writes only the first call of a message, so only the first call is "
                "recovered"),
    notes=_gigachat_notes(),
)
