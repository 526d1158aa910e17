"""Families with their own role tokens: Kimi K2, Spark 2.5, Ling 3.0 / Bailing V3, GLM-4.6, RWKV World,
MiniMax-M1.
"""

from __future__ import annotations

from pipelines.chat.families.chatml import _THINK_TAGS
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
from pipelines.chat.gojson import json_defines

# ---------------------------------------------------------------- Kimi K2 (<|im_system|>/<|im_user|>/<|im_assistant|>)


def _detect_kimi_k2(src: str) -> bool:
    return _has_all(
        src, "<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>",
        "<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>", "<|im_user|>user<|im_middle|>",
        "<|im_assistant|>assistant<|im_middle|>", "<|im_system|>tool<|im_middle|>", "<|tool_calls_section_begin|>",
        "'functions.' + func_name + ':' + loop.index0|string", "## Return of {{ message.tool_call_id }}\\n{{",
    ) and _has_none(src, "<think>", "reasoning_content", "toolcall_")


def _build_kimi_k2(src: str, tokens: TemplateTokens) -> str:
    return json_defines() + _fill(
        """
{{- if .Tools }}<|im_system|>tool_declare<|im_middle|>[{{ range $j, $t := .Tools }}{{ if $j }}, {{ end }}{{ template "mm_tool" . }}{{ end }}]<|im_end|>{{ end }}
{{- $msgs := .Messages }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if and (eq $i 0) (ne .Role "system") }}<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>{{ end }}
    {{- if eq .Role "system" }}<|im_system|>system<|im_middle|>{{ .Content }}
    {{- else if eq .Role "user" }}<|im_user|>user<|im_middle|>{{ .Content }}
    {{- else if eq .Role "assistant" }}<|im_assistant|>assistant<|im_middle|>{{ .Content }}
        {{- if .ToolCalls }}<|tool_calls_section_begin|>{{ range $j, $c := .ToolCalls }}<|tool_call_begin|>functions.{{ .Function.Name }}:{{ $j }}<|tool_call_argument_begin|>{{ template "mm_args" .Function.Arguments }}<|tool_call_end|>{{ end }}<|tool_calls_section_end|>{{ end }}
    {{- else if eq .Role "tool" }}<|im_system|>tool<|im_middle|>## Return of {{ .ToolCallID }}{{ "\\\\n" }}{{ .Content }}
    {{- end }}
    {{- if not (and $last (eq .Role "assistant") (not $m.ToolCalls)) }}<|im_end|>{{ end }}
    {{- if and $last (ne .Role "assistant") }}<|im_assistant|>assistant<|im_middle|>{{ end }}
{{- end }}
""",
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="kimi-k2",
    title="Kimi K2 Instruct (<|im_system|>/<|im_user|>/<|im_assistant|>, tool_declare, <|tool_call_begin|>)",
    detect=_detect_kimi_k2,
    build=_build_kimi_k2,
    stop=("<|im_end|>",),
    markers=("<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|tool_calls_section_begin|>",
             "tool_declare"),
    tool_calls="TEMPLATE: Ollama's tool parser waits for <|tool_calls_section_begin|>, then finds each call's tool "
               "name inside functions.NAME:N and the JSON arguments after it (no Kimi PARSER needed); checked on the "
               "model's own output for the suite's tool-call conversations",
    notes=("the Jinja writes a literal backslash-n after '## Return of <id>' (it is template text, not an "
           "escape); so does the TEMPLATE",),
))


# ---------------------------------------------------------------- Spark 2.5 (<|System|>/<|User|>/<|Bot|>, GLM-style calls)

_ARGVAL_DEFINE = (
    '{{- define "mm_argval" }}{{ if eq (printf "%T" .) "string" }}{{ . }}{{ else }}{{ template "mm_json" . }}'
    '{{ end }}{{ end }}\n'
)


def _detect_spark(src: str) -> bool:
    return _has_all(
        src, "'<｜start▁of▁sentence｜><|System|>' + '\\n' + default_system", "set default_system = 'you are a helpful assistant.'",
        "'## Tools' + '\\n' + 'You have access to the following functions:' + '\\n' + '<tools>'",
        "'\\n' + tool.function | tojson", "'<｜start▁of▁sentence｜><|Bot|>'", "'<tool_call>' + tool_call.function.name",
        "'<arg_key>' ~ k ~ '</arg_key><arg_value>' ~ (v if v is string else v | tojson) ~ '</arg_value>'",
        "enable_thinking | default(true)", "message.reasoning_content",
    )


def _build_spark(src: str, tokens: TemplateTokens) -> str:
    sos, eos = "<｜start▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
    return json_defines() + _ARGVAL_DEFINE + _fill(
        """
{{- $msgs := .Messages }}{{ $sys := "" }}{{ if and $msgs (eq (index $msgs 0).Role "system") }}{{ $sys = (index $msgs 0).Content }}{{ end }}
{{- "«SOS»<|System|>\\nyou are a helpful assistant." }}
{{- if .Tools }}{{ "## Tools\\nYou have access to the following functions:\\n<tools>" }}{{ range .Tools }}{{ "\\n" }}{{ template "mm_function" .Function }}{{ end }}{{ "\\n</tools>" }}{{ end }}
{{- if $sys }}{{ "\\n\\n" }}{{ $sys }}{{ end }}«EOS»
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if and (eq .Role "system") $i }}«SOS»<|System|>{{ "\\n" }}{{ .Content }}«EOS»
    {{- else if eq .Role "user" }}«SOS»<|User|>{{ .Content }}«EOS»
    {{- else if eq .Role "assistant" }}«SOS»<|Bot|>{{ if .Thinking }}<think>{{ .Thinking }}</think>{{ else }}</think>{{ end }}{{ .Content }}
        {{- if .ToolCalls }}{{ range .ToolCalls }}<tool_call>{{ .Function.Name }}{{ range $k, $v := .Function.Arguments }}<arg_key>{{ $k }}</arg_key><arg_value>{{ template "mm_argval" $v }}</arg_value>{{ end }}</tool_call>{{ end }}{{ end }}
        {{- if not (and $last (not $m.ToolCalls)) }}«EOS»{{ end }}
    {{- else if eq .Role "tool" }}
        {{- if ne $prev "tool" }}«SOS»<|Tool|>{{ end }}<tool_response>{{ .Content }}</tool_response>
        {{- if ne $next "tool" }}«EOS»{{ end }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}«SOS»<|Bot|>{{ if and .IsThinkSet (not .Think) }}</think>{{ else }}<think>{{ end }}{{ end }}
""",
        SOS=sos, EOS=eos, LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="spark2.5",
    title="Spark 2.5 (<｜start▁of▁sentence｜><|System|>/<|User|>/<|Bot|>, <think>, <arg_key>/<arg_value> tool calls)",
    detect=_detect_spark,
    build=_build_spark,
    stop=("<｜end▁of▁sentence｜>",),
    thinking=True,
    reasoning_key="reasoning_content",
    markers=("<|System|>", "<|User|>", "<|Bot|>", "<|Tool|>", "<arg_key>", "<tool_call>"),
    tool_calls="none structured: Ollama's tool parser reads the <tool_call> tag, but the <arg_key>/<arg_value> pairs "
               "after it are not JSON, so it finds no arguments and returns no tool_calls (Ollama ships no PARSER "
               "for this family)",
    notes=("the Jinja prints its own <｜start▁of▁sentence｜> before every turn; the TEMPLATE does the same",),
))


# ---------------------------------------------------------------- Ling 3.0 / Bailing V3 (<role>…</role>, detailed thinking)

_LING_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\n<tools>"
)
_LING_TOOLS_TAIL_START = "\n</tools>\n\nIf none of the functions can be used, point it out."


def _detect_ling(src: str) -> bool:
    return (
        _has_all(src, "{#- Bailing V3 chat template -#}", "'<role>SYSTEM</role>'", "'<role>HUMAN</role>'",
                 "'<role>ASSISTANT</role>\\n<think></think>'", "'<role>OBSERVATION</role>'", "<|role_end|>",
                 "{% set preserved_thinking = true %}", "'detailed thinking ' + thinking_option + '<|role_end|>'",
                 "'\\n<arg_value>'")
        and _LING_TOOLS_HEAD in _jinja_strings(src) and _jinja_string_starting(src, _LING_TOOLS_TAIL_START) is not None
    )


def _build_ling(src: str, tokens: TemplateTokens) -> str:
    tail = _jinja_string_starting(src, _LING_TOOLS_TAIL_START)
    assert tail is not None
    return json_defines() + _ARGVAL_DEFINE + _fill(
        """
{{- $msgs := .Messages }}{{ $sys := false }}{{ if and $msgs (eq (index $msgs 0).Role "system") }}{{ $sys = true }}{{ end }}
{{- $opt := "on" }}{{ if and .IsThinkSet (not .Think) }}{{ $opt = "off" }}{{ end }}
{{- "<role>SYSTEM</role>" }}{{ if $sys }}{{ (index $msgs 0).Content }}{{ "\\n" }}{{ end }}
{{- if .Tools }}«HEAD»{{ range .Tools }}{{ "\\n" }}{{ template "mm_tool" . }}{{ end }}«TAIL»{{ end }}
{{- "detailed thinking " }}{{ $opt }}<|role_end|>
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}<role>HUMAN</role>{{ .Content }}<|role_end|>
    {{- else if and (eq .Role "system") $i }}<role>SYSTEM</role>{{ .Content }}<|role_end|>
    {{- else if eq .Role "assistant" }}<role>ASSISTANT</role>{{ "\\n" }}<think>{{ .Thinking }}</think>{{ .Content }}
        {{- if .ToolCalls }}{{ range $j, $c := .ToolCalls }}{{ if or $j $m.Content }}{{ "\\n" }}{{ end }}<tool_call>{{ .Function.Name }}{{ "\\n" }}
            {{- range $k, $v := .Function.Arguments }}<arg_key>{{ $k }}</arg_key>{{ "\\n" }}<arg_value>{{ template "mm_argval" $v }}</arg_value>{{ end }}
            {{- "\\n</tool_call>" }}{{ end }}{{ end }}
        {{- if not (and $last (not $m.ToolCalls)) }}<|role_end|>{{ end }}
        «THINK_TAGS»
    {{- else if eq .Role "tool" }}
        {{- if ne $prev "tool" }}<role>OBSERVATION</role>{{ end }}{{ "\\n<tool_response>\\n" }}{{ .Content }}{{ "\\n</tool_response>" }}
        {{- if ne $next "tool" }}<|role_end|>{{ end }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<role>ASSISTANT</role>{{ "\\n" }}<think>{{ if eq $opt "off" }}</think>{{ end }}{{ end }}
""",
        HEAD=golit(_LING_TOOLS_HEAD), TAIL=golit(tail), LOOP_HEAD=_LOOP_HEAD, THINK_TAGS=_THINK_TAGS,
    )


register(ChatFamily(
    name="ling3",
    title="Ling 3.0 / Bailing V3 (<role>SYSTEM|HUMAN|ASSISTANT|OBSERVATION</role>, detailed thinking on/off)",
    detect=_detect_ling,
    build=_build_ling,
    stop=("<|role_end|>", "<role>HUMAN</role>"),
    thinking=True,
    markers=("<role>SYSTEM</role>", "<role>HUMAN</role>", "<role>ASSISTANT</role>", "<|role_end|>",
             "detailed thinking ", "<arg_key>"),
    tool_calls="none structured: the calls are <tool_call> blocks of <arg_key>/<arg_value> pairs, not JSON, and "
               "Ollama ships no Ling PARSER",
    notes=(
        "the Jinja leaves out its 'detailed thinking on/off' line when the system prompt already says it; Go "
        "templates cannot search strings, so the TEMPLATE always writes the line from Ollama's think setting",
        "the Jinja strips line breaks around the reasoning and at the start of contents; Go templates cannot",
        "the Jinja counts a user message that is wholly '<tool_response>…</tool_response>' as no query, which "
        "only matters when preserved_thinking is off; it is always on in this template",
    ),
))


# ---------------------------------------------------------------- GLM-4.6 ([gMASK]<sop>, /nothink, <arg_key>/<arg_value>)

_GLM46_TOOLS_HEAD = (
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
    "with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
_GLM46_TOOLS_TAIL = (
    "</tools>\n\nFor each function call, output the function name and arguments within the following XML format:\n"
    "<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n"
    "<arg_key>{arg-key-2}</arg_key>\n<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>"
)


def _detect_glm46(src: str) -> bool:
    return _has_all(
        src, "[gMASK]<sop>", _GLM46_TOOLS_HEAD.replace("<tools>\n", "<tools>\n{% for tool in tools %}"),
        _GLM46_TOOLS_TAIL, "'/nothink' if (enable_thinking is defined and not enable_thinking",
        "{{ '\\n<think>' + reasoning_content.strip() +  '</think>'}}", "{{ '\\n' + content.strip() }}",
        "{{ '\\n<tool_call>' + tc.name }}", "<arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}",
        "<|assistant|>{{- '\\n<think></think>' if (enable_thinking is defined and not enable_thinking) else '' -}}",
    ) and _has_none(src, "clear_thinking")


_GLM_SKELETON = """
{{- $msgs := .Messages }}{{ $noThink := and .IsThinkSet (not .Think) }}
{{- "[gMASK]<sop>" }}
{{- if .Tools }}«HEAD»{{ range .Tools }}{{ template "mm_tool" . }}{{ "\\n" }}{{ end }}«TAIL»{{ end }}
{{- $lastUser := -1 }}{{ range $i, $m := $msgs }}{{ if eq .Role "user" }}{{ $lastUser = $i }}{{ end }}{{ end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}<|user|>«USER»
    {{- else if eq .Role "assistant" }}<|assistant|>
        {{- if and (gt $i $lastUser) .Thinking }}«ASSISTANT»
    {{- else if eq .Role "tool" }}
        {{- if ne $prev "tool" }}<|observation|>{{ end }}«TOOL»
    {{- else if eq .Role "system" }}<|system|>«SYSTEM»
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<|assistant|>«GENERATE»{{ end }}
"""


def _glm_template(tail: str, *, user: str, assistant: str, tool: str, system: str, generate: str) -> str:
    """A GLM-4.x TEMPLATE: [gMASK]<sop>, the tools in a system turn (the GLM-4.6 preamble's head, then `tail`), each
    message after its role token (<|user|>, <|assistant|> and, from its reasoning on, `assistant`, <|observation|> once
    a run of tool messages, <|system|>), and the generation prompt's <|assistant|> and `generate`."""
    return json_defines() + _ARGVAL_DEFINE + _fill(
        _GLM_SKELETON, HEAD=golit(_GLM46_TOOLS_HEAD), TAIL=golit(tail), LOOP_HEAD=_LOOP_HEAD, USER=user,
        ASSISTANT=assistant, TOOL=tool, SYSTEM=system, GENERATE=generate)


def _build_glm46(src: str, tokens: TemplateTokens) -> str:
    return _glm_template(
        _GLM46_TOOLS_TAIL,
        user='{{ "\\n" }}{{ .Content }}{{ if $noThink }}/nothink{{ end }}',
        assistant="""«NL»<think>{{ .Thinking }}</think>{{ else }}«NL»<think></think>{{ end }}
        {{- if .Content }}{{ "\\n" }}{{ .Content }}{{ end }}
        {{- if .ToolCalls }}{{ range .ToolCalls }}«NL»<tool_call>{{ .Function.Name }}{{ "\\n" }}
            {{- range $k, $v := .Function.Arguments }}<arg_key>{{ $k }}</arg_key>{{ "\\n" }}<arg_value>{{ template "mm_argval" $v }}</arg_value>{{ "\\n" }}{{ end }}
            {{- "</tool_call>" }}{{ end }}{{ end }}""",
        tool='{{ "\\n<tool_response>\\n" }}{{ .Content }}{{ "\\n</tool_response>" }}',
        system='{{ "\\n" }}{{ .Content }}',
        generate='{{ if $noThink }}{{ "\\n" }}<think></think>{{ end }}',
    )


register(ChatFamily(
    name="glm-4.6",
    title="GLM-4.6 ([gMASK]<sop>, <|user|>/<|assistant|>/<|observation|>, /nothink, <arg_key>/<arg_value> calls)",
    detect=_detect_glm46,
    build=_build_glm46,
    stop=("<|user|>", "<|observation|>", "<|endoftext|>"),
    thinking=True,
    content_none_ok=False,
    markers=("[gMASK]<sop>", "<|observation|>", "<arg_key>", "<arg_value>", "/nothink"),
    tool_calls="none structured: <tool_call> blocks of <arg_key>/<arg_value> pairs are not JSON; Ollama's "
               "glm-4.7 PARSER reads this format but modelmint has not checked it against GLM-4.6",
    notes=(
        "the Jinja strips whitespace around reasoning and contents; Go templates cannot",
        "the Jinja prints a None content as 'None'; with '' (what Ollama holds) both print nothing",
        "the Jinja adds '/nothink' to a user message only when it does not already end with it; Go templates "
        "cannot test a suffix, so the TEMPLATE always adds it when thinking is off",
    ),
))


# ---------------------------------------------------------------- GLM-4.7 ([gMASK]<sop>, </think> off, clear_thinking)
#
# Ollama ships RENDERER glm-4.7, but it keeps every past turn's reasoning, reopens a final assistant message and
# prints tools with Go's HTML escaping: modelmint names no RENDERER and publishes this TEMPLATE, proven on the suite.

_GLM47_TOOLS_TAIL = (
    "</tools>\n\nFor each function call, output the function name and arguments within the following XML format:\n"
    "<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>"
    "<arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>"
)


def _detect_glm47(src: str) -> bool:
    return _has_all(
        src, "[gMASK]<sop>", _GLM46_TOOLS_HEAD.replace("<tools>\n", "<tools>\n{% for tool in tools %}"),
        _GLM47_TOOLS_TAIL, "clear_thinking is defined and not clear_thinking", "{{ '</think>' }}",
        "{{ '<think>' + reasoning_content.strip() +  '</think>'}}", "{{ content.strip() }}",
        "{{- '<tool_call>' + tc.name -}}", "<arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}",
        "<|assistant|>{{- '</think>' if (enable_thinking is defined and not enable_thinking) else '<think>' -}}",
    ) and _has_none(src, "/nothink")


def _build_glm47(src: str, tokens: TemplateTokens) -> str:
    return _glm_template(
        _GLM47_TOOLS_TAIL,
        user="{{ .Content }}",
        assistant="""<think>{{ .Thinking }}</think>{{ else }}</think>{{ end }}{{ .Content }}
        {{- if .ToolCalls }}{{ range .ToolCalls }}<tool_call>{{ .Function.Name }}
            {{- range $k, $v := .Function.Arguments }}<arg_key>{{ $k }}</arg_key><arg_value>{{ template "mm_argval" $v }}</arg_value>{{ end }}
            {{- "</tool_call>" }}
        {{- end }}{{ end }}""",
        tool="<tool_response>{{ .Content }}</tool_response>",
        system="{{ .Content }}",
        generate="{{ if $noThink }}</think>{{ else }}<think>{{ end }}",
    )


register(ChatFamily(
    name="glm-4.7",
    title="GLM-4.7 ([gMASK]<sop>, <arg_key>/<arg_value> tool calls, </think> when not thinking, clear_thinking)",
    detect=_detect_glm47,
    build=_build_glm47,
    stop=("<|user|>", "<|observation|>", "<|endoftext|>"),
    thinking=True,
    content_none_ok=False,
    markers=("[gMASK]<sop>", "<|observation|>", "<arg_key>", "<arg_value>", "clear_thinking"),
    tool_calls="none structured: <tool_call> blocks of <arg_key>/<arg_value> pairs are not JSON; Ollama's "
               "glm-4.7 PARSER reads this format but modelmint has not checked it, so it names none",
    notes=(
        "Ollama's RENDERER glm-4.7 keeps every past turn's reasoning (this Jinja clears it), opens a new assistant "
        "turn after a final assistant message and prints tools with Go's HTML escaping; modelmint publishes this "
        "TEMPLATE and names no RENDERER",
        "the Jinja strips whitespace around reasoning and contents; Go templates cannot",
        "clear_thinking is not an Ollama setting: the TEMPLATE follows its default (reasoning kept only after the "
        "last user message)",
        "the Jinja prints a None content as 'None'; with '' (what Ollama holds) both print nothing",
    ),
))


# ---------------------------------------------------------------- RWKV World (System: / User: / Assistant:)


def _detect_rwkv(src: str) -> bool:
    return _has_all(
        src, "{{- 'System: ' + ns.system_prompt + '\\n\\n' -}}", "{{- 'User: ' + message['content']|trim + '\\n\\n' -}}",
        "{{- 'Assistant: ' + content|trim + '\\n\\n' -}}", "{{- 'Assistant:' -}}", "{{- ' <think>\\n</think>' }}",
        "{{- ' <think>' }}", "message['content'] is  not none",
    ) and _has_none(src, "tool")


def _build_rwkv(src: str, tokens: TemplateTokens) -> str:
    return _fill(
        """
{{- $msgs := .Messages }}{{ $sys := "" }}{{ range $msgs }}{{ if eq .Role "system" }}{{ $sys = .Content }}{{ end }}{{ end }}
{{- «BOS» }}{{ if $sys }}System: {{ $sys }}{{ "\\n\\n" }}{{ end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}User: {{ .Content }}{{ "\\n\\n" }}
    {{- else if and (eq .Role "assistant") (or .Content .Thinking (not .ToolCalls)) }}Assistant: {{ .Content }}
        {{- if not $last }}{{ "\\n\\n" }}{{ end }}
        «THINK_TAGS»
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}Assistant:{{ if .IsThinkSet }}{{ if .Think }} <think>{{ else }} <think>{{ "\\n" }}</think>{{ end }}{{ end }}{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3], LOOP_HEAD=_LOOP_HEAD, THINK_TAGS=_THINK_TAGS,
    )


register(ChatFamily(
    name="rwkv-world",
    title="RWKV World as llama.cpp writes it (System: / User: / Assistant:, optional <think>)",
    detect=_detect_rwkv,
    build=_build_rwkv,
    stop=("\n\nUser:", "\n\nSystem:"),
    bos_in_template=True,
    thinking=True,
    markers=("System: ", "User: ", "Assistant: ", "Assistant:"),
    tool_calls="none: the Jinja prints neither tools nor tool results",
    notes=(
        "the Jinja trims user and assistant contents; Go templates cannot",
        "the Jinja uses the last system message only; so does the TEMPLATE",
        "the Jinja cuts reasoning out of assistant contents; the TEMPLATE relies on Ollama passing it in .Thinking",
    ),
))


# ---------------------------------------------------------------- MiniMax-M1 (<beginning_of_sentence>role name=…)

_MINIMAX_DEFAULT = "You are a helpful assistant created by Minimax based on MiniMax-M1 model."
_MINIMAX_TOOLS_HEAD = "<beginning_of_sentence>system tool_setting=tools\nYou are provided with these tools:\n<tools>\n"
_MINIMAX_TOOLS_TAIL = (
    "</tools>\n\nIf you need to call tools, please respond with <tool_calls></tool_calls> XML tags, and provide "
    "tool-name and json-object of arguments, following the format below:\n<tool_calls>\n{\"name\": <tool-name>, "
    "\"arguments\": <args-json-object>}\n...\n</tool_calls><end_of_sentence>\n"
)


def _detect_minimax_m1(src: str) -> bool:
    strings = _jinja_strings(src)
    return (
        _has_all(src, "{{ '<begin_of_document>' -}}", "'<beginning_of_sentence>system ai_setting=assistant\\n'",
                 "'<beginning_of_sentence>user name=user\\n'", "'<beginning_of_sentence>ai name=assistant\\n'",
                 "'<beginning_of_sentence>tool name=tools\\n'", "'tool result: ' + message.content + '\\n\\n'",
                 "tool_call.function.arguments | tojson + '}\\n'")
        and all(t in strings for t in (_MINIMAX_DEFAULT, _MINIMAX_TOOLS_HEAD, _MINIMAX_TOOLS_TAIL))
    )


def _build_minimax_m1(src: str, tokens: TemplateTokens) -> str:
    return json_defines() + _fill(
        """
{{- $msgs := .Messages }}{{ $hasSys := and $msgs (eq (index $msgs 0).Role "system") }}
{{- "<begin_of_document>" }}
{{- if $hasSys }}{{ with (index $msgs 0).Content }}<beginning_of_sentence>system ai_setting=assistant{{ "\\n" }}{{ . }}<end_of_sentence>{{ "\\n" }}{{ end }}
{{- else }}<beginning_of_sentence>system ai_setting=assistant{{ "\\n" }}«DEFAULT»<end_of_sentence>{{ "\\n" }}{{ end }}
{{- if .Tools }}«HEAD»{{ range .Tools }}{{ template "mm_tool" . }}{{ "\\n" }}{{ end }}«TAIL»{{ end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}<beginning_of_sentence>user name=user{{ "\\n" }}{{ .Content }}<end_of_sentence>{{ "\\n" }}
    {{- else if eq .Role "assistant" }}<beginning_of_sentence>ai name=assistant{{ "\\n" }}
        {{- if .ToolCalls }}<tool_calls>{{ "\\n" }}
            {{- range .ToolCalls }}{"name": "{{ .Function.Name }}", "arguments": {{ template "mm_args" .Function.Arguments }}}{{ "\\n" }}{{ end }}
            {{- "</tool_calls><end_of_sentence>\\n" }}
        {{- else }}{{ .Content }}{{ if not $last }}<end_of_sentence>{{ "\\n" }}{{ end }}{{ end }}
    {{- else if eq .Role "tool" }}<beginning_of_sentence>tool name=tools{{ "\\n" }}tool result: {{ .Content }}{{ "\\n\\n" }}<end_of_sentence>{{ "\\n" }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<beginning_of_sentence>ai name=assistant{{ "\\n" }}{{ end }}
""",
        DEFAULT=golit(_MINIMAX_DEFAULT), HEAD=golit(_MINIMAX_TOOLS_HEAD), TAIL=golit(_MINIMAX_TOOLS_TAIL),
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="minimax-m1",
    title="MiniMax-M1 (<beginning_of_sentence>system/user/ai/tool name=…, <tool_calls> JSON lines)",
    detect=_detect_minimax_m1,
    build=_build_minimax_m1,
    stop=("<end_of_sentence>",),
    markers=("<begin_of_document>", "<beginning_of_sentence>", "<end_of_sentence>", "ai name=assistant",
             "<tool_calls>"),
    tool_calls="TEMPLATE: Ollama's tool parser reads the <tool_calls> tag and the JSON objects after it",
    notes=(
        "the Jinja trims the system prompt and message contents; Go templates cannot",
        "the Jinja drops system messages after the first; so does the TEMPLATE",
    ),
))
