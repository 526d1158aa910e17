"""IBM Granite 4.0 / 4.1 and Granite 3.3 (<|start_of_role|>), with Bielik v3 (ChatML with Polish tool and
thinking prompts) between them, where it has always registered, so the coverage listing keeps its order.
"""

from __future__ import annotations

from pipelines.chat.families.chatml import _QWEN3_CALLS
from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import _LOOP_HEAD, _fill, _has_all, _has_none, _jinja_strings, golit
from pipelines.chat.gojson import json_defines

# ---------------------------------------------------------------- Granite 4.0 / 4.1 (<|start_of_role|>, <tool_call>)

_GRANITE4_PREFIX = (
    "You are a helpful assistant with access to the following tools. You may call one or more tools to assist "
    "with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_GRANITE4_SUFFIX = (
    '\n</tools>\n\nFor each tool call, return a json object with function name and arguments within '
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    '<args-json-object>}\n</tool_call>. If a tool does not exist in the provided list of tools, notify the user '
    "that you do not have the ability to fulfill the request."
)
_GRANITE4_DEFAULT = "You are a helpful assistant. Please ensure responses are professional, accurate, and safe."


def _detect_granite4(src: str) -> bool:
    strings = _jinja_strings(src)
    return (
        _has_all(src, "<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "tools_system_message_prefix",
                 "ns.tools_system_message + '\\n' + (tool | tojson)", "(loop.first and content.val) or (not loop.first)",
                 "tool_call.arguments | tojson", "messages[loop.index0 - 1].role != 'tool'")
        and _GRANITE4_PREFIX in strings and _GRANITE4_SUFFIX in strings
        and _has_none(src, "<think>", "enable_thinking", "<|tool_call|>")
    )


def _build_granite4(src: str, tokens: TemplateTokens) -> str:
    default = ""
    if f"g4_default_system_message = '{_GRANITE4_DEFAULT}'" in src:  # Granite 4.0 (4.1 prints no system turn)
        default = f'<|start_of_role|>system<|end_of_role|>{golit(_GRANITE4_DEFAULT)}<|end_of_text|>{{{{ "\\n" }}}}'
    return json_defines() + _fill(
        """
{{- $msgs := .Messages }}{{ $first := "" }}{{ if $msgs }}{{ $first = (index $msgs 0).Role }}{{ end }}
{{- $sys := "" }}{{ if eq $first "system" }}{{ $sys = (index $msgs 0).Content }}{{ end }}
{{- if or $sys .Tools }}<|start_of_role|>system<|end_of_role|>{{ $sys }}
    {{- if .Tools }}{{ if eq $first "system" }}{{ "\\n\\n" }}{{ end }}«PREFIX»{{ range .Tools }}{{ "\\n" }}{{ template "mm_tool" . }}{{ end }}«SUFFIX»{{ end }}
    {{- "<|end_of_text|>\\n" }}
{{- else }}«DEFAULT»{{ end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if or (eq .Role "user") (and (eq .Role "system") $i) }}<|start_of_role|>{{ .Role }}<|end_of_role|>{{ .Content }}<|end_of_text|>{{ "\\n" }}
    {{- else if eq .Role "assistant" }}<|start_of_role|>assistant<|end_of_role|>{{ .Content }}
        {{- if and $m.Content $m.ToolCalls }}{{ "\\n" }}{{ end }}
        «CALLS»
        {{- if not (and $last (not $m.ToolCalls)) }}<|end_of_text|>{{ "\\n" }}{{ end }}
    {{- else if eq .Role "tool" }}
        {{- if ne $prev "tool" }}<|start_of_role|>user<|end_of_role|>{{ end }}
        {{- "\\n<tool_response>\\n" }}{{ .Content }}{{ "\\n</tool_response>" }}
        {{- if ne $next "tool" }}<|end_of_text|>{{ "\\n" }}{{ end }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<|start_of_role|>assistant<|end_of_role|>{{ end }}
""",
        PREFIX=golit(_GRANITE4_PREFIX), SUFFIX=golit(_GRANITE4_SUFFIX), DEFAULT=default or '{{- "" }}',
        LOOP_HEAD=_LOOP_HEAD, CALLS=_QWEN3_CALLS,
    )


register(ChatFamily(
    name="granite4",
    title="Granite 4.0 / 4.1 (<|start_of_role|>…<|end_of_role|>, tools in the system turn, <tool_call> JSON)",
    detect=_detect_granite4,
    build=_build_granite4,
    stop=("<|end_of_text|>", "<|start_of_role|>"),
    markers=("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "<tool_call>", "<tool_response>",
             "tools_system_message_prefix"),
    tool_calls="TEMPLATE: Ollama's tool parser reads the <tool_call> tag from the TEMPLATE",
    notes=("Ollama has no documents: the Jinja's <documents> system section is never printed",),
))


# ---------------------------------------------------------------- Bielik v3 (ChatML, Polish tool and thinking prompts)

_BIELIK_TOOLS = (
    "\n\nMasz dostęp do następujących narzędzi. Definicje narzędzi znajdują się poniżej wewnątrz znaczników "
    "<|function_list|>:\n<|function_list|>\n"
)
_BIELIK_TOOLS_TAIL_START = "]\n<|function_list|>\n\nAby wywołać narzędzie"


def _bielik_texts(src: str) -> tuple[str, str] | None:
    """(the text after the tool list, the thinking instructions), read from the Jinja."""
    strings = _jinja_strings(src)
    tail = [t for t in strings if t.startswith(_BIELIK_TOOLS_TAIL_START)]
    at = next((i for i, t in enumerate(strings) if t.startswith("\n\nZanim odpowiesz")), None)
    if len(tail) != 1 or at is None or _BIELIK_TOOLS not in strings:
        return None
    return tail[0], "".join(strings[at:at + 5])


def _detect_bielik(src: str) -> bool:
    return (
        _has_all(src, "<|im_start|>", "<|function_list|>", "<|function_output|>", "reasoning_content.strip()",
                 "content.lstrip()", "{%- if enable_thinking %}", "{{- ',\\n' }}", "messages[loop_start_index:]")
        and _bielik_texts(src) is not None
    )


def _build_bielik(src: str, tokens: TemplateTokens) -> str:
    texts = _bielik_texts(src)
    assert texts is not None
    return json_defines() + _fill(
        """
{{- $msgs := .Messages }}{{ $sys := "" }}
{{- if and $msgs (eq (index $msgs 0).Role "system") }}{{ $sys = (index $msgs 0).Content }}{{ end }}
{{- «BOS» }}
{{- $prev2 := "" }}
{{- if or $sys .Tools }}<|im_start|>system{{ "\\n" }}{{ $sys }}
    {{- if .Tools }}«TOOLS»[{{ range $j, $t := .Tools }}{{ if $j }}{{ ",\\n" }}{{ end }}{{ template "mm_tool" . }}{{ end }}«TAIL»{{ end }}
    {{- if .Think }}«THINK»{{ end }}<|im_end|>{{ "\\n" }}
{{- end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}<|im_start|>user{{ "\\n" }}{{ .Content }}<|im_end|>{{ "\\n" }}
    {{- else if eq .Role "assistant" }}<|im_start|>assistant{{ "\\n" }}
        {{- if .Thinking }}<think>«NL»{{ .Thinking }}«NL»</think>«NL»{{ end }}{{ .Content }}
        {{- if .ToolCalls }}{{ range .ToolCalls }}«NL»<tool_call>«NL»{"name": "{{ .Function.Name }}", "arguments": {{ template "mm_args" .Function.Arguments }}}«NL»</tool_call>{{ end }}{{ end }}
        {{- if not (and $last (not $m.ToolCalls)) }}<|im_end|>{{ "\\n" }}{{ end }}
    {{- else if and (eq .Role "tool") $sys }}
        {{- if or (eq $i 1) (ne $prev2 "tool") }}<|im_start|>user{{ "\\n" }}{{ end }}<|function_output|>{{ .Content }}
        {{- if $last }}<|im_end|>{{ "\\n" }}{{ end }}
    {{- else if eq .Role "tool" }}
        {{- if ne $prev "tool" }}<|im_start|>user{{ "\\n" }}{{ end }}<|function_output|>{{ .Content }}
        {{- if ne $next "tool" }}<|im_end|>{{ "\\n" }}{{ end }}
    {{- end }}
    {{- $prev2 = $prev }}{{ $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<|im_start|>assistant{{ "\\n" }}{{ if .Think }}<think>{{ "\\n" }}{{ end }}{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        TOOLS=golit(_BIELIK_TOOLS), TAIL=golit(texts[0]), THINK=golit(texts[1]),
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="bielik",
    title="Bielik v3 (ChatML; Polish tool and thinking instructions, <tool_call>, <|function_output|>)",
    detect=_detect_bielik,
    build=_build_bielik,
    stop=("<|im_end|>", "<|im_start|>"),
    bos_in_template=True,
    thinking=True,
    content_none_ok=False,
    markers=("<|im_start|>", "<|im_end|>", "<tool_call>", "<|function_list|>", "<|function_output|>", "<think>"),
    tool_calls="TEMPLATE: Ollama's tool parser reads the <tool_call> tag from the TEMPLATE",
    notes=(
        "the Jinja strips whitespace around kept reasoning and at the start of assistant contents; Go templates "
        "cannot",
        "the Jinja ignores later system messages; so does the TEMPLATE",
        "after a system message the Jinja looks at tool neighbours one place off (it indexes the whole list while "
        "looping over the rest), so tool results stay open until the end; the TEMPLATE does the same",
        "the Jinja leaves out the system turn, and with it the thinking instructions, when there is neither a "
        "system message nor tools; so does the TEMPLATE",
    ),
))


# ---------------------------------------------------------------- Granite 3.3 (<|start_of_role|>, available_tools role)

_GRANITE33_BASE = ("Knowledge Cutoff Date: April 2024. Today's Date: ", ". You are Granite, developed by IBM.")
_GRANITE33_TOOLS = " You are a helpful assistant with access to the following tools. When a tool is required"
_GRANITE33_PLAIN = " You are a helpful AI assistant."
_GRANITE33_THINK = " You are a helpful AI assistant.\nRespond to every user query in a comprehensive and detailed way."


def _granite33_texts(src: str) -> tuple[str, str] | None:
    """(the tools sentence, the thinking instructions) the Jinja appends to its default system prompt."""
    strings = _jinja_strings(src)
    tools = [t for t in strings if t.startswith(_GRANITE33_TOOLS) and "documents" not in t]
    think = [t for t in strings if t.startswith(_GRANITE33_THINK)]
    return (tools[0], think[0]) if len(tools) == 1 and len(think) == 1 else None


def _detect_granite33(src: str) -> bool:
    strings = _jinja_strings(src)
    return (
        _has_all(src, "<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "strftime_now('%B %d, %Y')",
                 "<|start_of_role|>available_tools<|end_of_role|>", "available_tools | tojson(indent=4)",
                 "{%- elif thinking %}", "{%- if loop.last and add_generation_prompt %}")
        and all(t in strings for t in (*_GRANITE33_BASE, _GRANITE33_PLAIN))
        and _granite33_texts(src) is not None
        and _has_none(src, "tool_calls", "<tool_call>")
    )


def _build_granite33(src: str, tokens: TemplateTokens) -> str:
    texts = _granite33_texts(src)
    assert texts is not None
    return json_defines(indent=True, tool_depths=(1,)) + _fill(
        """
{{- $msgs := .Messages }}{{ $hasSys := and $msgs (eq (index $msgs 0).Role "system") }}
{{- "<|start_of_role|>system<|end_of_role|>" }}
{{- if $hasSys }}{{ (index $msgs 0).Content }}{{ $msgs = slice $msgs 1 }}
{{- else }}«BASE0»{{ currentDate }}«BASE1»{{ if .Tools }}«TOOLS»{{ else if .Think }}«THINK»{{ else }}«PLAIN»{{ end }}
{{- end }}<|end_of_text|>{{ "\\n" }}
{{- if .Tools }}<|start_of_role|>available_tools<|end_of_role|>[
    {{- range $j, $t := .Tools }}{{ if $j }},{{ end }}{{ "\\n    " }}{{ template "mm_tool_i1" . }}{{ end }}{{ "\\n]" }}<|end_of_text|>{{ "\\n" }}
{{- end }}
{{- /* Never renders: the model calls tools as <|tool_call|>[…], the tag Ollama's tool parser waits for. */}}
{{- if false }}{{ if .ToolCalls }}<|tool_call|>[{{ range .ToolCalls }}{{ .Function.Name }}{{ end }}]{{ end }}{{ end }}
{{- range $i, $m := $msgs }}
    «LOOP_HEAD»
    {{- "<|start_of_role|>" }}{{ .Role }}<|end_of_role|>{{ .Content }}
    {{- if not (and $last (eq .Role "assistant")) }}<|end_of_text|>{{ "\\n" }}{{ end }}
    {{- if and $last (ne .Role "assistant") }}<|start_of_role|>assistant<|end_of_role|>{{ end }}
{{- end }}
""",
        BASE0=golit(_GRANITE33_BASE[0]), BASE1=golit(_GRANITE33_BASE[1]),
        TOOLS=golit(texts[0]), THINK=golit(texts[1]), PLAIN=golit(_GRANITE33_PLAIN),
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="granite3.3",
    title="Granite 3.3 (<|start_of_role|>…<|end_of_role|>, tools as an available_tools turn, thinking switch)",
    detect=_detect_granite33,
    build=_build_granite33,
    stop=("<|end_of_text|>", "<|start_of_role|>"),
    think_variable="thinking",
    jinja_date="%B %d, %Y",
    content_none_ok=False,
    markers=("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "available_tools",
             "You are Granite, developed by IBM."),
    tool_use_refused="its Jinja writes nothing for an assistant message's tool calls, so the model's own tool-call "
                     "format is unknown and Ollama's tool parser recovers none of the calls",
    tool_calls="refused for tool use: the Jinja prints no tool calls in the history, so Ollama's tool parser (waiting "
               "for the <|tool_call|>[ a never-rendered block of the TEMPLATE names) recovers none of the calls the "
               "conversation held",
    notes=(
        "the Jinja prints today's date as '%B %d, %Y' through strftime_now; Ollama's currentDate is always "
        "YYYY-MM-DD, so the default system prompt has the same date in ISO form",
        "the Jinja prints no tool calls in assistant history (only their content); neither does the TEMPLATE",
        "Ollama has no documents or controls: the Jinja's document turns and citation/hallucination "
        "instructions are never printed",
    ),
))
