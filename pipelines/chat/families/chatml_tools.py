"""ChatML with their own tool formats: LFM2.5 Instruct ("List of tools: [...]") and Step 3.5 Flash (XML tool
calls, Ollama PARSER qwen3.5).
"""

from __future__ import annotations

from pipelines.chat.families.blocks import (
    LFM_TOOL_LIST,
    chatml_query_loop,
    chatml_tool_turn,
    lfm_template,
    xml_call,
)
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

# ---------------------------------------------------------------- LFM2.5 Instruct (ChatML, "List of tools: [...]")

# An LFM2 / LFM2.5 Instruct message ends its turn, but for a final assistant message (left open to continue).
_LFM_END = '{{- if not (and $last (eq .Role "assistant")) }}<|im_end|>{{ "\\n" }}{{ end }}'


def _detect_lfm25(src: str) -> bool:
    return (
        _has_all(src, "<|im_start|>", "<|im_end|>", "keep_past_thinking | default(false)", '"List of tools: ["',
                 "ns.last_assistant_index = loop.index0", 'content.split("</think>")[-1] | trim',
                 '("\\n" if ns.system_prompt else "")')
        and _has_none(src, "<|tool_list_start|>", "<|tool_call_start|>", "{%- generation", "tool_calls")
    )


def _build_lfm25(src: str, tokens: TemplateTokens) -> str:
    return json_defines() + lfm_template(
        tokens,
        last=("lastA", "assistant"),
        message=('{{- if and (eq .Role "assistant") (eq $i $lastA) .Thinking }}<think>«NL»{{ .Thinking }}«NL»</think>'
                 "{{ end }}{{ .Content }}",
                 _LFM_END),
    )


register(ChatFamily(
    name="lfm2.5",
    title="Liquid LFM2.5 Instruct (ChatML, 'List of tools: [...]' in the system turn; PARSER lfm2)",
    detect=_detect_lfm25,
    build=_build_lfm25,
    stop=("<|im_end|>", "<|im_start|>"),
    bos_in_template=True,
    thinking=True,
    content_none_ok=False,
    markers=("<|im_start|>", "<|im_end|>", "List of tools: [", "keep_past_thinking"),
    parser="lfm2",
    tool_use_refused="its Jinja writes nothing for an assistant message's tool calls (the message prints as its "
                     "empty content), so the model's own tool-call format is unknown and PARSER lfm2 recovers none of "
                     "the calls",
    tool_calls="refused for tool use: the Jinja prints no tool calls in the history (neither does the TEMPLATE), so "
               "PARSER lfm2 (<|tool_call_start|>[…]<|tool_call_end|>) recovers none of the calls the conversation held",
    notes=(
        "the Jinja keeps the reasoning of the last assistant turn inside its content and trims earlier contents "
        "after cutting it; the TEMPLATE prints .Thinking in <think>…</think> on the last assistant turn only and "
        "cannot trim",
        "the Jinja prints a tool-call message's None content as 'null'; with '' (what Ollama holds) both print "
        "nothing",
        "keep_past_thinking is not an Ollama setting: the TEMPLATE follows its default (false)",
    ),
))


# ---------------------------------------------------------------- LFM2 (ChatML, "List of tools: <|tool_list_start|>[...]")
#
# Ollama ships RENDERER lfm2 for this template, but it lists each tool's function object where the Jinja lists the
# whole tool ({"type": "function", "function": …}): modelmint names no RENDERER and publishes this TEMPLATE, proven
# on the suite, with PARSER lfm2.


def _detect_lfm2(src: str) -> bool:
    return (
        _has_all(src, "<|im_start|>", "<|im_end|>", '"List of tools: <|tool_list_start|>["', '"]<|tool_list_end|>"',
                 '"<|tool_response_start|>" + content + "<|tool_response_end|>"',
                 '("\\n" if ns.system_prompt else "")')
        and _has_none(src, "<think>", "keep_past_thinking", "preserve_thinking", "<|tool_call_start|>", "tool_calls",
                      "{%- generation")
    )


def _build_lfm2(src: str, tokens: TemplateTokens) -> str:
    return json_defines() + lfm_template(
        tokens,
        tools="<|tool_list_start|>[\n        {{-" + LFM_TOOL_LIST[2:] + "]<|tool_list_end|>\n    {{- end }}",
        message=('{{- if eq .Role "tool" }}<|tool_response_start|>{{ .Content }}<|tool_response_end|>{{ else }}'
                 "{{ .Content }}{{ end }}",
                 _LFM_END),
    )


register(ChatFamily(
    name="lfm2",
    title="Liquid LFM2 (ChatML, 'List of tools:' with <|tool_list_start|>, no thinking; PARSER lfm2)",
    detect=_detect_lfm2,
    build=_build_lfm2,
    stop=("<|im_end|>", "<|im_start|>"),
    bos_in_template=True,
    content_none_ok=False,
    markers=("<|im_start|>", "List of tools: ", "<|tool_list_start|>", "<|tool_list_end|>",
             "<|tool_response_start|>"),
    parser="lfm2",
    tool_use_refused="its Jinja writes nothing for an assistant message's tool calls (the message prints as its "
                     "empty content), so the model's own tool-call format is unknown and PARSER lfm2 recovers none of "
                     "the calls",
    tool_calls="refused for tool use: the Jinja prints no tool calls in the history (neither does the TEMPLATE), so "
               "PARSER lfm2 (<|tool_call_start|>[…]<|tool_call_end|>) recovers none of the calls the conversation held",
    notes=(
        "Ollama's RENDERER lfm2 lists each tool's function object where the Jinja lists the whole tool; modelmint "
        "publishes this TEMPLATE with PARSER lfm2 and names no RENDERER",
        "the Jinja prints a tool-call message's None content as 'null'; with '' (what Ollama holds) both print "
        "nothing",
    ),
))


# ---------------------------------------------------------------- Step 3.5 Flash (ChatML, XML tool calls; PARSER qwen3.5)

_STEP_TOOLS_HEAD = "# Tools\n\nYou have access to the following functions in JSONSchema format:\n\n<tools>"
_STEP_TOOLS_TAIL = "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:"
_QWEN35_PARSED = "PARSER qwen3.5 returns the <think> reasoning and the XML tool calls as structured tool_calls"
_PYSTR_NOTE = "tool-call arguments print as Python's str(); numbers print as JSON does (1e21 and beyond differ)"
# A tool-call argument as the Jinja prints it: mappings and lists as JSON, anything else as Python's str().
_PYSTR_DEFINE = (
    '{{- define "mm_pystr" }}{{ $t := printf "%T" . }}{{ if eq $t "string" }}{{ . }}'
    '{{ else if or (eq $t "map[string]interface {}") (eq $t "[]interface {}") }}{{ template "mm_json" . }}'
    '{{ else if eq $t "bool" }}{{ if . }}True{{ else }}False{{ end }}{{ else if eq $t "<nil>" }}None'
    '{{ else }}{{ json . }}{{ end }}{{ end }}\n'
)


def _xml_tools_template(src: str, tokens: TemplateTokens, body: str, head: str, tail_start: str, *,
                        tool_result: str) -> str:
    """Step 3.5's and Qwen3.5's TEMPLATE: `body` after the line setting $msgs and $first (the first message's role),
    filled with the BOS, the tool preamble's head and its tail (the Jinja's string starting with `tail_start`), the
    opening of the message loop, the XML tool call and the tool messages' branch (blocks.chatml_tool_turn).

    Raises:
        ValueError: the Jinja holds no such tail (another family's template).
    """
    tail = _jinja_string_starting(src, tail_start)
    if tail is None:
        raise ValueError(f"no tool preamble tail starting {tail_start!r}")
    return json_defines() + _PYSTR_DEFINE + _fill(
        '{{- $msgs := .Messages }}{{ $first := "" }}{{ if $msgs }}{{ $first = (index $msgs 0).Role }}{{ end }}\n'
        + body.strip("\n"),
        BOS=golit(tokens.bos_text)[3:-3], HEAD=golit(head)[3:-3], TAIL=golit(tail),
        QUERY_LOOP=chatml_query_loop('eq $first "system"'), CALL=xml_call(12), TOOL_TURN=chatml_tool_turn(tool_result))


def _detect_step35(src: str) -> bool:
    return (
        _has_all(src, "<|im_start|>", "<|im_end|>", "<|im_start|>tool_response\\n", "'<tool_call>\\n<function='",
                 "'<parameter=' + args_name + '>\\n'", "multi_step_tool=true", "'\\n<think>\\n' + reasoning_content",
                 "{{- '<|im_start|>assistant\\n<think>\\n' }}", "message.name == 'observation'")
        and _STEP_TOOLS_HEAD in _jinja_strings(src) and _jinja_string_starting(src, _STEP_TOOLS_TAIL) is not None
    )


def _build_step35(src: str, tokens: TemplateTokens) -> str:
    return _xml_tools_template(
        src, tokens,
        """
{{- «BOS» }}
{{- if .Tools }}<|im_start|>system{{ "\\n" }}
    {{- if eq $first "system" }}{{ (index $msgs 0).Content }}{{ "\\n\\n" }}{{ end }}
    {{- «HEAD» }}{{ range .Tools }}{{ "\\n" }}{{ template "mm_tool" . }}{{ end }}«TAIL»
«QUERY_LOOP»
    {{- if or (eq .Role "user") (and (eq .Role "system") $i) }}<|im_start|>{{ .Role }}{{ "\\n" }}{{ .Content }}<|im_end|>{{ "\\n" }}
    {{- else if eq .Role "assistant" }}<|im_start|>assistant{{ "\\n" }}
        {{- if gt $i $lastQuery }}<think>«NL»{{ .Thinking }}«NL»</think>«NL»{{ end }}{{ .Content }}
        {{- if .ToolCalls }}{{ range .ToolCalls }}«CALL»{{ end }}{{ end }}
        {{- if not (and $last (not $m.ToolCalls)) }}<|im_end|>{{ "\\n" }}{{ end }}
«TOOL_TURN»
{{- if ne $prev "assistant" }}<|im_start|>assistant{{ "\\n" }}<think>{{ "\\n" }}{{ end }}
""",
        _STEP_TOOLS_HEAD, _STEP_TOOLS_TAIL,
        tool_result='{{- if ne $prev "tool" }}<|im_start|>tool_response{{ "\\n" }}{{ end }}<tool_response>{{ .Content }}</tool_response>',
    )


register(ChatFamily(
    name="step3.5",
    title="StepFun Step 3.5 Flash (ChatML, <think> always open, <tool_call><function=…><parameter=…>; PARSER qwen3.5)",
    detect=_detect_step35,
    build=_build_step35,
    stop=("<|im_end|>", "<|im_start|>"),
    bos_in_template=True,
    thinking=True,
    markers=("<|im_start|>", "<|im_end|>", "<tool_call>", "<function=", "<parameter=", "tool_response"),
    parser="qwen3.5",
    tool_calls=_QWEN35_PARSED,
    notes=(
        "the Jinja counts a user message that is wholly '<tool_response>…</tool_response>' as no query; Go "
        "templates cannot test a suffix, so the TEMPLATE counts every user message",
        "the Jinja renames a later system message named 'observation'; Ollama messages carry no name",
        _PYSTR_NOTE,
        "the Jinja always opens <think>; Ollama's think=false cannot switch it off",
    ),
))


# ---------------------------------------------------------------- Qwen3.5 (ChatML, hybrid thinking, XML tool calls)
#
# Ollama ships RENDERER qwen3.5, but it prints the tools with Go's HTML escaping ('&' as \\u0026) and list arguments
# as compact JSON where the Jinja writes json.dumps' ", ": modelmint names no RENDERER and publishes this TEMPLATE,
# proven on the suite, with PARSER qwen3.5.

_Q35_TOOLS_HEAD = "# Tools\n\nYou have access to the following functions:\n\n<tools>"
_Q35_TOOLS_TAIL = "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:"


def _detect_qwen35(src: str) -> bool:
    return (
        _has_all(src, "<|im_start|>", "<think>", "<function=", "<parameter=", "<|vision_start|>", "enable_thinking",
                 "render_content", "multi_step_tool=true", "'\\n<think>\\n' + reasoning_content + '\\n</think>\\n\\n'")
        and _has_none(src, "truncate_history_thinking")
        and _Q35_TOOLS_HEAD in _jinja_strings(src) and _jinja_string_starting(src, _Q35_TOOLS_TAIL) is not None
    )


def _build_qwen35(src: str, tokens: TemplateTokens) -> str:
    return _xml_tools_template(
        src, tokens,
        """
{{- «BOS» }}
{{- if .Tools }}<|im_start|>system{{ "\\n" }}{{ «HEAD» }}{{ range .Tools }}{{ "\\n" }}{{ template "mm_tool" . }}{{ end }}{{ "\\n</tools>" }}«TAIL»
    {{- if and (eq $first "system") (index $msgs 0).Content }}{{ "\\n\\n" }}{{ (index $msgs 0).Content }}{{ end }}<|im_end|>{{ "\\n" }}
«QUERY_LOOP»
    {{- if eq .Role "user" }}<|im_start|>user{{ "\\n" }}{{ .Content }}<|im_end|>{{ "\\n" }}
    {{- else if eq .Role "assistant" }}<|im_start|>assistant{{ "\\n" }}
        {{- if gt $i $lastQuery }}<think>«NL»{{ .Thinking }}«NL»</think>«NL»«NL»{{ end }}{{ .Content }}
        {{- range $j, $c := .ToolCalls }}
            {{- if $j }}«NL»{{ else if $m.Content }}«NL»«NL»{{ end }}«CALL»
        {{- end }}
        {{- if not (and $last (not $m.ToolCalls)) }}<|im_end|>{{ "\\n" }}{{ end }}
«TOOL_TURN»
{{- if ne $prev "assistant" }}<|im_start|>assistant{{ "\\n" }}
    {{- if and .IsThinkSet (not .Think) }}<think>«NL»«NL»</think>«NL»«NL»{{ else }}<think>«NL»{{ end }}
{{- end }}
""",
        _Q35_TOOLS_HEAD, _Q35_TOOLS_TAIL,
        tool_result='{{- if and $i (ne $prev "tool") }}<|im_start|>user{{ end }}{{ "\\n<tool_response>\\n" }}{{ .Content }}{{ "\\n</tool_response>" }}',
    )


register(ChatFamily(
    name="qwen3.5",
    title="Qwen3.5 (hybrid thinking, XML tool calls, vision placeholders; PARSER qwen3.5)",
    detect=_detect_qwen35,
    build=_build_qwen35,
    stop=("<|im_end|>", "<|im_start|>"),
    thinking=True,
    reasoning_key="reasoning_content",
    markers=("<|im_start|>", "<think>", "<function=", "<parameter=", "<|vision_start|>", "enable_thinking",
             "render_content"),
    parser="qwen3.5",
    tool_calls=_QWEN35_PARSED,
    notes=(
        "Ollama's RENDERER qwen3.5 prints tools with Go's HTML escaping and list arguments as compact JSON; "
        "modelmint publishes this TEMPLATE with PARSER qwen3.5 and names no RENDERER",
        "the Jinja trims message contents and reasoning (| trim); Go templates cannot, so contents with "
        "surrounding whitespace keep it in Ollama",
        "the Jinja counts a user message that is wholly '<tool_response>…</tool_response>' as no query; Go "
        "templates cannot test a prefix, so the TEMPLATE counts every user message",
        "the Jinja refuses a conversation without a user query or with a later system message; the TEMPLATE "
        "renders them",
        _PYSTR_NOTE,
    ),
))


# ---------------------------------------------------------------- Qwen3-Coder (ChatML, tools as XML, XML tool calls)
#
# Ollama ships RENDERER qwen3-coder, but it writes its own prose ("following functions", "call a function") and
# compact JSON: modelmint names no RENDERER and publishes this TEMPLATE, proven on the suite, with PARSER qwen3-coder.

_QC_DEFAULT_SYSTEM = "You are Qwen, a helpful AI assistant that can interact with a computer to solve tasks."
_QC_TOOLS_HEAD = "\n\n# Tools\n\nYou have access to the following tools:\n\n"
_QC_TOOLS_TAIL = "\n\nIf you choose to call a tool ONLY reply in the following format with NO suffix:"


def _detect_qwen3_coder(src: str) -> bool:
    return (
        _has_all(src, "<|im_start|>", "<tool_call>", "<function=", "<parameter=", "render_extra_keys",
                 "handled_keys = ['name', 'type', 'description']", "handled_keys = ['type', 'properties']")
        and _has_none(src, "<think>", "enable_thinking", "truncate_history_thinking", "<|vision_start|>")
        and _QC_DEFAULT_SYSTEM in src and _QC_TOOLS_HEAD in _jinja_strings(src)
        and _jinja_string_starting(src, _QC_TOOLS_TAIL) is not None
    )


def _build_qwen3_coder(src: str, tokens: TemplateTokens) -> str:
    tail = _jinja_string_starting(src, _QC_TOOLS_TAIL)
    assert tail is not None
    return json_defines() + _PYSTR_DEFINE + _fill(
        """
{{- $msgs := .Messages }}{{ $hasSys := and $msgs (eq (index $msgs 0).Role "system") }}
{{- «BOS» }}
{{- if $hasSys }}<|im_start|>system{{ "\\n" }}{{ (index $msgs 0).Content }}
{{- else if .Tools }}<|im_start|>system{{ "\\n" }}{{ «DEFAULT» }}
{{- end }}
{{- if .Tools }}{{ «HEAD» }}<tools>
    {{- range .Tools }}{{ with .Function }}«NL»<function>«NL»<name>{{ .Name }}</name>
        {{- if .Description }}«NL»<description>{{ .Description }}</description>{{ end }}«NL»<parameters>
        {{- range $k, $v := .Parameters.Properties }}«NL»<parameter>«NL»<name>{{ $k }}</name>
            {{- if $v.Type }}«NL»<type>{{ if eq (len $v.Type) 1 }}{{ index $v.Type 0 }}{{ else }}[{{ range $i, $t := $v.Type }}{{ if $i }}, {{ end }}'{{ $t }}'{{ end }}]{{ end }}</type>{{ end }}
            {{- if $v.Description }}«NL»<description>{{ $v.Description }}</description>{{ end }}
            {{- if $v.AnyOf }}«NL»<anyOf>[{{ range $i, $a := $v.AnyOf }}{{ if $i }}, {{ end }}{{ template "mm_prop" $a }}{{ end }}]</anyOf>{{ end }}
            {{- if $v.Items }}«NL»<items>{{ template "mm_json" $v.Items }}</items>{{ end }}
            {{- if $v.Enum }}«NL»<enum>[{{ range $i, $e := $v.Enum }}{{ if $i }}, {{ end }}{{ template "mm_json" $e }}{{ end }}]</enum>{{ end }}«NL»</parameter>
        {{- end }}
        {{- if .Parameters.Required }}«NL»<required>[{{ range $i, $r := .Parameters.Required }}{{ if $i }}, {{ end }}{{ printf "%q" $r }}{{ end }}]</required>{{ end }}«NL»</parameters>«NL»</function>
    {{- end }}{{ end }}«NL»</tools>{{ «TAIL» }}
{{- end }}
{{- if or $hasSys .Tools }}<|im_end|>{{ "\\n" }}{{ end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if or $i (not $hasSys) }}
        {{- if and (eq .Role "assistant") .ToolCalls }}<|im_start|>assistant
            {{- if .Content }}«NL»{{ .Content }}«NL»{{ end }}
            {{- range .ToolCalls }}«NL»«CALL»
            {{- end }}<|im_end|>{{ "\\n" }}
        {{- else if eq .Role "tool" }}
            {{- if and $prev (ne $prev "tool") }}<|im_start|>user«NL»{{ end }}<tool_response>«NL»{{ .Content }}«NL»</tool_response>{{ "\\n" }}
            {{- if ne $next "tool" }}<|im_end|>{{ "\\n" }}{{ end }}
        {{- else }}<|im_start|>{{ .Role }}«NL»{{ .Content }}
            {{- if not (and $last (eq .Role "assistant")) }}<|im_end|>{{ "\\n" }}{{ end }}
        {{- end }}
        {{- $prev = .Role }}
    {{- end }}
{{- end }}
{{- if ne $prev "assistant" }}<|im_start|>assistant{{ "\\n" }}{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        DEFAULT=golit(_QC_DEFAULT_SYSTEM)[3:-3],
        HEAD=golit(_QC_TOOLS_HEAD)[3:-3],
        TAIL=golit(tail)[3:-3],
        CALL=xml_call(16),
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="qwen3-coder",
    title="Qwen3-Coder (tools as <function><parameters> XML, <tool_call><function=…><parameter=…> calls; PARSER "
          "qwen3-coder)",
    detect=_detect_qwen3_coder,
    build=_build_qwen3_coder,
    stop=("<|im_end|>", "<|im_start|>"),
    markers=("<|im_start|>", "<tool_call>", "<function=", "<parameter=", "render_extra_keys"),
    parser="qwen3-coder",
    tool_calls="PARSER qwen3-coder returns structured tool_calls",
    notes=(
        "Ollama's RENDERER qwen3-coder writes its own tool prose and compact JSON; modelmint publishes this TEMPLATE "
        "with PARSER qwen3-coder and names no RENDERER",
        "the Jinja trims tool and parameter descriptions and an assistant's content beside tool calls (| trim); Go "
        "templates cannot",
        "a parameter's schema keys beyond name, type and description print in the Jinja in the tool's own order; "
        "Ollama holds them in fixed fields, printed as anyOf, items, enum (transformers' get_json_schema order for "
        "items and enum); keys Ollama's API drops are not printed",
        _PYSTR_NOTE,
    ),
))
