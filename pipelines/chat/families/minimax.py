"""MiniMax M2 (]~b]role turns closed by [e~[, <minimax:tool_call> XML invokes, interleaved <think>)."""

from __future__ import annotations

from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import _LOOP_HEAD, _fill, _has_all, golit
from pipelines.chat.families.role_tokens import _ARGVAL_DEFINE
from pipelines.chat.gojson import json_defines

_TOOLS = ("\n\n# Tools\nYou may call one or more tools to assist with the user query.\nHere are the tools available in "
          "JSONSchema format:\n\n<tools>\n")
_TOOLS_END = ("</tools>\n\nWhen making tool calls, use XML format to invoke tools and pass parameters:\n\n"
              '<minimax:tool_call>\n<invoke name="tool-name-1">\n<parameter name="param-key-1">param-value-1'
              '</parameter>\n<parameter name="param-key-2">param-value-2</parameter>\n...\n</invoke>\n'
              "</minimax:tool_call>")


def _detect_m2(src: str) -> bool:
    return _has_all(
        src, "{%- set toolcall_begin_token   = '<minimax:tool_call>'         -%}", "{{- ']~!b[' ~ ']~b]system' ~ '\\n' }}",
        "<tool>{{ tool.function | tojson(ensure_ascii=False) }}</tool>", '{%- set model_identity = "You are a helpful assistant." -%}',
        "{{- '<think>' ~ '\\n' ~ reasoning_content ~ '\\n' ~ '</think>' ~ '\\n\\n' }}", "{{- ']~b]tool' }}",
        "{{- ']~b]ai' ~ '\\n' ~ '<think>' ~ '\\n' }}", "{{- v | tojson(ensure_ascii=False) if v is not string else v }}",
    )


def _build_m2(src: str, tokens: TemplateTokens) -> str:
    return json_defines() + _ARGVAL_DEFINE + _fill(
        """
{{- $msgs := .Messages }}{{ $sys := "" }}{{ $hasSys := and $msgs (eq (index $msgs 0).Role "system") }}
{{- if $hasSys }}{{ $sys = (index $msgs 0).Content }}{{ end }}
{{- $lastUser := -1 }}{{ range $i, $m := $msgs }}{{ if eq .Role "user" }}{{ $lastUser = $i }}{{ end }}{{ end }}
{{- "]~!b[]~b]system\\n" }}{{ if $sys }}{{ $sys }}{{ else }}You are a helpful assistant.{{ end }}
{{- if .Tools }}«TOOLS»{{ range .Tools }}<tool>{{ template "mm_function" .Function }}</tool>{{ "\\n" }}{{ end }}«TOOLS_END»{{ end }}
{{- "[e~[\\n" }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "assistant" }}]~b]ai{{ "\\n" }}
        {{- if and .Thinking (gt $i $lastUser) }}<think>{{ "\\n" }}{{ .Thinking }}{{ "\\n" }}</think>{{ "\\n\\n" }}{{ end }}{{ .Content }}
        {{- if .ToolCalls }}{{ "\\n<minimax:tool_call>\\n" }}{{ range .ToolCalls }}<invoke name="{{ .Function.Name }}">{{ "\\n" }}
            {{- range $k, $v := .Function.Arguments }}<parameter name="{{ $k }}">{{ template "mm_argval" $v }}</parameter>{{ "\\n" }}{{ end }}
            {{- "</invoke>\\n" }}{{ end }}</minimax:tool_call>{{ end }}
        {{- if not (and $last (not $m.ToolCalls)) }}{{ "[e~[\\n" }}{{ end }}
    {{- else if eq .Role "tool" }}
        {{- if ne $prev "tool" }}]~b]tool{{ end }}{{ "\\n<response>" }}{{ .Content }}</response>
        {{- if ne $next "tool" }}{{ "[e~[\\n" }}{{ end }}
    {{- else if eq .Role "user" }}]~b]user{{ "\\n" }}{{ .Content }}{{ "[e~[\\n" }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}]~b]ai{{ "\\n<think>\\n" }}{{ end }}
""",
        TOOLS=golit(_TOOLS), TOOLS_END=golit(_TOOLS_END), LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="minimax-m2",
    title="MiniMax M2 (]~b]role … [e~[ turns, <minimax:tool_call> XML invokes, <think> after the last user turn)",
    detect=_detect_m2,
    build=_build_m2,
    stop=("[e~[",),
    thinking=True,
    reasoning_key="reasoning_content",
    content_none_ok=False,
    markers=("]~b]ai", "]~b]user", "[e~[", "<minimax:tool_call>", "<invoke name="),
    tool_calls="none structured: <minimax:tool_call> <invoke>/<parameter> XML is not JSON and Ollama ships no MiniMax "
               "PARSER",
    notes=(
        "the Jinja's system message fields current_date and current_location and its model_identity are not Ollama "
        "settings: the TEMPLATE follows their absence",
        "the Jinja prints a tool-call message's None content as 'None'; Ollama passes '' (its contents are always "
        "strings), which the proof gives the Jinja too",
        "the Jinja cuts '<think>' blocks out of an assistant content that holds them; Go templates cannot split "
        "strings, so the TEMPLATE relies on Ollama passing reasoning in .Thinking",
    ),
))
