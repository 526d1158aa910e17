"""Families with tagged turns and tool calls: Functionary v3.1 (Llama 3.1 headers, <function=…>), Laguna XS 2.1
and Laguna S 2.1, LFM2.5 8B-A1B (Pythonic tool calls), Solar Open (<|begin|>role<|content|>).
"""

from __future__ import annotations

from pipelines.chat.families.blocks import lfm_template
from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import (
    _LOOP_HEAD,
    _fill,
    _has_all,
    _has_none,
    _jinja_string_starting,
    _jinja_strings,
    golit,
)
from pipelines.chat.families.role_tokens import _ARGVAL_DEFINE
from pipelines.chat.gojson import html_json_defines, json_defines

# ---------------------------------------------------------------- Functionary v3.1 (Llama 3.1 headers, <function=…>)

_FUNCTIONARY_TAIL_START = "\nThink very carefully before calling functions."


def _detect_functionary31(src: str) -> bool:
    return (
        _has_all(src, "{# version=v3-llama3.1 #}", "<|start_header_id|>ipython<|end_header_id|>\\n\\n",
                 "\"\\nYou have access to the following functions:\\n\\n\"", "'<function=' + tool_call['function']['name'] + '>'",
                 "'<|python_tag|>'", "{{ '<|eom_id|>' }}", "\"Use the function '\"|safe + t[\"function\"][\"name\"]")
        and _jinja_string_starting(src, _FUNCTIONARY_TAIL_START) is not None
    )


def _build_functionary31(src: str, tokens: TemplateTokens) -> str:
    tail = _jinja_string_starting(src, _FUNCTIONARY_TAIL_START)
    assert tail is not None
    return json_defines() + html_json_defines() + _fill(
        """
{{- $msgs := .Messages }}
{{- «BOS» }}<|start_header_id|>system<|end_header_id|>{{ "\\n\\n\\nCutting Knowledge Date: December 2023\\n\\n" }}
{{- if .Tools }}{{ "\\nYou have access to the following functions:\\n\\n" }}
    {{- range .Tools }}Use the function '{{ html .Function.Name }}' to '{{ html .Function.Description }}'{{ "\\n" }}{{ template "mmh_function" .Function }}{{ "\\n\\n" }}{{ end }}«TAIL»
{{- end }}<|eot_id|>
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if or (eq .Role "user") (eq .Role "system") }}<|start_header_id|>{{ .Role }}<|end_header_id|>{{ "\\n\\n" }}{{ .Content }}<|eot_id|>
    {{- else if eq .Role "tool" }}<|start_header_id|>ipython<|end_header_id|>{{ "\\n\\n" }}{{ .Content }}<|eot_id|>
    {{- else }}<|start_header_id|>{{ .Role }}<|end_header_id|>{{ "\\n\\n" }}{{ .Content }}
        {{- if .ToolCalls }}{{ range .ToolCalls }}<function={{ .Function.Name }}>{{ template "mm_args" .Function.Arguments }}</function>{{ end }}<|eom_id|>
        {{- else if not $last }}<|eot_id|>{{ end }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<|start_header_id|>assistant<|end_header_id|>{{ "\\n\\n" }}{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3], TAIL=golit(tail), LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="functionary-v3.1",
    title="Functionary medium v3.1 (Llama 3.1 headers, <function=name>{json}</function> calls, ipython results)",
    detect=_detect_functionary31,
    build=_build_functionary31,
    stop=("<|eot_id|>", "<|eom_id|>", "<|start_header_id|>"),
    bos_in_template=True,
    markers=("<|start_header_id|>", "<|eot_id|>", "<|eom_id|>", "<function=", "<|python_tag|>",
             "version=v3-llama3.1"),
    tool_calls="TEMPLATE: Ollama's tool parser waits for <function=, then finds the tool's name and the JSON "
               "arguments after it (no Functionary PARSER needed); checked on the model's own output for the suite's "
               "tool-call conversations",
    notes=(
        "a call to the function named 'python' prints as <|python_tag|> in the Jinja; the TEMPLATE prints every "
        "call as <function=…>",
        "the Jinja's code_interpreter tool type ('Environment: ipython') has no counterpart in Ollama's tools",
        "the Jinja adds '|safe' strings to the tool name, description and JSON, which HTML-escapes them (&#34;); "
        "the TEMPLATE escapes them the same way",
    ),
))


# ---------------------------------------------------------------- Laguna XS 2.1 (<system>/<user>/<assistant> tags)

_LAGUNA21_TOOLS = (
    "You may call functions to assist with the user query.\nAll available function signatures are listed below:\n"
    "<available_tools>\n"
)
_LAGUNA21_CALL_FORMAT = (
    "<tool_call>function-name\n<arg_key>argument-key</arg_key>\n<arg_value>value-of-argument-key</arg_value>\n"
    "</tool_call>"
)
_LAGUNA21_THINK = (
    "</available_tools>\n\nWrap your thinking in '<think>', '</think>' tags, followed by a function call. For each "
    "function call, return an unescaped XML-like object with function name and arguments within '<tool_call>' and "
    "'</tool_call>' tags, like here:\n<think> your thoughts here </think>\n" + _LAGUNA21_CALL_FORMAT
)
_LAGUNA21_PLAIN = (
    "</available_tools>\n\nFor each function call, return an unescaped XML-like object with function name and "
    "arguments within '<tool_call>' and '</tool_call>' tags, like here:\n" + _LAGUNA21_CALL_FORMAT
)


def _detect_laguna21(src: str) -> bool:
    return _has_all(
        src, '{{- "〈|EOS|〉" -}}', "enable_thinking | default(false)", "render_assistant_messages_raw | default(false)",
        '"\\n\\n### Tools\\n\\n"', '"<user>\\n" + content + "\\n</user>\\n"', "'<think>\\n' + reasoning_content.strip() + '\\n</think>\\n'",
        '"<tool_response>\\n" + content + "\\n</tool_response>\\n"', '"<system>\\n" + content + "\\n</system>\\n"',
        "Wrap your thinking in '<think>', '</think>' tags, followed by a function call.",
    ) and _has_none(src, "You are a helpful, conversationally-fluent assistant made by Poolside.", "preserve_thinking")


def _build_laguna21(src: str, tokens: TemplateTokens) -> str:
    return json_defines() + _ARGVAL_DEFINE + _fill(
        """
{{- $msgs := .Messages }}{{ $sys := "" }}{{ if and $msgs (eq (index $msgs 0).Role "system") }}{{ $sys = (index $msgs 0).Content }}{{ end }}
{{- "〈|EOS|〉" }}
{{- if or $sys .Tools }}<system>{{ "\\n" }}{{ if $sys }}{{ "\\n" }}{{ $sys }}{{ end }}
    {{- if .Tools }}{{ "\\n\\n### Tools\\n\\n" }}«TOOLS»{{ range .Tools }}{{ template "mm_tool" . }}{{ "\\n" }}{{ end }}{{ if .Think }}«THINK»{{ else }}«PLAIN»{{ end }}{{ end }}
    {{- "\\n</system>\\n" }}
{{- end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}<user>{{ "\\n" }}{{ .Content }}{{ "\\n" }}</user>{{ "\\n" }}
    {{- else if eq .Role "assistant" }}<assistant>{{ "\\n" }}
        {{- if .Thinking }}<think>«NL»{{ .Thinking }}«NL»</think>«NL»{{ else }}</think>«NL»{{ end }}
        {{- if .Content }}{{ .Content }}{{ if not (and $last (not $m.ToolCalls)) }}{{ "\\n" }}{{ end }}{{ end }}
        {{- if .ToolCalls }}{{ range .ToolCalls }}<tool_call>{{ .Function.Name }}{{ "\\n" }}
            {{- range $k, $v := .Function.Arguments }}<arg_key>{{ $k }}</arg_key>{{ "\\n" }}<arg_value>{{ template "mm_argval" $v }}</arg_value>{{ "\\n" }}{{ end }}
            {{- "</tool_call>\\n" }}{{ end }}{{ end }}
        {{- if not (and $last (not $m.ToolCalls)) }}</assistant>{{ "\\n" }}{{ end }}
    {{- else if eq .Role "tool" }}<tool_response>{{ "\\n" }}{{ .Content }}{{ "\\n" }}</tool_response>{{ "\\n" }}
    {{- else if and (eq .Role "system") $i }}<system>{{ "\\n" }}{{ .Content }}{{ "\\n" }}</system>{{ "\\n" }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<assistant>{{ "\\n" }}{{ if .Think }}<think>{{ else }}</think>{{ end }}{{ end }}
""",
        TOOLS=golit(_LAGUNA21_TOOLS), THINK=golit(_LAGUNA21_THINK), PLAIN=golit(_LAGUNA21_PLAIN),
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="laguna-xs-2.1",
    title="Poolside Laguna XS 2.1 (〈|EOS|〉, <system>/<user>/<assistant> tags, <arg_key>/<arg_value> calls)",
    detect=_detect_laguna21,
    build=_build_laguna21,
    stop=("〈|EOS|〉", "</assistant>"),
    thinking=True,
    reasoning_key="reasoning",
    markers=("〈|EOS|〉", "<assistant>", "<user>", "<arg_key>", "render_assistant_messages_raw"),
    tool_calls="none structured: <tool_call> blocks of <arg_key>/<arg_value> pairs are not JSON; Ollama's laguna "
               "PARSER follows Laguna XS.2 and modelmint has not checked it against 2.1",
    notes=(
        "the Jinja strips whitespace around the system prompt, reasoning and contents; Go templates cannot",
        "render_assistant_messages_raw is not an Ollama setting: the TEMPLATE follows its default (false)",
    ),
))


# ---------------------------------------------------------------- Laguna S 2.1 (thinking on by default, compact tags)

_LAGUNA_DEFAULT = ("You are a helpful, conversationally-fluent assistant made by Poolside. You are here to be helpful "
                   "to users through natural language conversations.")


def _detect_laguna_s21(src: str) -> bool:
    return _has_all(
        src, '{{- "〈|EOS|〉" -}}', "enable_thinking | default(true)", "preserve_thinking | default(false)",
        f'set system_message = "{_LAGUNA_DEFAULT}"', '"<user>" + content + "</user>\\n"',
        "'<think>' + reasoning_content + '</think>'", '"<tool_response>" + content + "</tool_response>\\n"',
        '"<system>" + content + "</system>\\n"', '"### Tools\\n\\n"', '"</available_tools>"',
    ) and _has_none(src, "render_assistant_messages_raw")


def _build_laguna_s21(src: str, tokens: TemplateTokens) -> str:
    return json_defines() + _ARGVAL_DEFINE + _fill(
        """
{{- $msgs := .Messages }}{{ $think := or (not .IsThinkSet) .Think }}
{{- $hasSys := and $msgs (eq (index $msgs 0).Role "system") }}{{ $sys := «DEFAULT» }}{{ if $hasSys }}{{ $sys = (index $msgs 0).Content }}{{ end }}
{{- "〈|EOS|〉" }}
{{- if or $sys .Tools $think }}<system>{{ $sys }}{{ if and $sys .Tools }}{{ "\\n\\n" }}{{ end }}
    {{- if .Tools }}«TOOLS»{{ range .Tools }}{{ template "mm_tool" . }}{{ "\\n" }}{{ end }}</available_tools>{{ end }}</system>{{ "\\n" }}
{{- end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}<user>{{ .Content }}</user>{{ "\\n" }}
    {{- else if eq .Role "assistant" }}<assistant>{{ if $think }}<think>{{ .Thinking }}</think>{{ else }}</think>{{ end }}{{ .Content }}
        {{- if .ToolCalls }}{{ range .ToolCalls }}<tool_call>{{ .Function.Name }}
            {{- range $k, $v := .Function.Arguments }}<arg_key>{{ $k }}</arg_key><arg_value>{{ template "mm_argval" $v }}</arg_value>{{ end }}</tool_call>{{ end }}{{ end }}
        {{- if not (and $last (not $m.ToolCalls)) }}</assistant>{{ "\\n" }}{{ end }}
    {{- else if eq .Role "tool" }}<tool_response>{{ .Content }}</tool_response>{{ "\\n" }}
    {{- else if and (eq .Role "system") $i }}<system>{{ .Content }}</system>{{ "\\n" }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<assistant>{{ if $think }}<think>{{ else }}</think>{{ end }}{{ end }}
""",
        DEFAULT=golit(_LAGUNA_DEFAULT)[3:-3],
        TOOLS=golit("### Tools\n\nYou may call functions to assist with the user query.\n"
                    "All available function signatures are listed below:\n<available_tools>\n"),
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="laguna-s-2.1",
    title="Poolside Laguna S 2.1 (〈|EOS|〉, <system>/<user>/<assistant>, thinking on unless switched off)",
    detect=_detect_laguna_s21,
    build=_build_laguna_s21,
    stop=("〈|EOS|〉", "</assistant>"),
    thinking=True,
    reasoning_key="reasoning",
    markers=("〈|EOS|〉", "<assistant>", "<user>", "<arg_key>", "preserve_thinking", "made by Poolside"),
    tool_calls="none structured: <tool_call> blocks of <arg_key>/<arg_value> pairs are not JSON; Ollama's "
               "poolside-v1 PARSER follows a neighbouring Laguna template that modelmint has not checked against S 2.1",
    notes=(
        "the Jinja trims the system prompt's trailing whitespace and treats a whitespace-only one as none; Go "
        "templates cannot",
        "preserve_thinking is not an Ollama setting: the TEMPLATE follows its default (false)",
    ),
))


# ---------------------------------------------------------------- LFM2.5 8B-A1B (Pythonic tool calls; PARSER lfm2-thinking)

# format_arg_value of the Jinja: a string in single quotes, a mapping as JSON, anything else as Python's str().
_PYVAL_DEFINE = (
    '{{- define "mm_pyrepr" }}{{ $t := printf "%T" . }}{{ if eq $t "string" }}\'{{ . }}\''
    '{{ else if eq $t "[]interface {}" }}[{{ range $i, $v := . }}{{ if $i }}, {{ end }}{{ template "mm_pyrepr" $v }}{{ end }}]'
    '{{ else if eq $t "map[string]interface {}" }}{{ "{" }}{{ $first := true }}{{ range $k, $v := . }}'
    '{{ if not $first }}, {{ end }}{{ $first = false }}\'{{ $k }}\': {{ template "mm_pyrepr" $v }}{{ end }}{{ "}" }}'
    '{{ else if eq $t "bool" }}{{ if . }}True{{ else }}False{{ end }}{{ else if eq $t "<nil>" }}None'
    '{{ else }}{{ json . }}{{ end }}{{ end }}\n'
    '{{- define "mm_pyval" }}{{ if eq (printf "%T" .) "map[string]interface {}" }}{{ template "mm_json" . }}'
    '{{ else }}{{ template "mm_pyrepr" . }}{{ end }}{{ end }}\n'
)


def _detect_lfm25_moe(src: str) -> bool:
    return _has_all(
        src, "{{- bos_token -}}", "preserve_thinking | default(false)", "macro format_arg_value(arg_value)",
        "{{- \"'\" + arg_value + \"'\" -}}", '"<|tool_call_start|>[" + (tool_calls_ns.tool_calls | join(", ")) + "]<|tool_call_end|>"',
        '"List of tools: ["', "message.thinking is defined and (preserve_thinking or loop.index0 > ns.last_user_index)",
        "{%- generation -%}",
    )


def _build_lfm25_moe(src: str, tokens: TemplateTokens) -> str:
    return json_defines() + _PYVAL_DEFINE + lfm_template(
        tokens,
        last=("lastUser", "user"),
        message=(
            '{{- if and (eq .Role "assistant") .Thinking (gt $i $lastUser) }}<think>{{ .Thinking }}</think>{{ end }}'
            "{{ .Content }}",
            "{{- if .ToolCalls }}<|tool_call_start|>[{{ range $j, $c := .ToolCalls }}{{ if $j }}, {{ end }}"
            "{{ .Function.Name }}(",
            "    {{- $first := true }}{{ range $k, $v := .Function.Arguments }}{{ if not $first }}, {{ end }}"
            '{{ $first = false }}{{ $k }}={{ template "mm_pyval" $v }}{{ end }})',
            "    {{- end }}]<|tool_call_end|>{{ end }}",
            '{{- if not (and $last (eq .Role "assistant") (not $m.ToolCalls)) }}<|im_end|>{{ "\\n" }}{{ end }}',
        ),
    )


register(ChatFamily(
    name="lfm2.5-moe",
    title="Liquid LFM2.5 8B-A1B (ChatML, Pythonic <|tool_call_start|>[f(a='x')]<|tool_call_end|>; PARSER lfm2-thinking)",
    detect=_detect_lfm25_moe,
    build=_build_lfm25_moe,
    stop=("<|im_end|>", "<|im_start|>"),
    bos_in_template=True,
    thinking=True,
    reasoning_key="thinking",
    content_none_ok=False,
    markers=("<|im_start|>", "<|im_end|>", "List of tools: [", "<|tool_call_start|>", "format_arg_value",
             "preserve_thinking"),
    parser="lfm2-thinking",
    tool_calls="PARSER lfm2-thinking returns structured tool_calls and the <think> reasoning",
    notes=(
        "tool-call arguments print as the Jinja's format_arg_value does (strings in single quotes, Python str() of "
        "other values); strings holding quotes or backslashes and floats with no fraction (2.0) print differently",
        "preserve_thinking is not an Ollama setting: the TEMPLATE follows its default (false)",
        "the Jinja fails on a None content; Ollama's contents are always strings",
    ),
))


# ---------------------------------------------------------------- Solar Open (<|begin|>role<|content|>…<|end|>)

_SOLAR_PROVIDER = ("## Provider System Prompt\n\nYou are Solar Open 100B, a large language model trained by Upstage AI, "
                   "a Korean startup. Your knowledge cutoff is 2025-07. The current date is ")
_SOLAR_TOOLS_START = "\nYou may invoke one or more tools to assist with the user's query."


def _solar_tools_texts(src: str) -> list[str] | None:
    """The tool instructions after the tool list, in order, read from the Jinja."""
    strings = _jinja_strings(src)
    try:
        at = strings.index("<|tools:end|>\n")
    except ValueError:
        return None
    tail = strings[at + 1:at + 7]
    ok = len(tail) == 6 and tail[0] == "\n### Tool Call Format\n" and tail[-1].startswith("- Ensure the <tool-call-id>")
    return tail if ok else None


def _detect_solar(src: str) -> bool:
    return (
        _has_all(src, '"<|begin|>system<|content|>"', '"<|begin|>user<|content|>" + message.content + "<|end|>"',
                 '"<|begin|>assistant<|content|>" + message.content + "<|end|>"', '"<|begin|>assistant<|tool_calls|>"',
                 '"<|begin|>tool<|tool_response|>"', "strftime_now(\"%Y-%m-%d\")", 'think_render_option == "lastthink"',
                 '"<|begin|>assistant<|think|>" + message.reasoning + "<|end|>"', '{{- "<|begin|>assistant" }}')
        and _SOLAR_PROVIDER in _jinja_strings(src) and _solar_tools_texts(src) is not None
        and any(t.startswith(_SOLAR_TOOLS_START) for t in _jinja_strings(src))
    )


def _build_solar(src: str, tokens: TemplateTokens) -> str:
    tail = _solar_tools_texts(src)
    intro = next(t for t in _jinja_strings(src) if t.startswith(_SOLAR_TOOLS_START))
    assert tail is not None
    return json_defines() + _fill(
        """
{{- $msgs := .Messages }}{{ $hasSys := false }}{{ range $msgs }}{{ if eq .Role "system" }}{{ $hasSys = true }}{{ end }}{{ end }}
{{- $lastUser := -1 }}{{ range $i, $m := $msgs }}{{ if eq .Role "user" }}{{ $lastUser = $i }}{{ end }}{{ end }}
{{- "<|begin|>system<|content|>" }}«PROVIDER»{{ currentDate }}.
{{- if $hasSys }}{{ "\\n\\n## System Prompt" }}{{ range $msgs }}{{ if eq .Role "system" }}{{ "\\n\\n" }}{{ .Content }}{{ end }}{{ end }}{{ end }}
{{- if .Tools }}{{ "\\n\\n## Tools\\n\\n### Tool Call Instruction" }}«INTRO»{{ "\\n### Available Tools\\n<|tools:begin|>" }}
    {{- range .Tools }}<|tool:begin|>{{ template "mm_function" .Function }}<|tool:end|>{{ end }}{{ "<|tools:end|>\\n" }}«TAIL»
{{- end }}<|end|>
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}<|begin|>user<|content|>{{ .Content }}<|end|>
    {{- else if eq .Role "tool" }}
        {{- if ne $prev "tool" }}<|begin|>tool<|tool_response|>{{ end }}
        {{- "<|tool_response:begin|>" }}{{ .ToolCallID }}<|tool_response:name|>{{ .ToolName }}<|tool_response:result|>{{ .Content }}<|tool_response:end|>
        {{- if ne $next "tool" }}<|end|>{{ end }}
    {{- else if eq .Role "assistant" }}
        {{- if and .Thinking (gt $i $lastUser) }}<|begin|>assistant<|think|>{{ .Thinking }}<|end|>{{ end }}
        {{- /* Never renders: names <|tool_calls|>, what the model writes after <|begin|>assistant, as Ollama's tool-call tag. */}}
        {{- if .ToolCalls }}{{ if false }}<|tool_calls|>{{ end }}<|begin|>assistant<|tool_calls|>{{ range .ToolCalls }}<|tool_call:begin|>{{ .ID }}<|tool_call:name|>{{ .Function.Name }}<|tool_call:args|>{{ template "mm_args" .Function.Arguments }}<|tool_call:end|>{{ end }}<|calls|>
        {{- else }}<|begin|>assistant<|content|>{{ .Content }}{{ if not $last }}<|end|>{{ end }}{{ end }}
        {{- /* Never renders: the model's reasoning sits between <|think|> and <|end|>, the tags Ollama's thinking parser reads. */}}
        {{- if false }}<|think|>{{ .Thinking }}<|end|>{{ end }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}{{ if eq .ThinkLevel "low" }}<|begin|>assistant<|think|><|end|>{{ end }}<|begin|>assistant{{ end }}
""",
        PROVIDER=golit(_SOLAR_PROVIDER), INTRO=golit(intro), TAIL=golit("".join(tail)), LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="solar-open",
    title="Upstage Solar Open (<|begin|>role<|content|>…<|end|>, <|think|> reasoning, <|tool_call:begin|> calls)",
    detect=_detect_solar,
    build=_build_solar,
    stop=("<|end|>", "<|calls|>"),
    thinking=True,
    reasoning_key="reasoning",
    markers=("<|begin|>", "<|content|>", "<|end|>", "<|tool_calls|>", "<|tool_call:begin|>", "Solar Open"),
    tool_calls="TEMPLATE: Ollama's tool parser waits for <|tool_calls|> (named by a never-rendered block), then finds "
               "each call's tool name after <|tool_call:name|> and its JSON arguments after <|tool_call:args|>; checked "
               "on the model's own output for the suite's tool-call conversations, except one that reasons first: "
               "the model closes its reasoning with <|end|>, a stop string, so that turn ends before the calls",
    notes=(
        "the Jinja names a tool result's tool by looking up its call id; the TEMPLATE prints Ollama's tool_name",
        "the Jinja's reasoning_effort low/minimal maps to Ollama's think level 'low'; its think_render_option and "
        "response_format have no Ollama counterpart (the TEMPLATE follows their defaults)",
    ),
))
