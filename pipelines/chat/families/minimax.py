"""MiniMax M2 and M3 (]~b]role turns closed by [e~[, XML tool invokes; M2 <think>, M3 <mm:think>)."""

from __future__ import annotations

from pipelines.chat.families.blocks import last_index
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


# What M2 and M3 share: the system turn's frame and the tools in it, the message loop with its tool results and user
# turns, and the generation prompt's role; each names its state line, system text, assistant turn and what the prompt
# opens with.
_SKELETON = """
{{- $msgs := .Messages }}{{ $sys := "" }}{{ $hasSys := and $msgs (eq (index $msgs 0).Role "system") }}
{{- if $hasSys }}{{ $sys = (index $msgs 0).Content }}{{ end }}
«STATE»
{{- "]~!b[]~b]system\\n" }}«SYSTEM»
{{- if .Tools }}«TOOLS»{{ range .Tools }}<tool>{{ template "mm_function" .Function }}</tool>{{ "\\n" }}{{ end }}«TOOLS_END»{{ end }}
{{- "[e~[\\n" }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "assistant" }}]~b]ai{{ "\\n" }}«ASSISTANT»
        {{- if not (and $last (not $m.ToolCalls)) }}{{ "[e~[\\n" }}{{ end }}
    {{- else if eq .Role "tool" }}
        {{- if ne $prev "tool" }}]~b]tool{{ end }}{{ "\\n<response>" }}{{ .Content }}</response>
        {{- if ne $next "tool" }}{{ "[e~[\\n" }}{{ end }}
    {{- else if eq .Role "user" }}]~b]user{{ "\\n" }}{{ .Content }}{{ "[e~[\\n" }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}]~b]ai«GENERATE»{{ end }}
"""


def _minimax_template(defines: str, *, state: str, system: str, assistant: str, generate: str, **parts: str) -> str:
    """A MiniMax TEMPLATE: _SKELETON with `state` (a line before the system turn), `system` (what follows its
    ']~b]system' line break), `assistant` (what follows ']~b]ai' and a line break, up to the tool calls' end) and
    `generate` (what the generation prompt's ']~b]ai' is followed by), then filled with `parts` and the loop head."""
    skeleton = _SKELETON
    for key, value in (("STATE", state), ("SYSTEM", system), ("ASSISTANT", assistant), ("GENERATE", generate)):
        skeleton = skeleton.replace(f"«{key}»", value)
    return json_defines() + defines + _fill(skeleton, LOOP_HEAD=_LOOP_HEAD, **parts)


def _build_m2(src: str, tokens: TemplateTokens) -> str:
    return _minimax_template(
        _ARGVAL_DEFINE,
        state=last_index("lastUser", "user"),
        system='{{ if $sys }}{{ $sys }}{{ else }}You are a helpful assistant.{{ end }}',
        assistant="""
        {{- if and .Thinking (gt $i $lastUser) }}<think>{{ "\\n" }}{{ .Thinking }}{{ "\\n" }}</think>{{ "\\n\\n" }}{{ end }}{{ .Content }}
        {{- if .ToolCalls }}{{ "\\n<minimax:tool_call>\\n" }}{{ range .ToolCalls }}<invoke name="{{ .Function.Name }}">{{ "\\n" }}
            {{- range $k, $v := .Function.Arguments }}<parameter name="{{ $k }}">{{ template "mm_argval" $v }}</parameter>{{ "\\n" }}{{ end }}
            {{- "</invoke>\\n" }}{{ end }}</minimax:tool_call>{{ end }}""",
        generate='{{ "\\n<think>\\n" }}',
        TOOLS=golit(_TOOLS), TOOLS_END=golit(_TOOLS_END),
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


# ---------------------------------------------------------------- MiniMax M3 (]<]minimax[>[ XML, <mm:think>)

_NS = "]<]minimax[>["
_M3_IDENTITY = ("Your model version is MiniMax-M3, developed by MiniMax. Knowledge cutoff: January 2026. Founded in "
                "early 2022, MiniMax is a global AI foundation model company committed to advancing the frontiers of "
                "AI towards AGI.")
_M3_THINKING = (
    "\n\n<thinking_instructions>\nYou have a thinking capability that allows you to reason step by step before "
    "responding. When thinking is enabled, wrap your reasoning in <mm:think></mm:think> tags before your response. "
    "When thinking is disabled, begin your response directly after the </mm:think> prefix. When thinking is adaptive, "
    "decide on your own whether to think for the current turn.\n"
)
_M3_MODES = {
    "enabled": "Current thinking mode: enabled. You MUST think step by step before every response, including after "
               "receiving function/tool results.\n",
    "disabled": "Current thinking mode: disabled. Do not output any thinking process.\n",
    "adaptive": "Current thinking mode: adaptive. You are encouraged to think for complex decision-making, multi-step "
                "reasoning, or when analyzing function/tool results.\n",
}
_M3_TOOLS_END = (
    f"</tools>\n\nTo call tools, wrap all invocations in a single {_NS}<tool_call>{_NS}</tool_call> block. Parameter "
    "values containing nested objects or arrays are recursively expanded into XML elements. Example:\n\n"
    f'{_NS}<tool_call>\n{_NS}<invoke name="tool-name-1">{_NS}<param-1>value-1{_NS}</param-1>{_NS}<param-2>{_NS}<item>'
    f"{_NS}<key-a>val-a{_NS}</key-a>{_NS}<key-b>val-b{_NS}</key-b>{_NS}</item>{_NS}</param-2>{_NS}</invoke>\n"
    f'{_NS}<invoke name="tool-name-2">{_NS}<param-1>value-1{_NS}</param-1>{_NS}</invoke>\n{_NS}</tool_call>'
)
# The Jinja's to_xml macro: objects and lists expanded into ]<]minimax[>[-prefixed elements, None left out.
_XML_DEFINE = (
    '{{- define "mm_xml" }}{{ $t := printf "%T" . }}'
    '{{- if eq $t "map[string]interface {}" }}{{ range $k, $v := . }}{{ if ne (printf "%T" $v) "<nil>" }}'
    + _NS + '<{{ $k }}>{{ template "mm_xml" $v }}' + _NS + '</{{ $k }}>{{ end }}{{ end }}'
    '{{- else if eq $t "[]interface {}" }}{{ range . }}' + _NS + '<item>{{ template "mm_xml" . }}' + _NS + '</item>{{ end }}'
    '{{- else if eq $t "<nil>" }}{{ else if eq $t "bool" }}{{ json . }}{{ else }}{{ . }}{{ end }}{{ end }}\n'
)


def _detect_m3(src: str) -> bool:
    return _has_all(
        src, "{%- set ns_token               = ']<]minimax[>['                  -%}", "{%- macro to_xml(val, ns) -%}",
        "{%- set think_begin_token      = '<mm:think>'                     -%}", "Your model version is MiniMax-M3",
        "<tool>{{ tool.function | tojson(ensure_ascii=False) }}</tool>", "{{- bos_token ~ 'developer' ~ '\\n' }}",
        "{%- if messages and messages[0].role == \"root\" -%}",
    )


def _build_m3(src: str, tokens: TemplateTokens) -> str:
    return _minimax_template(
        _XML_DEFINE,
        state='{{- $mode := "adaptive" }}{{ if .IsThinkSet }}{{ if .Think }}{{ $mode = "enabled" }}{{ else }}{{ $mode = "disabled" }}{{ end }}{{ end }}',
        system="""«IDENTITY»«THINKING»{{ if eq $mode "enabled" }}«ENABLED»{{ else if eq $mode "disabled" }}«DISABLED»{{ else }}«ADAPTIVE»{{ end }}</thinking_instructions>{{ "[e~[\\n]~b]developer\\n" }}
{{- if $sys }}{{ $sys }}{{ else }}You are a helpful assistant.{{ end }}""",
        assistant="""{{ if .Thinking }}<mm:think>{{ .Thinking }}</mm:think>{{ else }}</mm:think>{{ end }}{{ .Content }}
        {{- if .ToolCalls }}«NS»<tool_call>{{ "\\n" }}{{ range .ToolCalls }}«NS»<invoke name="{{ .Function.Name }}">
            {{- range $k, $v := .Function.Arguments }}{{ if ne (printf "%T" $v) "<nil>" }}«NS»<{{ $k }}>{{ template "mm_xml" $v }}«NS»</{{ $k }}>{{ end }}{{ end }}
            {{- "«NS»</invoke>\\n" }}{{ end }}«NS»</tool_call>{{ end }}""",
        generate='{{ "\\n" }}{{ if eq $mode "disabled" }}</mm:think>{{ else if eq $mode "enabled" }}<mm:think>{{ end }}',
        IDENTITY=golit(_M3_IDENTITY), THINKING=golit(_M3_THINKING), ENABLED=golit(_M3_MODES["enabled"]),
        DISABLED=golit(_M3_MODES["disabled"]), ADAPTIVE=golit(_M3_MODES["adaptive"]), TOOLS=golit(_TOOLS),
        TOOLS_END=golit(_M3_TOOLS_END), NS=_NS,
    )


register(ChatFamily(
    name="minimax-m3",
    title="MiniMax M3 (]~b]role … [e~[ turns, system and developer blocks, ]<]minimax[>[ XML tool calls, <mm:think>)",
    detect=_detect_m3,
    build=_build_m3,
    stop=("[e~[",),
    thinking=True,
    reasoning_key="reasoning_content",
    think_variable="thinking_mode",
    think_values=("disabled", "enabled"),
    markers=("]~b]ai", "]~b]developer", "[e~[", "]<]minimax[>[", "<mm:think>"),
    tool_calls="none structured: ]<]minimax[>[<invoke> XML elements are not JSON and Ollama ships no MiniMax PARSER",
    notes=(
        "Ollama's think false/true is the Jinja's thinking_mode disabled/enabled; with think unset both follow the "
        "Jinja's default (adaptive)",
        "the Jinja's 'root' role (its own system block) has no counterpart in Ollama's messages: the first system "
        "message is the developer message, as the Jinja takes it",
    ),
))
