"""Kimi K2 Instruct (0905) and Kimi K2 Thinking: tool-call ids numbered across the conversation."""

from __future__ import annotations

from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import _LOOP_HEAD, _fill, _has_all
from pipelines.chat.gojson import json_defines

_DEFAULT_SYSTEM = "You are Kimi, an AI assistant created by Moonshot AI."

# The Jinja numbers every tool call of the conversation with a counter (functions.NAME:N) and answers tool
# results from a queue of those ids. Go templates have no arithmetic, so the TEMPLATE counts in unary: $n
# grows by one character per call and `len $n` is the counter; $p does the same for the ids taken from the
# queue, and the id a result takes is found again by counting the calls of the messages before it.
_COUNTERS = '{{- $n := "" }}{{ $p := "" }}'
_CALLS = """
{{- if .ToolCalls }}<|tool_calls_section_begin|>{{ range .ToolCalls }}<|tool_call_begin|>functions.{{ .Function.Name }}:{{ len $n }}{{ $n = print $n "." }}<|tool_call_argument_begin|>{{ template "mm_args" .Function.Arguments }}<|tool_call_end|>{{ end }}<|tool_calls_section_end|>{{ end }}
"""
_RESULT = """
{{- if gt (len $n) (len $p) }}{{ $k := "" }}
    {{- range $j, $c := $msgs }}{{ if lt $j $i }}{{ range .ToolCalls }}{{ if eq (len $k) (len $p) }}## Return of functions.{{ .Function.Name }}:{{ len $k }}{{ end }}{{ $k = print $k "." }}{{ end }}{{ end }}{{ end }}
    {{- $p = print $p "." }}
{{- else }}## Return of functions.{{ if .ToolName }}{{ .ToolName }}{{ else }}unknown{{ end }}:{{ len $n }}{{ end }}«NL»{{ .Content }}
"""
_ROLE = """
{{- $name := .Role }}{{ if and (eq .Role "tool") .ToolName }}{{ $name = .ToolName }}{{ end }}
{{- if eq .Role "user" }}<|im_user|>{{ else if eq .Role "assistant" }}<|im_assistant|>{{ else }}<|im_system|>{{ end }}{{ $name }}<|im_middle|>
"""
_TOOLS = ('{{- if .Tools }}<|im_system|>tool_declare<|im_middle|>[{{ range $j, $t := .Tools }}{{ if $j }}, {{ end }}'
          '{{ template "mm_tool" . }}{{ end }}]<|im_end|>{{ end }}')


_MESSAGE_END = """
    {{- else if eq .Role "tool" }}«RESULT»
    {{- else }}{{ .Content }}
    {{- end }}
    {{- if not (and $last (eq .Role "assistant") (not $m.ToolCalls)) }}<|im_end|>{{ end }}
    {{- if and $last (ne .Role "assistant") }}<|im_assistant|>assistant<|im_middle|>{{ end }}
{{- end }}
"""


def _kimi_template(head: str) -> str:
    """A Kimi K2 TEMPLATE: `head` (up to an assistant message's branch in the message loop), then the tool results,
    the other messages, each turn's end and the generation prompt, filled with the parts both Jinjas share."""
    return json_defines() + _fill(
        head.rstrip("\n") + _MESSAGE_END, TOOLS=_TOOLS, COUNTERS=_COUNTERS, LOOP_HEAD=_LOOP_HEAD,
        SYSTEM=_DEFAULT_SYSTEM, ROLE=_ROLE.strip("\n"), CALLS=_CALLS.strip("\n"), RESULT=_RESULT.strip("\n"))


def _detect_instruct(src: str) -> bool:
    return _has_all(
        src, "{%- set tool_call_counter = namespace(value=0) -%}", "tool_response_queue.ids.pop(0)",
        "'functions.' + tool_call['function']['name'] + ':' + (tool_call_counter.value | string)",
        f"<|im_system|>system<|im_middle|>{_DEFAULT_SYSTEM}<|im_end|>", "<|im_system|>tool_declare<|im_middle|>",
        "{%- set role_name =  message.get('name') or  message['role'] -%}", "{%- if loop.first and messages[0]['role'] != 'system' -%}",
    ) and "<think>" not in src


def _build_instruct(src: str, tokens: TemplateTokens) -> str:
    return _kimi_template(
        """
«TOOLS»
{{- $msgs := .Messages }}«COUNTERS»
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if and (eq $i 0) (ne .Role "system") }}<|im_system|>system<|im_middle|>«SYSTEM»<|im_end|>«NL»{{ end }}
    «ROLE»
    {{- if and (eq .Role "assistant") .ToolCalls }}{{ .Content }}«CALLS»
""")


def _detect_thinking(src: str) -> bool:
    return _has_all(
        src, "{%- set tool_call_counter = namespace(value=0) -%}", "tool_response_queue.ids.pop(0)",
        "{%- set ns = namespace(last_non_tool_call_assistant_msg=-1) -%}", "{%- for idx in range(messages|length-1, -1, -1) -%}",
        "{%- set hist_msgs = messages[:ns.last_non_tool_call_assistant_msg+1] -%}",
        "<think></think>{{render_content(message)}}", "<think>{{rc}}</think>{{render_content(message)}}",
        f"<|im_system|>system<|im_middle|>{_DEFAULT_SYSTEM}<|im_end|>",
    )


def _build_thinking(src: str, tokens: TemplateTokens) -> str:
    # The Jinja walks the messages backwards keeping the last match, so its 'last' plain assistant message
    # is the first one: reasoning shows only after it.
    return _kimi_template(
        """
«TOOLS»
{{- $msgs := .Messages }}«COUNTERS»
{{- if or (not $msgs) (ne (index $msgs 0).Role "system") }}<|im_system|>system<|im_middle|>«SYSTEM»<|im_end|>{{ end }}
{{- $hist := -1 }}{{ range $i, $m := $msgs }}{{ if and (eq $hist -1) (eq .Role "assistant") (not .ToolCalls) }}{{ $hist = $i }}{{ end }}{{ end }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    «ROLE»
    {{- if eq .Role "assistant" }}<think>{{ if gt $i $hist }}{{ .Thinking }}{{ end }}</think>{{ .Content }}«CALLS»
""")


_PROOF_NOTE = ("the 5 conversations with tool calls, which transformers' sandbox refuses (list.append), against Jinja's "
               "mutable sandbox (test_kimi_tool_calls_match_a_mutable_sandbox)")
_TOOL_CALLS = ("TEMPLATE: Ollama's tool parser waits for <|tool_calls_section_begin|>, but the calls inside are not "
               "plain JSON and Ollama ships no Kimi PARSER, so structured tool_calls are not guaranteed")
_NOTES = (
    "the Jinja numbers tool calls across the conversation with arithmetic (tool_call_counter.value + 1); the "
    "TEMPLATE counts in unary (a string one character longer per call, printed with len)",
    "a tool result takes the next call id in order, as the Jinja's queue gives it; Ollama's tool_call_id is not read",
    "the Jinja's image content parts (<|media_start|>) have no counterpart in the TEMPLATE",
    "transformers' immutable sandbox refuses the Jinja's tool_response_queue.ids.append, so under transformers "
    "the Jinja fails on every conversation with a tool call; Jinja's mutable sandbox (and llama.cpp) render them, "
    "and the TEMPLATE is compared with that rendering",
)

register(ChatFamily(
    name="kimi-k2-instruct",
    title="Kimi K2 Instruct 0905 (<|im_system|>/<|im_user|>/<|im_assistant|>, functions.NAME:N ids across the "
          "conversation)",
    detect=_detect_instruct,
    build=_build_instruct,
    stop=("<|im_end|>",),
    markers=("<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|tool_calls_section_begin|>", "tool_call_counter",
             "tool_response_queue"),
    tool_calls=_TOOL_CALLS,
    notes=_NOTES,
    proof_note=_PROOF_NOTE,
))

register(ChatFamily(
    name="kimi-k2-thinking",
    title="Kimi K2 Thinking (Kimi K2 turns, <think> reasoning kept after the first plain assistant reply)",
    detect=_detect_thinking,
    build=_build_thinking,
    stop=("<|im_end|>",),
    thinking=True,
    reasoning_key="reasoning_content",
    markers=("<|im_system|>", "<|im_assistant|>", "<think>", "tool_call_counter", "last_non_tool_call_assistant_msg"),
    tool_calls=_TOOL_CALLS,
    notes=_NOTES,
    proof_note=_PROOF_NOTE,
))
