"""ServiceNow Apriel 1.5 (Unsloth's fixed template: <|system|>/<|user|>/<|assistant|> … <|end|>, tools as Python str())
and Apriel 1.6 Thinker (<|begin_system|>/<|begin_user|>/<|begin_assistant|>, tools as Python reprs)."""

from __future__ import annotations

from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import _LOOP_HEAD, _fill, _has_all, _render_marked, golit
from pipelines.chat.families.tagged import _PYVAL_DEFINE
from pipelines.chat.gojson import json_defines

_REASONING = (
    "You are a thoughtful and systematic AI assistant built by ServiceNow Language Models (SLAM) lab. Before providing "
    "an answer, analyze the problem carefully and present your reasoning step by step. After explaining your thought "
    "process, provide the final solution in the following format: [BEGIN FINAL RESPONSE] ... [END FINAL RESPONSE]."
)
_TOOLS = (
    "You are provided with function signatures within <available_tools></available_tools> XML tags. You may call one "
    "or more functions to assist with the user query. Don't make assumptions about the arguments. You should infer "
    "the argument values from previous user responses and the system message. Here are the available tools:\n"
    "<available_tools>\n"
)
_OUTPUT = (
    "Return all function calls as a list of json objects within <tool_call></tool_call> XML tags. Each json object "
    'should contain a function name and arguments as follows:\n<tool_calls>[{"name": <function-name-1>, "arguments": '
    '<args-dict-1>}, {"name": <function-name-2>, "arguments": <args-dict-2>},...]</tool_calls>'
)

# `tool|string`: Python's str() of the tool dict, in the key order Ollama's API holds a tool in.
_PYTOOL_DEFINE = (
    '{{- define "mm_pyprop" }}{{ "{" }}{{ $sep := "" }}'
    "{{- if .AnyOf }}{{ $sep }}'anyOf': [{{ range $i, $a := .AnyOf }}{{ if $i }}, {{ end }}{{ template \"mm_pyprop\" $a }}"
    "{{ end }}]{{ $sep = \", \" }}{{ end }}"
    "{{- if .Type }}{{ $sep }}'type': {{ if eq (len .Type) 1 }}'{{ index .Type 0 }}'{{ else }}[{{ range $i, $t := .Type }}"
    "{{ if $i }}, {{ end }}'{{ $t }}'{{ end }}]{{ end }}{{ $sep = \", \" }}{{ end }}"
    "{{- if .Items }}{{ $sep }}'items': {{ template \"mm_pyrepr\" .Items }}{{ $sep = \", \" }}{{ end }}"
    "{{- if .Enum }}{{ $sep }}'enum': [{{ range $i, $e := .Enum }}{{ if $i }}, {{ end }}{{ template \"mm_pyrepr\" $e }}"
    "{{ end }}]{{ $sep = \", \" }}{{ end }}"
    "{{- if .Description }}{{ $sep }}'description': '{{ .Description }}'{{ end }}{{ \"}\" }}{{ end }}\n"
    '{{- define "mm_pytool" }}{{ "{" }}\'type\': \'{{ .Type }}\', \'function\': {{ "{" }}{{ with .Function }}'
    "'name': '{{ .Name }}'{{ if .Description }}, 'description': '{{ .Description }}'{{ end }}, 'parameters': "
    "{{ \"{\" }}{{ with .Parameters }}'type': '{{ .Type }}', 'properties': {{ \"{\" }}{{ $first := true }}"
    "{{ range $k, $v := .Properties }}{{ if not $first }}, {{ end }}{{ $first = false }}'{{ $k }}': "
    "{{ template \"mm_pyprop\" $v }}{{ end }}{{ \"}\" }}{{ if .Required }}, 'required': [{{ range $i, $r := .Required }}"
    "{{ if $i }}, {{ end }}'{{ $r }}'{{ end }}]{{ end }}{{ end }}{{ \"}}}\" }}{{ end }}{{ end }}\n"
)


def _detect(src: str) -> bool:
    return _has_all(
        src, "{# Unsloth template fixes #}", "{{ tool|string }}", "{%- set reasoning_prompt='You are a thoughtful and "
        "systematic AI assistant built by ServiceNow Language Models (SLAM) lab.", "{%- set add_tool_id = true -%}",
        "{{- '\\n<|end|>\\n' + eos_token -}}", "{{- '<|tool_result|>\\n' + tool_message|string + '\\n<|end|>\\n' -}}",
        "{%- if messages|selectattr('role', 'equalto', 'system')|list|length == 0 -%}",
    ) and "reasoning_content" not in src


def _build(src: str, tokens: TemplateTokens) -> str:
    return json_defines() + _PYVAL_DEFINE + _PYTOOL_DEFINE + _fill(
        """
{{- $msgs := .Messages }}{{ $hasSys := false }}{{ range $msgs }}{{ if eq .Role "system" }}{{ $hasSys = true }}{{ end }}{{ end }}
{{- $tools := .Tools }}
{{- «BOS» }}
{{- if and .Tools (not (and $msgs (eq (index $msgs 0).Role "system"))) }}<|system|>{{ "\\n" }}«REASONING»«TOOLS»{{ range .Tools }}{{ template "mm_pytool" . }}{{ "\\n" }}{{ end }}</available_tools>{{ "\\n" }}«OUTPUT»{{ "\\n<|end|>\\n" }}{{ end }}
{{- if not $hasSys }}<|system|>{{ "\\n" }}«REASONING»{{ "\\n<|end|>\\n" }}{{ end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}<|user|>{{ "\\n" }}{{ .Content }}{{ "\\n<|end|>\\n" }}
    {{- else if eq .Role "system" }}<|system|>{{ "\\n" }}«REASONING»{{ .Content }}{{ "\\n" }}
        {{- if $tools }}«TOOLS»{{ range $tools }}{{ template "mm_pytool" . }}{{ "\\n" }}{{ end }}</available_tools>{{ "\\n" }}{{ end }}<|end|>{{ "\\n" }}
    {{- else if eq .Role "assistant" }}<|assistant|>{{ "\\n" }}{{ .Content }}
        {{- if .ToolCalls }}{{ "\\n<tool_calls>[" }}{{ range $j, $c := .ToolCalls }}{{ if $j }}, {{ end }}{"name": "{{ .Function.Name }}", "arguments": {{ template "mm_args" .Function.Arguments }}
            {{- if not $last }}, "id": "{{ .ID }}"{{ end }}{{ "}" }}{{ end }}]</tool_calls>{{ end }}
        {{- if not (and $last (not $m.ToolCalls)) }}{{ "\\n<|end|>\\n" }}{{ «EOS» }}{{ end }}
    {{- else if eq .Role "tool" }}<|tool_result|>{{ "\\n" }}{{ .Content }}{{ "\\n<|end|>\\n" }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<|assistant|>{{ "\\n" }}{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3], EOS=golit(tokens.eos or "")[3:-3], REASONING=golit(_REASONING),
        TOOLS=golit(_TOOLS), OUTPUT=golit(_OUTPUT), LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="apriel-1.5",
    title="ServiceNow Apriel 1.5 (Unsloth's fixed template: <|system|>/<|user|>/<|assistant|> … <|end|>, "
          "<tool_calls>[…] JSON calls)",
    detect=_detect,
    build=_build,
    stop=("<|end|>",),
    bos_in_template=True,
    markers=("<|system|>", "<|user|>", "<|assistant|>", "<|tool_result|>", "ServiceNow Language Models",
             "Unsloth template fixes"),
    tool_calls="none structured: Ollama's tool parser would need <tool_calls>[ and the calls carry their id; Ollama "
               "ships no Apriel PARSER",
    notes=(
        "the Jinja lists tools with Python's str() of each tool; the TEMPLATE prints the same, in the key order "
        "Ollama's API holds a tool in, with strings in single quotes unescaped (a quote or backslash inside a "
        "description prints differently)",
        "add_thoughts and tool_output_format are not Ollama settings: the TEMPLATE follows their defaults",
        "the Jinja's 'content' role and image chunks have no counterpart in Ollama's messages",
    ),
))


# ---------------------------------------------------------------- Apriel 1.6 Thinker (tools as Python reprs)

# Python's repr() of what Ollama holds for a tool, in its struct order: str() of each tool is what the Jinja prints.
# Strings print between single quotes as they are (repr escapes quotes, backslashes and control characters: a
# TEMPLATE cannot).
_PYREPR_DEFINE = (
    '{{- define "mm_pyrepr" }}{{ $t := printf "%T" . }}{{ if eq $t "string" }}\'{{ . }}\''
    '{{ else if eq $t "bool" }}{{ if . }}True{{ else }}False{{ end }}{{ else if eq $t "<nil>" }}None'
    '{{ else if eq $t "map[string]interface {}" }}{{ "{" }}{{ $first := true }}{{ range $k, $v := . }}'
    '{{ if not $first }}, {{ end }}{{ $first = false }}\'{{ $k }}\': {{ template "mm_pyrepr" $v }}{{ end }}{{ "}" }}'
    '{{ else if eq $t "[]interface {}" }}[{{ range $i, $v := . }}{{ if $i }}, {{ end }}{{ template "mm_pyrepr" $v }}'
    '{{ end }}]{{ else }}{{ json . }}{{ end }}{{ end }}\n'
    '{{- define "mm_pyprop" }}{{ "{" }}{{ $sep := "" }}'
    '{{- if .Type }}{{ $sep }}\'type\': {{ if eq (len .Type) 1 }}\'{{ index .Type 0 }}\'{{ else }}['
    '{{ range $i, $t := .Type }}{{ if $i }}, {{ end }}\'{{ $t }}\'{{ end }}]{{ end }}{{ $sep = ", " }}{{ end }}'
    '{{- if .Items }}{{ $sep }}\'items\': {{ template "mm_pyrepr" .Items }}{{ $sep = ", " }}{{ end }}'
    '{{- if .Enum }}{{ $sep }}\'enum\': [{{ range $i, $e := .Enum }}{{ if $i }}, {{ end }}{{ template "mm_pyrepr" $e }}'
    '{{ end }}]{{ $sep = ", " }}{{ end }}'
    '{{- if .Description }}{{ $sep }}\'description\': \'{{ .Description }}\'{{ end }}{{ "}" }}{{ end }}\n'
    '{{- define "mm_pytool" }}{{ "{" }}\'type\': \'{{ .Type }}\', \'function\': {{ "{" }}{{ with .Function }}'
    '\'name\': \'{{ .Name }}\'{{ if .Description }}, \'description\': \'{{ .Description }}\'{{ end }}, \'parameters\': '
    '{{ "{" }}\'type\': \'{{ .Parameters.Type }}\', \'properties\': {{ "{" }}{{ $first := true }}'
    '{{ range $k, $v := .Parameters.Properties }}{{ if not $first }}, {{ end }}{{ $first = false }}\'{{ $k }}\': '
    '{{ template "mm_pyprop" $v }}{{ end }}{{ "}" }}{{ if .Parameters.Required }}, \'required\': ['
    '{{ range $i, $r := .Parameters.Required }}{{ if $i }}, {{ end }}\'{{ $r }}\'{{ end }}]{{ end }}{{ "}" }}'
    '{{ end }}{{ "}}" }}{{ end }}\n'
)
_APRIEL16_MARK = "\x00mmS\x00"


def _detect_apriel16(src: str) -> bool:
    return _has_all(
        src, "<|begin_system|>", "<|begin_user|>", "<|begin_assistant|>", "<|begin_tool_result|>", "<|end|>",
        "ServiceNow Language Models (SLAM) lab", "[BEGIN FINAL RESPONSE]", "{{ tool|string }}",
        "reasoning_asst_turn_start = 'Here are my reasoning steps:\\n'", "add_tool_id == true and 'id' in tool_call",
    )


def _apriel16_parts(src: str) -> tuple[str, str, str]:
    """(the system block before the system text, the tool block before the tools, the tool block after them),
    cut out of the Jinja rendered with marker values."""
    tool = {"type": "function", "function": {"name": "n", "description": "d",
                                             "parameters": {"type": "object", "properties": {}}}}
    user = {"role": "user", "content": "u"}
    with_sys = _render_marked(src, [{"role": "system", "content": _APRIEL16_MARK}, user], tools=[tool], bos_token="")
    head = with_sys[:with_sys.index(_APRIEL16_MARK)]
    tool_text = str(tool)
    at = with_sys.index(tool_text)
    before = with_sys[with_sys.index(_APRIEL16_MARK) + len(_APRIEL16_MARK) + 1:at]
    after = with_sys[at + len(tool_text):with_sys.index("<|begin_user|>")]
    return head, before, after[:-1]


# The generation prompt ends with the opening thinking tag the TEMPLATE declares ("Here are my reasoning steps:"), so
# Ollama starts a thinking request in the reasoning (server/routes.go:2720-2730) and ends it at [BEGIN FINAL RESPONSE].
def _build_apriel16(src: str, tokens: TemplateTokens) -> str:
    head, before_tools, after_tools = _apriel16_parts(src)
    return json_defines() + _PYREPR_DEFINE + _fill(
        """
{{- $msgs := .Messages }}{{ $hasSys := and $msgs (eq (index $msgs 0).Role "system") }}
{{- «BOS» }}
{{- if not $hasSys }}{{ «HEAD» }}{{ if .Tools }}{{ «BEFORE» }}{{ range .Tools }}{{ template "mm_pytool" . }}{{ end }}{{ «AFTER» }}«NL»{{ end }}{{ end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}<|begin_user|>«NL»{{ .Content }}
    {{- else if eq .Role "system" }}{{ if $i }}«BOS_MID»{{ end }}{{ «HEAD» }}{{ .Content }}{{ "\\n" }}
        {{- if $.Tools }}{{ «BEFORE» }}{{ range $.Tools }}{{ template "mm_pytool" . }}{{ end }}{{ «AFTER» }}«NL»{{ end }}
    {{- else if eq .Role "assistant" }}«NL»<|begin_assistant|>{{ "\\n" }}
        {{- if and $last .Thinking }}{{ .Thinking }}«NL»[BEGIN FINAL RESPONSE]«NL»{{ end }}{{ .Content }}
        {{- if .ToolCalls }}«NL»<tool_calls>[{{ range $j, $c := .ToolCalls }}{{ if $j }}, {{ end }}{"name": "{{ .Function.Name }}", "arguments": {{ template "mm_args" .Function.Arguments }}
            {{- if and (not $last) .ID }}, "id": "{{ .ID }}"{{ end }}}{{ end }}]</tool_calls>
        {{- end }}
        {{- if not $last }}«NL»<|end|>«NL»{{ end }}
    {{- else if eq .Role "tool" }}<|begin_tool_result|>«NL»{{ .Content }}{{ "\\n\\n\\n" }}
    {{- end }}
    {{- /* Never renders: the last .Thinking of the loop, between the texts Ollama takes as thinking tags. */}}
    {{- if false }}Here are my reasoning steps:{{ .Thinking }}[BEGIN FINAL RESPONSE]{{ end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}«NL»<|begin_assistant|>«NL»Here are my reasoning steps:«NL»{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        BOS_MID=golit(tokens.bos or ""),
        HEAD=golit(head)[3:-3],
        BEFORE=golit(before_tools)[3:-3],
        AFTER=golit(after_tools)[3:-3],
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="apriel-1.6",
    title="ServiceNow Apriel 1.6 Thinker (<|begin_system|>/<|begin_user|>/<|begin_assistant|>, tools as Python reprs)",
    detect=_detect_apriel16,
    build=_build_apriel16,
    stop=("<|end|>", "<|begin_user|>"),
    bos_in_template=True,
    thinking=True,
    reasoning_key="reasoning_content",
    markers=("<|begin_system|>", "<|begin_user|>", "<|begin_assistant|>", "<|begin_tool_result|>",
             "[BEGIN FINAL RESPONSE]"),
    tool_calls=("TEMPLATE: Ollama's tool parser waits for <tool_calls>[ (the tag the TEMPLATE gives), then reads each "
                "call's name and JSON arguments; checked on the model's own output for the suite's tool-call "
                "conversations"),
    notes=(
        "the Jinja prints each tool as Python's str() of its dict; the TEMPLATE prints what Ollama holds in its "
        "struct order, strings between single quotes as they are (repr would escape quotes and backslashes)",
        "the Jinja keeps only the text after '[BEGIN FINAL RESPONSE]' of an earlier assistant turn and trims it; Go "
        "templates cannot split strings: the TEMPLATE relies on Ollama passing reasoning in .Thinking",
        "the Jinja prints the reasoning of the last assistant message only; so does the TEMPLATE",
    ),
))
