"""DeepSeek V3.2 and V4 (｜DSML｜ tool calls, <｜User｜>/<｜Assistant｜> turns, reasoning_content in <think>)."""

from __future__ import annotations

from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import _LOOP_HEAD, _fill, _has_all, golit
from pipelines.chat.families.role_tokens import _ARGVAL_DEFINE
from pipelines.chat.gojson import json_defines

_DSML = "｜DSML｜"
_EOS = "<｜end▁of▁sentence｜>"

# The tool instructions of each template, as its tools_header and tools_footer assignments evaluate.
_V32_HEADER = (
    "## Tools\n\nYou have access to a set of tools you can use to answer the user's question.\nYou can invoke "
    f'functions by writing a "<{_DSML}function_calls>" block like the following as part of your reply to the user:\n'
    f'<{_DSML}function_calls>\n<{_DSML}invoke name="$FUNCTION_NAME">\n<{_DSML}parameter name="$PARAMETER_NAME" '
    f'string="true|false">$PARAMETER_VALUE</{_DSML}parameter>\n...\n</{_DSML}invoke>\n<{_DSML}invoke '
    f'name="$FUNCTION_NAME2">\n...\n</{_DSML}invoke>\n</{_DSML}function_calls>\n\nString and scalar parameters should '
    "be specified as is without any escaping or quotes, while lists and objects should use JSON format. The "
    '"string" attribute should be set to "true" for string type parameters and "false" for other types (numbers, '
    "booleans, arrays, objects).\n\nIf the thinking_mode is enabled, then after function results you should strongly "
    f"consider outputting a thinking block. Here is an example:\n\n<{_DSML}function_calls>\n...\n</{_DSML}"
    "function_calls>\n\n<function_results>\n...\n</function_results>\n\n<think>...thinking about results</think>\n\n"
    "Here are the functions available in JSONSchema format:\n<functions>\n"
)
_V32_FOOTER = "</functions>\n"
_V4_HEADER = (
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
    f'writing a "<{_DSML}tool_calls>" block like the following:\n\n<{_DSML}tool_calls>\n<{_DSML}invoke '
    f'name="$TOOL_NAME">\n<{_DSML}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{_DSML}'
    f'parameter>\n...\n</{_DSML}invoke>\n<{_DSML}invoke name="$TOOL_NAME2">\n...\n</{_DSML}invoke>\n</{_DSML}'
    'tool_calls>\n\nString parameters should be specified as is and set `string="true"`. For all other types '
    '(numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.\n\nIf '
    "thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after </think> with "
    "tool calls or final response.\n\n### Available Tool Schemas\n\n"
)
_V4_FOOTER = "\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"

# The system prompt: every system message's content joined by a blank line, then the tool instructions.
_SYSTEM = """
{{- $sp := "" }}{{ $firstSp := true }}{{ range $msgs }}{{ if eq .Role "system" }}
    {{- if $firstSp }}{{ $sp = .Content }}{{ $firstSp = false }}{{ else }}{{ $sp = print $sp "\\n\\n" .Content }}{{ end }}{{ end }}{{ end }}
{{- «BOS» }}{{ $sp }}
{{- if .Tools }}{{ if $sp }}{{ "\\n\\n" }}{{ end }}«HEADER»{{ range .Tools }}{{ template "mm_function" .Function }}{{ "\\n" }}{{ end }}«FOOTER»{{ end }}
"""

# One assistant message's DSML tool-call block («BLOCK»: function_calls or tool_calls).
_CALLS = """
{{- if .ToolCalls }}{{ "\\n\\n<｜DSML｜«BLOCK»>\\n" }}{{ range .ToolCalls }}<｜DSML｜invoke name="{{ .Function.Name }}">{{ "\\n" }}
    {{- range $k, $v := .Function.Arguments }}<｜DSML｜parameter name="{{ $k }}" string="{{ if eq (printf "%T" $v) "string" }}true{{ else }}false{{ end }}">{{ template "mm_argval" $v }}</｜DSML｜parameter>{{ "\\n" }}{{ end }}
    {{- "" }}«EMPTY_ARGS»</｜DSML｜invoke>{{ "\\n" }}{{ end }}</｜DSML｜«BLOCK»>{{ end }}
"""


def _detect_v32(src: str) -> bool:
    return _has_all(
        src, "{%- set dsml_token = '｜DSML｜' -%}", "'function_calls>\\n'", "{{- '\\n\\n<function_results>' -}}",
        "{%- set call_order = outer_index - assistant_idx.value -%}", "{%- if call_order == tool_call_count -%}",
        "pending_tool_marker", "{{- '\\n<result>' + (message['content'] or '') + '</result>' -}}",
        "Here are the functions available in JSONSchema format:\\n<functions>\\n",
    )


def _build_v32(src: str, tokens: TemplateTokens) -> str:
    # The Jinja counts a tool result's place among its assistant's calls (outer_index - assistant_idx, compared
    # with the number of calls); Go templates have no arithmetic, so the TEMPLATE keeps the calls not yet
    # answered and drops one per result with slice.
    calls = _fill(_CALLS, BLOCK="function_calls", EMPTY_ARGS="")
    return json_defines() + _ARGVAL_DEFINE + _fill(
        """
{{- $msgs := .Messages }}{{ $think := .Think }}
«SYSTEM»
{{- $lastUser := -1 }}{{ range $i, $m := $msgs }}{{ if eq .Role "user" }}{{ $lastUser = $i }}{{ end }}{{ end }}
{{- $pend := "" }}{{ $batch := slice $msgs 0 0 }}{{ $left := 0 }}{{ $calls := slice $msgs 0 0 }}{{ $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}<｜User｜>{{ .Content }}{{ $pend = "asst" }}
    {{- else if eq .Role "assistant" }}
        {{- if $pend }}{{ if eq $pend "asst" }}<｜Assistant｜>{{ else }}{{ "\\n\\n" }}{{ end }}
            {{- if and $think (gt $i $lastUser) }}<think>{{ .Thinking }}</think>{{ else }}</think>{{ end }}{{ end }}
        {{- $pend = "" }}{{ .Content }}
        «CALLS»
        {{- if not (and $last (not $m.ToolCalls)) }}«EOS»{{ end }}
        {{- if .ToolCalls }}{{ $calls = .ToolCalls }}{{ $left = len .ToolCalls }}{{ end }}
    {{- else if eq .Role "tool" }}
        {{- if eq (len $calls) $left }}{{ "\\n\\n<function_results>" }}{{ end }}
        {{- "\\n<result>" }}{{ .Content }}</result>
        {{- if $calls }}{{ $calls = slice $calls 1 }}{{ if not $calls }}{{ "\\n</function_results>" }}{{ $pend = "tool" }}{{ end }}{{ end }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if eq $pend "asst" }}<｜Assistant｜>{{ else if eq $pend "tool" }}{{ "\\n\\n" }}{{ end }}
{{- if $pend }}{{ if $think }}<think>{{ else }}<think></think>{{ end }}{{ end }}
""",
        SYSTEM=_fill(_SYSTEM, BOS=golit(tokens.bos_text)[3:-3], HEADER=golit(_V32_HEADER), FOOTER=golit(_V32_FOOTER)),
        LOOP_HEAD=_LOOP_HEAD, CALLS=calls, EOS=golit(_EOS),
    )


def _detect_v4(src: str) -> bool:
    return _has_all(
        src, "{%- set dsml_token = '｜DSML｜' -%}", "{%- set drop_thinking = true -%}", "'tool_calls>\\n'",
        "{%- set keep_reasoning = thinking and ((not drop_thinking) or has_tools or is_after_last_user or "
        "ns.has_tool_calls) -%}", "{{- '<tool_result>' + (message['content'] or '') + '</tool_result>' -}}",
        "### Available Tool Schemas\\n\\n", "{%- if not args -%}",
    )


def _build_v4(src: str, tokens: TemplateTokens) -> str:
    calls = _fill(_CALLS, BLOCK="tool_calls", EMPTY_ARGS='{{ if not .Function.Arguments }}{{ "\\n" }}{{ end }}')
    return json_defines() + _ARGVAL_DEFINE + _fill(
        """
{{- $msgs := .Messages }}{{ $think := .Think }}
«SYSTEM»
{{- $lastUser := -1 }}{{ $toolMsgs := false }}{{ range $i, $m := $msgs }}{{ if or (eq .Role "user") (eq .Role "tool") }}{{ $lastUser = $i }}{{ end }}{{ if eq .Role "tool" }}{{ $toolMsgs = true }}{{ end }}{{ end }}
{{- $keepAll := and $think (or .Tools $toolMsgs) }}
{{- $inUser := false }}{{ $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if or (eq .Role "user") (eq .Role "tool") }}{{ if $inUser }}{{ "\\n\\n" }}{{ else }}<｜User｜>{{ $inUser = true }}{{ end }}
        {{- if eq .Role "tool" }}<tool_result>{{ .Content }}</tool_result>{{ else }}{{ .Content }}{{ end }}
    {{- else if eq .Role "assistant" }}{{ $inUser = false }}<｜Assistant｜>
        {{- if or $keepAll (and $think (gt $i $lastUser)) }}<think>{{ .Thinking }}</think>{{ else }}</think>{{ end }}{{ .Content }}
        «CALLS»
        {{- if not (and $last (not $m.ToolCalls)) }}«EOS»{{ end }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<｜Assistant｜>{{ if $think }}<think>{{ else }}</think>{{ end }}{{ end }}
""",
        SYSTEM=_fill(_SYSTEM, BOS=golit(tokens.bos_text)[3:-3], HEADER=golit(_V4_HEADER), FOOTER=golit(_V4_FOOTER)),
        LOOP_HEAD=_LOOP_HEAD, CALLS=calls, EOS=golit(_EOS),
    )


_TOOL_CALLS = ("none structured: ｜DSML｜ invoke/parameter blocks are not JSON, and Ollama's PARSER deepseek3 reads "
               "DeepSeek V3.1's <｜tool▁calls▁begin｜> format")

register(ChatFamily(
    name="deepseek-v3.2",
    title="DeepSeek V3.2 (<｜User｜>/<｜Assistant｜>, ｜DSML｜ function_calls, <function_results> blocks)",
    detect=_detect_v32,
    build=_build_v32,
    stop=(_EOS, "<｜User｜>"),
    bos_in_template=True,
    thinking=True,
    reasoning_key="reasoning_content",
    markers=("<｜User｜>", "<｜Assistant｜>", "｜DSML｜", "function_calls", "<function_results>"),
    tool_calls=_TOOL_CALLS,
    notes=(
        "the Jinja's 'developer' role has no counterpart in Ollama's messages",
        "the Jinja numbers a tool result among its assistant's calls with arithmetic; the TEMPLATE drops an answered "
        "call from the list with slice instead (same output for results that answer the calls in order)",
    ),
))

register(ChatFamily(
    name="deepseek-v4",
    title="DeepSeek V4 and V4 Flash (<｜User｜>/<｜Assistant｜>, ｜DSML｜ tool_calls, <tool_result> in the user turn)",
    detect=_detect_v4,
    build=_build_v4,
    stop=(_EOS, "<｜User｜>"),
    bos_in_template=True,
    thinking=True,
    reasoning_key="reasoning_content",
    markers=("<｜User｜>", "<｜Assistant｜>", "｜DSML｜", "tool_calls", "<tool_result>", "drop_thinking"),
    tool_calls=_TOOL_CALLS,
    notes=(
        "the Jinja's reasoning_effort ('high', 'max'), response_format and drop_thinking are not Ollama settings: "
        "the TEMPLATE follows their defaults (none, none, true)",
        "the Jinja's 'developer' role has no counterpart in Ollama's messages",
    ),
))
