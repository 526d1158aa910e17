"""Tencent Hy3 (<｜hy_User:opensource｜>/<｜hy_Assistant:opensource｜>, <tool_calls:opensource> arg_key/arg_value calls)."""

from __future__ import annotations

from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import _LOOP_HEAD, _fill, _has_all, golit
from pipelines.chat.families.role_tokens import _ARGVAL_DEFINE
from pipelines.chat.gojson import json_defines

_BOS = "<｜hy_begin_of_sentence:opensource｜>"
_EOS = "<｜hy_eos:opensource｜>"
_MODE = "<｜reasoning_mode:opensource｜>reasoning_effort:"
_TOOLS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function "
    "signatures within <tools></tools> XML tags:\n<tools>\n"
)
_TOOLS_END = (
    "\n</tools>\n\nFor function call returns, you should first print <tool_calls:opensource>\nFor each function call, "
    "you should return object like:\n<tool_call:opensource>{function-name}<tool_sep:opensource>\n"
    "<arg_key:opensource>{arg-key-1}</arg_key:opensource>\n<arg_value:opensource>{arg-value-1}</arg_value:opensource>\n"
    "<arg_key:opensource>{arg-key-2}</arg_key:opensource>\n<arg_value:opensource>{arg-value-2}</arg_value:opensource>\n"
    "...\n</tool_call:opensource>\nAt the end of function call returns, you should print </tool_calls:opensource>"
    + _MODE
)


def _detect(src: str) -> bool:
    return _has_all(
        src, "{%- set HYTK = ':opensource' %}", "{%- set eos_token = '<｜hy_eos{}｜>'.format(HYTK) %}",
        "{%- set bos_token = '<｜hy_begin_of_sentence{}｜>'.format(HYTK) %}", "{%- set reasoning_effort = 'no_think' %}",
        "{%- set preserved_thinking = true %}", "{{- toolcalls_end_token + eos_token }}",
        "{{- toolresponse_begin_token + '\\n' + visible_text(message['content']) + '\\n' + toolresponse_end_token + '\\n' }}",
        "{{- assistant_token + think_begin_token + think_end_token }}",
    )


def _build(src: str, tokens: TemplateTokens) -> str:
    # The Jinja sets its own bos_token; an engine that adds that token already gets it from the tokenizer.
    bos = "" if tokens.engine_adds_bos and tokens.bos == _BOS else _BOS
    return json_defines() + _ARGVAL_DEFINE + _fill(
        """
{{- $msgs := .Messages }}{{ $effort := "no_think" }}{{ if .Think }}{{ $effort = "high" }}{{ if eq .ThinkLevel "low" }}{{ $effort = "low" }}{{ end }}{{ end }}
{{- $lastUser := -1 }}{{ $sp := "" }}{{ range $i, $m := $msgs }}{{ if eq .Role "user" }}{{ $lastUser = $i }}{{ end }}{{ if eq .Role "system" }}{{ $sp = print $sp .Content }}{{ end }}{{ end }}
{{- if not .Tools }}{{ $sp = print $sp «MODE» $effort }}{{ end }}
{{- «BOS» }}{{ $sp }}
{{- if .Tools }}{{ if $sp }}{{ "\\n\\n" }}{{ end }}«TOOLS»{{ range $j, $t := .Tools }}{{ if $j }}{{ "\\n" }}{{ end }}{{ template "mm_tool" . }}{{ end }}«TOOLS_END»{{ $effort }}{{ end }}
{{- $preserve := .Tools }}{{ $inTools := false }}{{ $toolFirst := true }}{{ $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}{{ if $inTools }}</tool_responses:opensource>{{ end }}<｜hy_User:opensource｜>{{ .Content }}{{ $inTools = false }}
    {{- else if eq .Role "assistant" }}{{ if $inTools }}</tool_responses:opensource>{{ end }}<｜hy_Assistant:opensource｜><think:opensource>
        {{- if or $preserve (gt $i $lastUser) }}{{ .Thinking }}{{ end }}</think:opensource>{{ .Content }}
        {{- if .ToolCalls }}{{ $toolFirst = true }}<tool_calls:opensource>{{ "\\n" }}
            {{- range .ToolCalls }}<tool_call:opensource>{{ .Function.Name }}<tool_sep:opensource>{{ "\\n" }}
                {{- range $k, $v := .Function.Arguments }}<arg_key:opensource>{{ $k }}</arg_key:opensource>{{ "\\n" }}<arg_value:opensource>{{ template "mm_argval" $v }}</arg_value:opensource>{{ "\\n" }}{{ end }}
                {{- "</tool_call:opensource>\\n" }}{{ end }}</tool_calls:opensource>«EOS»
        {{- else if not $last }}«EOS»{{ end }}
        {{- $inTools = false }}
    {{- else if eq .Role "tool" }}{{ $inTools = true }}{{ if $toolFirst }}<tool_responses:opensource>{{ "\\n" }}{{ $toolFirst = false }}{{ end }}
        {{- "<tool_response:opensource>\\n" }}{{ .Content }}{{ "\\n</tool_response:opensource>\\n" }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if $inTools }}</tool_responses:opensource>{{ end }}
{{- if ne $prev "assistant" }}<｜hy_Assistant:opensource｜><think:opensource>{{ if eq $effort "no_think" }}</think:opensource>{{ end }}{{ end }}
""",
        BOS=golit(bos)[3:-3], MODE=golit(_MODE)[3:-3], TOOLS=golit(_TOOLS), TOOLS_END=golit(_TOOLS_END),
        EOS=_EOS, LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="hy3",
    title="Tencent Hy3 (<｜hy_User:opensource｜>/<｜hy_Assistant:opensource｜>, <think:opensource>, "
          "<tool_call:opensource> arg_key/arg_value calls)",
    detect=_detect,
    build=_build,
    stop=(_EOS, "<｜hy_User:opensource｜>"),
    bos_in_template=True,
    thinking=True,
    reasoning_key="reasoning_content",
    think_variable="reasoning_effort",
    think_values=("no_think", "high"),
    markers=("<｜hy_User{}｜>", "<｜hy_Assistant{}｜>", "reasoning_effort", "<tool_calls{}>", ":opensource"),
    tool_calls="none structured: <tool_call:opensource> blocks of arg_key/arg_value pairs are not JSON, and Ollama "
               "ships no Hy3 PARSER",
    notes=(
        "Ollama's think false/true/'low'/'high' is the Jinja's reasoning_effort no_think/high/low/high",
        "preserved_thinking, is_training, raw_last_assistant and fallback_strategy are not Ollama settings: the "
        "TEMPLATE follows their defaults (reasoning kept when tools are offered)",
    ),
))
