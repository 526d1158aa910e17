"""ChatML families: ChatML and Qwen2.5 (Qwen tool calling), Qwen3 and QwQ (<think>), Hermes 2 Pro / Hermes 3
tool use, SmolLM3 (/think and /no_think).
"""

from __future__ import annotations

import re

from pipelines.chat.families.blocks import chatml_query_loop, chatml_tool_turn
from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import _LOOP_HEAD, _fill, _has_all, _has_none, _jinja_strings, golit
from pipelines.chat.gojson import json_defines

# ---------------------------------------------------------------- ChatML with Qwen2.5's tool calling

_QWEN_TOOLS_HEAD = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_QWEN_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call><|im_end|>\n"
)
# Qwen2.5's and Qwen3's tool messages: one user turn holds a run of them, each in <tool_response> tags.
_TOOL_TURN = chatml_tool_turn('{{- if ne $prev "tool" }}<|im_start|>user{{ end }}',
                              '{{- "\\n<tool_response>\\n" }}{{ .Content }}{{ "\\n</tool_response>" }}')
_QWEN_SYSTEM = re.compile(r"^<\|im_start\|>system\n(.+)<\|im_end\|>\n$", re.S)


def _qwen_default_system(src: str) -> str | None:
    for s in _jinja_strings(src):
        m = _QWEN_SYSTEM.match(s)
        if m and m.group(1) in _jinja_strings(src):
            return m.group(1)
    return None


def _squash(src: str) -> str:
    """The Jinja source without whitespace outside string literals and without trim markers."""
    out, quote, i = [], "", 0
    while i < len(src):
        ch = src[i]
        if quote:
            out.append(ch)
            if ch == "\\" and i + 1 < len(src):
                out.append(src[i + 1])
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
            out.append(ch)
        elif not ch.isspace():
            out.append(ch)
        i += 1
    text = "".join(out)
    for a, b in (("{%-", "{%"), ("-%}", "%}"), ("{{-", "{{"), ("-}}", "}}")):
        text = text.replace(a, b)
    return text


# Plain ChatML as Qwen2 (and many fine-tunes) write it: one loop, an optional default system prompt.
_PLAIN_CHATML = re.compile(
    r"^\{%formessageinmessages%\}"
    r"(?P<default>\{%ifloop\.firstandmessages\[0\]\['role'\]!='system'%\}"
    r"\{\{'<\|im_start\|>system(?:\\n|\n)[^'\\]+<\|im_end\|>(?:\\n|\n)'\}\}\{%endif%\})?"
    r"\{\{'<\|im_start\|>'\+message\['role'\]\+'(?:\\n|\n)'\+message\['content'\]\+'<\|im_end\|>'\+'(?:\\n|\n)'\}\}"
    r"\{%endfor%\}\{%ifadd_generation_prompt%\}\{\{'<\|im_start\|>assistant(?:\\n|\n)'\}\}\{%endif%\}$"
)


def _plain_chatml(src: str) -> re.Match[str] | None:
    return _PLAIN_CHATML.match(_squash(src))


def _detect_chatml(src: str) -> bool:
    return _detect_qwen25(src) or _plain_chatml(src) is not None


def _detect_qwen25(src: str) -> bool:
    strings = _jinja_strings(src)
    return (
        _has_all(src, "<|im_start|>", "<|im_end|>", "<tool_call>", "<tool_response>", "tool_call.arguments | tojson")
        and _QWEN_TOOLS_HEAD in strings
        and _QWEN_TOOLS_TAIL in strings
        and _qwen_default_system(src) is not None
        and _has_none(src, "<think>", "reasoning_content", "enable_thinking", "tool_call.arguments is string")
    )


def _build_chatml(src: str, tokens: TemplateTokens) -> str:
    plain = _plain_chatml(src)
    default = _qwen_default_system(src)
    if plain is not None or default is None:
        # plain ChatML; also what `--family chatml --force` gets for another family's template: ChatML as is
        return _build_plain_chatml(src, with_default=plain is not None and bool(plain.group("default")))
    return json_defines() + _fill(
        """
{{- $msgs := .Messages }}{{ $first := "" }}{{ if $msgs }}{{ $first = (index $msgs 0).Role }}{{ end }}
{{- if .Tools }}<|im_start|>system{{ "\\n" }}
    {{- if eq $first "system" }}{{ (index $msgs 0).Content }}{{ else }}«DEFAULT»{{ end }}
    {{- «TOOLS_HEAD» }}
    {{- range .Tools }}{{ "\\n" }}{{ template "mm_tool" . }}{{ end }}
    {{- «TOOLS_TAIL» }}
{{- else if eq $first "system" }}<|im_start|>system{{ "\\n" }}{{ (index $msgs 0).Content }}<|im_end|>{{ "\\n" }}
{{- else }}<|im_start|>system{{ "\\n" }}«DEFAULT»<|im_end|>{{ "\\n" }}
{{- end }}
{{- $prev := "" }}
{{- range $i, $m := $msgs }}
    «LOOP_HEAD»
    {{- if or (eq .Role "user") (and (eq .Role "system") $i) (and (eq .Role "assistant") (not .ToolCalls)) }}
        {{- "<|im_start|>" }}{{ .Role }}{{ "\\n" }}{{ .Content }}
        {{- if not (and $last (eq .Role "assistant")) }}<|im_end|>{{ "\\n" }}{{ end }}
    {{- else if eq .Role "assistant" }}<|im_start|>assistant
        {{- if .Content }}{{ "\\n" }}{{ .Content }}{{ end }}
        {{- if .ToolCalls }}{{ range .ToolCalls }}«NL»<tool_call>«NL»{"name": "{{ .Function.Name }}", "arguments": {{ template "mm_args" .Function.Arguments }}}«NL»</tool_call>{{ end }}{{ end }}<|im_end|>{{ "\\n" }}
«TOOL_TURN»
{{- if ne $prev "assistant" }}<|im_start|>assistant{{ "\\n" }}{{ end }}
""",
        DEFAULT=golit(default),
        TOOLS_HEAD=golit(_QWEN_TOOLS_HEAD)[3:-3],
        TOOLS_TAIL=golit(_QWEN_TOOLS_TAIL)[3:-3],
        LOOP_HEAD=_LOOP_HEAD,
        TOOL_TURN=_TOOL_TURN,
    )


def _build_plain_chatml(src: str, *, with_default: bool) -> str:
    default = ""
    if with_default:
        found = next(m.group(1) for m in map(_QWEN_SYSTEM.match, _jinja_strings(src)) if m)
        default = f'{{{{- if and (eq $i 0) (ne .Role "system") }}}}<|im_start|>system{{{{ "\\n" }}}}' \
                  f'{golit(found)}<|im_end|>{{{{ "\\n" }}}}{{{{ end }}}}'
    return _fill(
        """
{{- $msgs := .Messages }}{{ $prev := "" }}
{{- range $i, $m := $msgs }}
    «LOOP_HEAD»
    «DEFAULT»
    {{- "<|im_start|>" }}{{ .Role }}{{ "\\n" }}{{ .Content }}
    {{- if not (and $last (eq .Role "assistant")) }}<|im_end|>{{ "\\n" }}{{ end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<|im_start|>assistant{{ "\\n" }}{{ end }}
""",
        LOOP_HEAD=_LOOP_HEAD,
        DEFAULT=default or '{{- "" }}',
    )


register(ChatFamily(
    name="chatml",
    title="ChatML: plain (Qwen2) or as Qwen2.5 writes it (default system prompt, <tools>, <tool_call>)",
    detect=_detect_chatml,
    build=_build_chatml,
    stop=("<|im_end|>", "<|im_start|>"),
    markers=("<|im_start|>", "<|im_end|>", "<tool_call>", "<tool_response>"),
    tool_calls="TEMPLATE: Ollama's tool parser reads the <tool_call> tag from the TEMPLATE (Qwen2.5); plain ChatML has none",
))


# ---------------------------------------------------------------- Qwen3 and QwQ (ChatML, <think>, Qwen tool calls)

_QWEN3_TOOLS_HEAD = _QWEN_TOOLS_HEAD[2:]  # Qwen3 writes "\n\n" after the system text only when there is one
_QWEN3_NO_THINK = "{%- if enable_thinking is defined and enable_thinking is false %}"


def _detect_qwen3(src: str) -> bool:
    strings = _jinja_strings(src)
    return (
        _has_all(src, "<|im_start|>", "<|im_end|>", "multi_step_tool=true, last_query_index=messages|length - 1",
                 "message.content.startswith('<tool_response>')", "message.reasoning_content is defined",
                 "'\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n')",
                 _QWEN3_NO_THINK, "tool_call.arguments | tojson")
        and _QWEN3_TOOLS_HEAD in strings and _QWEN_TOOLS_TAIL in strings
        and _has_none(src, "<|vision_start|>", "<function=", "render_content", "default_system", "xml_tools")
    )


def _detect_qwq(src: str) -> bool:
    strings = _jinja_strings(src)
    return (
        _has_all(src, "<|im_start|>", "<|im_end|>", "{{- '<|im_start|>assistant\\n<think>\\n' }}",
                 "{%- if not enable_thinking -%}{{- '</think>' -}}{%- endif -%}",
                 "{%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}",
                 "tool_call.arguments | tojson")
        and _QWEN_TOOLS_HEAD in strings and _QWEN_TOOLS_TAIL in strings
        and _has_none(src, "multi_step_tool", "reasoning_content", "<function=", "default_system", "xml_tools")
    )


_QWEN3_BODY = """
{{- $msgs := .Messages }}{{ $first := "" }}{{ if $msgs }}{{ $first = (index $msgs 0).Role }}{{ end }}
{{- if .Tools }}<|im_start|>system{{ "\\n" }}
    {{- if eq $first "system" }}{{ (index $msgs 0).Content }}«SYS_SEP»{{ end }}
    {{- «TOOLS_HEAD» }}
    {{- range .Tools }}{{ "\\n" }}{{ template "mm_tool" . }}{{ end }}
    {{- «TOOLS_TAIL» }}
«QUERY_LOOP»
    {{- if or (eq .Role "user") (and (eq .Role "system") $i) }}
        {{- "<|im_start|>" }}{{ .Role }}{{ "\\n" }}{{ .Content }}<|im_end|>{{ "\\n" }}
    {{- else if eq .Role "assistant" }}<|im_start|>assistant
        «ASSISTANT»
        {{- if not (and $last (not .ToolCalls)) }}<|im_end|>{{ "\\n" }}{{ end }}
«TOOL_TURN»
{{- if ne $prev "assistant" }}<|im_start|>assistant{{ "\\n" }}«GEN»{{ end }}
"""

# Qwen3: the reasoning of turns after the last user query is kept inside <think>; earlier turns lose it.
_QWEN3_ASSISTANT = """
        {{- if and (gt $i $lastQuery) (or $last .Thinking) }}{{ "\\n<think>\\n" }}{{ .Thinking }}{{ "\\n</think>\\n\\n" }}{{ .Content }}
        {{- else }}{{ "\\n" }}{{ .Content }}{{ end }}
        {{- if and $m.Content $m.ToolCalls }}{{ "\\n" }}{{ end }}
        «CALLS»
        «THINK_TAGS»"""

# QwQ: reasoning never comes back; a message with tool calls prints its content only when the Jinja sees some
# (reasoning reaches the Jinja inside the content, so .Thinking counts).
_QWQ_ASSISTANT = """
        {{- if or .Content .Thinking (not $m.ToolCalls) }}{{ "\\n" }}{{ .Content }}{{ end }}
        {{- if .ToolCalls }}{{ range .ToolCalls }}«NL»<tool_call>«NL»{"name": "{{ .Function.Name }}", "arguments": {{ template "mm_args" .Function.Arguments }}}«NL»</tool_call>{{ end }}{{ end }}
        «THINK_TAGS»"""

# Ollama reads its tool-call tag from the first text inside the first `if` on .ToolCalls, so the tag opens it.
_QWEN3_CALLS = (
    '{{- if .ToolCalls }}{{ range $j, $c := .ToolCalls }}<tool_call>«NL»{"name": "{{ .Function.Name }}", '
    '"arguments": {{ template "mm_args" .Function.Arguments }}}«NL»</tool_call>'
    '{{ if gt (len (slice $m.ToolCalls $j)) 1 }}«NL»{{ end }}{{ end }}{{ end }}'
)
# Never renders: declares <think>…</think> around .Thinking, which Ollama reads as the thinking tags.
_THINK_TAGS = "{{- if false }}<think>{{ .Thinking }}</think>{{ end }}"


def _build_qwen3(src: str, tokens: TemplateTokens) -> str:
    qwq = _detect_qwq(src)
    return json_defines() + _fill(
        _QWEN3_BODY,
        SYS_SEP="" if qwq else '{{ "\\n\\n" }}',
        TOOLS_HEAD=golit(_QWEN_TOOLS_HEAD if qwq else _QWEN3_TOOLS_HEAD)[3:-3],
        TOOLS_TAIL=golit(_QWEN_TOOLS_TAIL)[3:-3],
        QUERY_LOOP=chatml_query_loop('eq $first "system"'),
        TOOL_TURN=_TOOL_TURN,
        ASSISTANT=(_QWQ_ASSISTANT if qwq else _QWEN3_ASSISTANT).strip("\n"),
        CALLS=_QWEN3_CALLS,
        THINK_TAGS=_THINK_TAGS,
        GEN=('<think>{{ "\\n" }}{{ if not .Think }}</think>{{ end }}' if qwq
             else '{{ if and .IsThinkSet (not .Think) }}<think>{{ "\\n\\n" }}</think>{{ "\\n\\n" }}{{ end }}'),
    )


register(ChatFamily(
    name="qwen3",
    title="Qwen3 (hybrid thinking, enable_thinking) and QwQ (always thinks): ChatML with <think> and <tool_call>",
    detect=lambda src: _detect_qwen3(src) or _detect_qwq(src),
    build=_build_qwen3,
    stop=("<|im_end|>", "<|im_start|>"),
    thinking=True,
    content_none_ok=False,
    markers=("<|im_start|>", "<|im_end|>", "<tool_call>", "<tool_response>", "<think>", "</think>",
             "enable_thinking"),
    tool_calls="TEMPLATE: Ollama's tool parser reads the <tool_call> tag from the TEMPLATE; its thinking parser "
               "the <think> tags",
    notes=(
        "the Jinja cuts '<think>…</think>' out of assistant contents; Go templates cannot split strings, so the "
        "TEMPLATE relies on Ollama passing reasoning in .Thinking (its thinking parser does), never inside .Content",
        "Qwen3's Jinja strips line breaks around the kept reasoning (strip('\\n')); the TEMPLATE prints .Thinking "
        "as Ollama stores it",
        "Qwen3's Jinja does not count a user message that is wholly a '<tool_response>…</tool_response>' as a "
        "query; Go templates cannot test a suffix, so the TEMPLATE counts every user message",
        "the Jinja concatenates message contents, so a tool-call message needs content '' rather than None "
        "(Ollama's contents are always strings)",
    ),
))


# ---------------------------------------------------------------- Hermes 2 Pro / Hermes 3 tool use (ChatML + Python signatures)

_HERMES_INTRO = (
    "You are a function calling AI model. You are provided with function signatures within <tools></tools> XML "
    "tags. You may call one or more functions to assist with the user query. Don't make assumptions about what "
    "values to plug into functions. Here are the available tools: <tools> "
)
_HERMES_TAIL = (
    " </tools>",
    'Use the following pydantic model json schema for each tool call you will make: {"properties": {"name": '
    '{"title": "Name", "type": "string"}, "arguments": {"title": "Arguments", "type": "object"}}, "required": '
    '["name", "arguments"], "title": "FunctionCall", "type": "object"}}\n',
    "For each function call return a json object with function name and arguments within <tool_call></tool_call> "
    "XML tags as follows:\n",
    "<tool_call>\n",
    '{"name": <function-name>, "arguments": <args-dict>}\n',
    "</tool_call><|im_end|>\n",
)
# json_to_python_type of the Jinja: its array branch passes `json_spec|items` (the schema's key/value pairs, not
# its items), whose type is undefined and so iterable and empty: every array prints as list[Union[]]. (The
# same reasoning makes an unknown type name print one Any per character; the TEMPLATE prints Any.)
_HERMES_PYTYPE = (
    '{{- define "mm_pytype" }}{{ if eq (len .Type) 1 }}{{ template "mm_pytype1" index .Type 0 }}{{ else if .Type }}'
    'Union[{{ range $i, $t := .Type }}{{ if $i }},{{ end }}{{ template "mm_pytype1" $t }}{{ end }}]'
    '{{ else }}Any{{ end }}{{ end }}\n'
    '{{- define "mm_pytype1" }}{{ if eq . "string" }}str{{ else if eq . "number" }}float{{ else if eq . "integer" }}'
    'int{{ else if eq . "boolean" }}bool{{ else if eq . "array" }}list[Union[]]{{ else if eq . "object" }}dict'
    '{{ else }}Any{{ end }}{{ end }}\n'
)


def _detect_hermes(src: str) -> bool:
    strings = _jinja_strings(src)
    return (
        _has_all(src, "<|im_start|>", "macro json_to_python_type(json_spec)", "loop.previtem.role != \"tool\"",
                 "message.tool_calls is not defined", "tool_call.arguments|tojson", "param_fields.description|trim")
        and _HERMES_INTRO in strings and all(t in strings for t in _HERMES_TAIL)
    )


def _build_hermes(src: str, tokens: TemplateTokens) -> str:
    return json_defines() + _HERMES_PYTYPE + _fill(
        """
{{- $msgs := .Messages }}{{ «BOS» }}<|im_start|>system{{ "\\n" }}«INTRO»
{{- range $ti, $t := .Tools }}{{ if $ti }}{{ "\\n" }}{{ end }}
    {{- with .Function }}{"type": "function", "function": {"name": "{{ .Name }}", "description": "{{ .Name }}(
        {{- $first := true }}{{ range $k, $v := .Parameters.Properties }}{{ if not $first }}, {{ end }}{{ $first = false }}{{ $k }}: {{ template "mm_pytype" $v }}{{ end }}) - {{ .Description }}{{ "\\n\\n" }}
        {{- $first = true }}{{ range $k, $v := .Parameters.Properties }}{{ if $first }}{{ "    Args:\\n" }}{{ end }}{{ $first = false }}{{ "        " }}{{ $k }}({{ template "mm_pytype" $v }}): {{ $v.Description }}{{ end }}", "parameters": {{ if $first }}{{ "{}" }}{{ else }}{{ template "mm_params" .Parameters }}{{ end }}{{ "}" }}
    {{- end }}
{{- end }}«TAIL»
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if or (eq .Role "user") (eq .Role "system") (and (eq .Role "assistant") (not $m.ToolCalls)) }}
        {{- "<|im_start|>" }}{{ .Role }}{{ "\\n" }}{{ .Content }}
        {{- if not (and $last (eq .Role "assistant")) }}<|im_end|>{{ "\\n" }}{{ end }}
    {{- else if eq .Role "assistant" }}<|im_start|>assistant
        {{- if .ToolCalls }}{{ range .ToolCalls }}«NL»<tool_call>«NL»{"name": "{{ .Function.Name }}", "arguments": {{ template "mm_args" .Function.Arguments }}}«NL»</tool_call>{{ end }}{{ end }}<|im_end|>{{ "\\n" }}
    {{- else if eq .Role "tool" }}
        {{- if and $i (ne $prev "tool") }}<|im_start|>tool{{ "\\n" }}{{ end }}<tool_response>{{ "\\n" }}{{ .Content }}
        {{- if $last }}{{ "\\n</tool_response>" }}<|im_end|>{{ else }}{{ "\\n</tool_response>\\n" }}{{ if ne $next "tool" }}<|im_end|>{{ end }}{{ end }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<|im_start|>assistant{{ "\\n" }}{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        INTRO=golit(_HERMES_INTRO),
        TAIL=golit("".join(_HERMES_TAIL)),
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="hermes",
    title="Hermes 2 Pro / Hermes 3 tool use (ChatML; tools as Python signatures, <tool_call> and a tool role)",
    detect=_detect_hermes,
    build=_build_hermes,
    stop=("<|im_end|>", "<|im_start|>"),
    bos_in_template=True,
    content_none_ok=False,
    markers=("<|im_start|>", "<|im_end|>", "<tool_call>", "<tool_response>", "json_to_python_type",
             "You are a function calling AI model"),
    tool_calls="TEMPLATE: Ollama's tool parser reads the <tool_call> tag from the TEMPLATE",
    notes=(
        "the Jinja trims each parameter description (| trim); Go templates cannot",
        "the Jinja prints 'dict[str, …]' for an object with additionalProperties and '-> type' for a tool's "
        "return; Ollama's tool schema carries neither, so the TEMPLATE prints 'dict' and no return",
        "the Jinja prints a type name it does not know as 'Union[Any,…]' with one Any per character; the "
        "TEMPLATE prints 'Any'",
        "the Jinja (the tool_use variant) fails without tools ('NoneType' object is not iterable); the TEMPLATE "
        "prints the tool system prompt with an empty <tools>  </tools>",
    ),
))


# ---------------------------------------------------------------- SmolLM3 (ChatML, /think and /no_think modes)

_SMOL_HEAD = ("## Metadata\n\n", "Knowledge Cutoff Date: June 2025\n", "## Custom Instructions\n\n")
_SMOL_DEFAULT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face."


def _smol_defaults(src: str) -> tuple[str, str] | None:
    """(the /think default system text, the /no_think one), read from the Jinja."""
    found = [t for t in _jinja_strings(src) if t.startswith(_SMOL_DEFAULT)]
    long = [t for t in found if t != _SMOL_DEFAULT + "\n\n"]
    return (long[0], _SMOL_DEFAULT + "\n\n") if len(found) == 2 and len(long) == 1 else None


def _detect_smollm3(src: str) -> bool:
    return (
        _has_all(src, "<|im_start|>", "<|im_end|>", 'set reasoning_mode = "/think"', 'set reasoning_mode = "/no_think"',
                 '"Reasoning Mode: " + reasoning_mode', '"<think>\\n\\n</think>\\n"', 'content.lstrip("\\n")',
                 'system_message.replace("/no_think", "")')
        and all(h in _jinja_strings(src) for h in _SMOL_HEAD)
        and _smol_defaults(src) is not None
        and _has_none(src, "tools", "tool_call", "xml_tools", "python_tools")
    )


def _build_smollm3(src: str, tokens: TemplateTokens) -> str:
    defaults = _smol_defaults(src)
    assert defaults is not None
    return _fill(
        """
{{- $msgs := .Messages }}{{ $noThink := and .IsThinkSet (not .Think) }}{{ $sys := "" }}
{{- if and $msgs (eq (index $msgs 0).Role "system") }}{{ $sys = (index $msgs 0).Content }}{{ end }}
{{- "<|im_start|>system\\n" }}«HEAD0»«HEAD1»{{ "Reasoning Mode: " }}{{ if $noThink }}/no_think{{ else }}/think{{ end }}{{ "\\n\\n" }}«HEAD2»
{{- if $sys }}{{ $sys }}{{ "\\n\\n" }}{{ else if $noThink }}«SHORT»{{ else }}«LONG»{{ end }}<|im_end|>{{ "\\n" }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}<|im_start|>user{{ "\\n" }}{{ .Content }}<|im_end|>{{ "\\n" }}
    {{- else if eq .Role "assistant" }}<|im_start|>assistant{{ "\\n" }}
        {{- if $noThink }}<think>«NL»«NL»</think>«NL»{{ end }}
        {{- if .Thinking }}<think>«NL»{{ .Thinking }}«NL»</think>{{ end }}{{ .Content }}
        {{- if not $last }}<|im_end|>{{ "\\n" }}{{ end }}
    {{- else if eq .Role "tool" }}<|im_start|>user{{ "\\n" }}{{ .Content }}<|im_end|>{{ "\\n" }}
    {{- end }}
    {{- if ne .Role "system" }}{{ $prev = .Role }}{{ end }}
{{- end }}
{{- if ne $prev "assistant" }}<|im_start|>assistant{{ "\\n" }}{{ if $noThink }}<think>«NL»«NL»</think>«NL»{{ end }}{{ end }}
""",
        HEAD0=golit(_SMOL_HEAD[0]), HEAD1=golit(_SMOL_HEAD[1]), HEAD2=golit(_SMOL_HEAD[2]),
        SHORT=golit(defaults[1]), LONG=golit(defaults[0]),
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="smollm3",
    title="SmolLM3 (ChatML; Reasoning Mode /think or /no_think; no tool calling in this template)",
    detect=_detect_smollm3,
    build=_build_smollm3,
    stop=("<|im_end|>", "<|im_start|>"),
    thinking=True,
    markers=("<|im_start|>", "<|im_end|>", "Knowledge Cutoff Date: June 2025", "Reasoning Mode: ",
             "named SmolLM", "/no_think"),
    tool_calls="none: this template prints neither tools nor tool calls (tool results go in as user turns)",
    notes=(
        "the Jinja switches to /no_think or /think when the system prompt contains that word, and removes it; Go "
        "templates cannot search strings, so the TEMPLATE follows Ollama's think setting only and prints the "
        "system prompt as given",
        "the Jinja strips line breaks at the start of assistant contents and trailing whitespace of the system "
        "prompt; Go templates cannot",
        "the Jinja prints reasoning kept inside assistant contents; the TEMPLATE prints Ollama's .Thinking in "
        "<think>…</think> before the content, which is the same text",
    ),
))
