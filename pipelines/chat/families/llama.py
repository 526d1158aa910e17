"""Llama 3.1 / 3.2 / 3.3 (JSON tool calls) and the DeepSeek-R1 distills (<think>).
"""

from __future__ import annotations

from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import _LOOP_HEAD, _fill, _has_all, _has_none, golit
from pipelines.chat.gojson import json_defines

# ---------------------------------------------------------------- Llama 3.1 / 3.2 / 3.3 (JSON tool calls)

_LLAMA3_TOOL_INTRO = (
    "Given the following functions, please respond with a JSON for a function call with its proper arguments "
    "that best answers the given prompt.\n\n"
    'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
    "Do not use variables.\n\n"
)


def _detect_llama3(src: str) -> bool:
    return _has_all(
        src, "<|start_header_id|>", "<|eot_id|>", "Cutting Knowledge Date: December 2023", "tools_in_user_message",
        "Given the following functions, please respond with a JSON for a function call",
        "t | tojson(indent=4)", "This model only supports single tool-calls at once!",
        "<|start_header_id|>ipython<|end_header_id|>",
    ) and _has_none(src, "functionary", "<|python_tag|>{{", "reasoning")


def _build_llama3(src: str, tokens: TemplateTokens) -> str:
    # Llama 3.1 prints a fixed date; 3.2 and 3.3 print today's through strftime_now, which Ollama offers as
    # currentDate (always YYYY-MM-DD: the one documented difference, see ChatFamily.notes).
    date = "{{ currentDate }}" if "strftime_now" in src else golit("26 Jul 2024")
    return json_defines(indent=True) + _fill(
        """
{{- $msgs := .Messages }}{{ $sys := "" }}
{{- if and $msgs (eq (index $msgs 0).Role "system") }}{{ $sys = (index $msgs 0).Content }}{{ $msgs = slice $msgs 1 }}{{ end }}
{{- «BOS» }}<|start_header_id|>system<|end_header_id|>{{ "\\n\\n" }}
{{- if .Tools }}Environment: ipython{{ "\\n" }}{{ end }}
{{- "Cutting Knowledge Date: December 2023\\nToday Date: " }}«DATE»{{ "\\n\\n" }}{{ $sys }}<|eot_id|>
{{- if .Tools }}<|start_header_id|>user<|end_header_id|>{{ "\\n\\n" }}«TOOL_INTRO»
    {{- range .Tools }}{{ template "mm_tool_i" . }}{{ "\\n\\n" }}{{ end }}
    {{- (index $msgs 0).Content }}<|eot_id|>{{ $msgs = slice $msgs 1 }}
{{- end }}
{{- $prev := "" }}
{{- range $i, $m := $msgs }}
    «LOOP_HEAD»
    {{- if gt (len .ToolCalls) 0 }}<|start_header_id|>assistant<|end_header_id|>{{ "\\n\\n" }}
        {{- if .ToolCalls }}{{ with index .ToolCalls 0 }}{"name": "{{ .Function.Name }}", "parameters": {{ template "mm_args" .Function.Arguments }}}{{ end }}{{ end }}<|eot_id|>
    {{- else if or (eq .Role "tool") (eq .Role "ipython") }}<|start_header_id|>ipython<|end_header_id|>{{ "\\n\\n" }}
        {{- printf "%q" .Content }}<|eot_id|>
    {{- else }}<|start_header_id|>{{ .Role }}<|end_header_id|>{{ "\\n\\n" }}{{ .Content }}
        {{- if not (and $last (eq .Role "assistant")) }}<|eot_id|>{{ end }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<|start_header_id|>assistant<|end_header_id|>{{ "\\n\\n" }}{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        DATE=date,
        TOOL_INTRO=golit(_LLAMA3_TOOL_INTRO),
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="llama3",
    title="Llama 3.1 / 3.2 / 3.3 Instruct (tools as JSON in the first user message)",
    detect=_detect_llama3,
    build=_build_llama3,
    stop=("<|eot_id|>", "<|eom_id|>", "<|start_header_id|>", "<|end_header_id|>"),
    jinja_date="%d %b %Y",
    markers=("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "Cutting Knowledge Date: December 2023",
             "tools_in_user_message", "<|start_header_id|>ipython<|end_header_id|>"),
    tool_calls="TEMPLATE: bare JSON objects ({\"name\": …, \"parameters\": …}), which Ollama's tool parser reads",
    bos_in_template=True,
    notes=(
        "Jinja trims message contents (| trim); Go templates cannot, so contents with surrounding whitespace "
        "keep it in Ollama",
        "Llama 3.2/3.3 print today's date as '%d %b %Y' through strftime_now; Ollama's currentDate is always "
        "YYYY-MM-DD, so the 'Today Date:' line has the same date in ISO form",
    ),
))


# ---------------------------------------------------------------- DeepSeek-R1 distills (<think>)


def _detect_deepseek_r1(src: str) -> bool:
    return _has_all(
        src, "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", "<think>\\n", "</think>",
        "<｜tool▁calls▁begin｜>", "<｜tool▁outputs▁begin｜>", "ns.system_prompt", "ns.is_first", "ns.is_output_first",
        "namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='')",
        "content.split('</think>')[-1]",
    ) and _has_none(src, "reasoning_content", "thinking_mode", "<｜tool▁call▁begin｜>' + tool_call")


# The DeepSeek TEMPLATEs' loop head: the loop state, and <think>…</think> declared around .Thinking (never rendered),
# which Ollama reads as the thinking tags.
_DEEPSEEK_LOOP_HEAD = (
    _LOOP_HEAD + "\n    {{- /* Never renders: declares <think>…</think> around .Thinking, which Ollama reads as the thinking "
    "tags. */}}\n    {{- if false }}<think>{{ .Thinking }}</think>{{ end }}"
)


def _build_deepseek_r1(src: str, tokens: TemplateTokens) -> str:
    # The Qwen distill prints tool-call arguments with tojson and takes calls from messages with
    # tool_calls; the Llama distill concatenates the arguments (a JSON string) and takes calls only from
    # messages whose content is none, closing the list after the second call and later ones only.
    llama_variant = "message['content'] is none" in src
    think_switch = "enable_thinking" in src
    if llama_variant:
        calls = """
    {{- if and (eq .Role "assistant") .ToolCalls (not (or .Content .Thinking)) }}{{ $isTool = false }}
        {{- range .ToolCalls }}
            {{- if not $isFirst }}<｜Assistant｜><｜tool▁calls▁begin｜>«CALL»{{ $isFirst = true }}
            {{- else }}{{ "\\n" }}«CALL»<｜tool▁calls▁end｜><｜end▁of▁sentence｜>{{ end }}
        {{- end }}
    {{- end }}"""
    else:
        calls = """
    {{- if and (eq .Role "assistant") .ToolCalls }}{{ $isTool = false }}
        {{- range .ToolCalls }}
            {{- if not $isFirst }}<｜Assistant｜><｜tool▁calls▁begin｜>«CALL»{{ $isFirst = true }}
            {{- else }}{{ "\\n" }}«CALL»{{ end }}
        {{- end }}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>
    {{- end }}"""
    call = (
        '<｜tool▁call▁begin｜>function<｜tool▁sep｜>{{ .Function.Name }}{{ "\\n```json\\n" }}'
        '{{ template "mm_args" .Function.Arguments }}{{ "\\n```" }}<｜tool▁call▁end｜>'
    )
    gen = '<｜Assistant｜><think>{{ "\\n" }}' + ('{{ if not $.Think }}</think>{{ end }}' if think_switch else "")
    return json_defines() + _fill(
        """
{{- $msgs := .Messages }}{{ $sys := "" }}{{ range $msgs }}{{ if eq .Role "system" }}{{ $sys = .Content }}{{ end }}{{ end }}
{{- «BOS» }}{{ $sys }}
{{- $isFirst := false }}{{ $isTool := false }}{{ $outFirst := true }}{{ $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}{{ $isTool = false }}<｜User｜>{{ .Content }}{{ end }}
    «CALLS»
    {{- if and (eq .Role "assistant") (or .Content .Thinking (not .ToolCalls)) }}
        {{- if $isTool }}<｜tool▁outputs▁end｜>{{ .Content }}{{ $isTool = false }}
        {{- else }}<｜Assistant｜>{{ .Content }}{{ end }}
        {{- if not $last }}<｜end▁of▁sentence｜>{{ end }}
    {{- end }}
    {{- if eq .Role "tool" }}{{ $isTool = true }}
        {{- if $outFirst }}<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{{ .Content }}<｜tool▁output▁end｜>{{ $outFirst = false }}
        {{- else }}{{ "\\n" }}<｜tool▁output▁begin｜>{{ .Content }}<｜tool▁output▁end｜>{{ end }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if $isTool }}<｜tool▁outputs▁end｜>{{ end }}
{{- if and (not $isTool) (ne $prev "assistant") }}«GEN»{{ end }}
""",
        CALLS=calls.strip().replace("«CALL»", call),
        BOS=golit(tokens.bos_text)[3:-3],
        LOOP_HEAD=_DEEPSEEK_LOOP_HEAD,
        GEN=gen,
    )


register(ChatFamily(
    name="deepseek-r1",
    title="DeepSeek-R1 distills (Qwen and Llama): <｜User｜>/<｜Assistant｜>, <think> generation prompt",
    detect=_detect_deepseek_r1,
    build=_build_deepseek_r1,
    stop=("<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"),
    markers=("<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁outputs▁begin｜>", "ns.is_output_first",
             "content.split('</think>')[-1]"),
    tool_calls="none structured: the TEMPLATE declares no tool-call tag Ollama can parse (thinking is parsed)",
    bos_in_template=True,
    thinking=True,
    string_arguments=lambda src: "message['content'] is none" in src,
    notes=(
        "the Jinja removes everything up to '</think>' from assistant history; Go templates cannot split "
        "strings, so the TEMPLATE relies on Ollama passing reasoning in .Thinking (its thinking parser does), "
        "never inside .Content",
    ),
))


# ---------------------------------------------------------------- DeepSeek-R1 as llama.cpp writes it (tools offered)

_R1_TOOLS_INTRO = "You can call any of the following function tools to satisfy the user's requests: "
_R1_TOOLS_EXAMPLE = (
    "\n\nExample function tool call syntax:\n\n"
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>example_function_name\n"
    '```json\n{\n  "arg1": "some_value"\n  ...\n}\n```\n<｜tool▁call▁end｜><｜tool▁calls▁end｜>\n\n'
)


def _detect_deepseek_r1_llamacpp(src: str) -> bool:
    return _has_all(
        src, "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", "<think>\\n", "flush_tool_outputs",
        "ns.is_tool_outputs", "tools | map(attribute='function') | tojson(indent=2)",
        "Example function tool call syntax:", "content.split('</think>')[-1]", _R1_TOOLS_EXAMPLE.strip("\n"),
    ) and _has_none(src, "reasoning_content", "enable_thinking", "is_tool=false")


def _build_deepseek_r1_llamacpp(src: str, tokens: TemplateTokens) -> str:
    # Tool outputs are flushed (<｜tool▁outputs▁end｜><｜end▁of▁sentence｜>) by the next message that is not a
    # tool result, or at the end; an assistant message with content takes the content branch, so a message
    # holding reasoning and tool calls prints no calls (as the Jinja does: its content is the <think> block).
    return json_defines(indent_width=2) + _fill(
        """
{{- $msgs := .Messages }}{{ $sys := "" }}{{ range $msgs }}{{ if eq .Role "system" }}{{ $sys = .Content }}{{ end }}{{ end }}
{{- «BOS» }}
{{- if .Tools }}«INTRO»{{ template "mm2_functions_i" .Tools }}«EXAMPLE»{{ end }}
{{- $sys }}
{{- $outs := false }}{{ $outFirst := true }}{{ $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if and $outs (ne .Role "tool") }}<｜tool▁outputs▁end｜><｜end▁of▁sentence｜>{{ $outs = false }}{{ end }}
    {{- if eq .Role "user" }}<｜User｜>{{ .Content }}<｜end▁of▁sentence｜>{{ end }}
    {{- if and (eq .Role "assistant") (not (or .Content .Thinking)) }}<｜Assistant｜><｜tool▁calls▁begin｜>
        {{- range $j, $c := .ToolCalls }}{{ if $j }}{{ "\\n" }}{{ end }}«CALL»{{ end }}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>
    {{- end }}
    {{- if and (eq .Role "assistant") (or .Content .Thinking) }}<｜Assistant｜>{{ .Content }}
        {{- if not $last }}<｜end▁of▁sentence｜>{{ end }}
    {{- end }}
    {{- if eq .Role "tool" }}{{ $outs = true }}
        {{- if $outFirst }}<｜tool▁outputs▁begin｜>{{ $outFirst = false }}{{ end }}
        {{- "\\n" }}<｜tool▁output▁begin｜>{{ .Content }}<｜tool▁output▁end｜>
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if $outs }}<｜tool▁outputs▁end｜><｜end▁of▁sentence｜>{{ end }}
{{- if ne $prev "assistant" }}<｜Assistant｜><think>{{ "\\n" }}{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        INTRO=golit(_R1_TOOLS_INTRO),
        EXAMPLE=golit(_R1_TOOLS_EXAMPLE),
        CALL=('<｜tool▁call▁begin｜>function<｜tool▁sep｜>{{ .Function.Name }}{{ "\\n```json\\n" }}'
              '{{ template "mm_args" .Function.Arguments }}{{ "\\n```" }}<｜tool▁call▁end｜>'),
        LOOP_HEAD=_DEEPSEEK_LOOP_HEAD,
    )


register(ChatFamily(
    name="deepseek-r1-llama.cpp",
    title="DeepSeek-R1 as llama.cpp writes it (tools as indent=2 JSON before the system prompt, <think> prompt)",
    detect=_detect_deepseek_r1_llamacpp,
    build=_build_deepseek_r1_llamacpp,
    stop=("<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"),
    markers=("<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁outputs▁begin｜>", "flush_tool_outputs",
             "tojson(indent=2)", "content.split('</think>')[-1]"),
    tool_calls=("none structured: each call is <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME and a ```json block of the "
                "arguments alone, in which Ollama's tool parser (bare JSON objects: the TEMPLATE declares no tag) finds "
                "no tool name; thinking is parsed"),
    bos_in_template=True,
    thinking=True,
    proof_note=("its 7 conversations with tools are proven with llama.cpp's tojson, which takes the "
                "`tools | map(attribute='function')` sequence that transformers' json.dumps refuses "
                "(tests/test_ollama_templates.py::test_deepseek_r1_llamacpp_tools_match_llamacpps_tojson)"),
    notes=(
        "the Jinja removes everything up to '</think>' from assistant history; Go templates cannot split "
        "strings, so the TEMPLATE relies on Ollama passing reasoning in .Thinking (its thinking parser does), "
        "never inside .Content",
        "tools print as json.dumps(indent=2) with the key orders Ollama's API keeps (see pipelines.chat.gojson)",
    ),
))


# ---------------------------------------------------------------- DeepSeek V3.1 (thinking switch, <｜tool▁sep｜> calls)
#
# Ollama ships RENDERER deepseek3.1, but it opens a non-thinking answer with "</think>" where this Jinja writes
# "<think></think>" and lists the tools in the system prompt where this Jinja prints none: modelmint names no
# RENDERER and publishes this TEMPLATE, proven on the suite.


def _detect_deepseek_v31(src: str) -> bool:
    return _has_all(
        src, "<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁output▁begin｜>",
        "set thinking = enable_thinking", "is_last_user=false", "{{'<｜Assistant｜><think></think>'}}",
        "content.split('</think>', 1)[1]", "add_generation_prompt and ns.is_last_user and not ns.is_tool",
    ) and _has_none(src, "reasoning_content", "DSML")


def _build_deepseek_v31(src: str, tokens: TemplateTokens) -> str:
    call = ('<｜tool▁call▁begin｜>{{ .Function.Name }}<｜tool▁sep｜>{{ template "mm_args" .Function.Arguments }}'
            "<｜tool▁call▁end｜>")
    return json_defines() + _fill(
        """
{{- $msgs := .Messages }}{{ $seen := false }}
{{- «BOS» }}{{ range $msgs }}{{ if eq .Role "system" }}{{ if $seen }}«NL»«NL»{{ end }}{{ .Content }}{{ $seen = true }}{{ end }}{{ end }}
{{- $lastUser := false }}{{ $isTool := false }}{{ $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}{{ $isTool = false }}{{ $lastUser = true }}<｜User｜>{{ .Content }}
    {{- else if and (eq .Role "assistant") .ToolCalls }}
        {{- if $lastUser }}<｜Assistant｜><think></think>{{ end }}{{ $lastUser = false }}{{ $isTool = false }}
        {{- if .Thinking }}<think>{{ "\\n" }}{{ .Thinking }}{{ "\\n" }}</think>{{ end }}{{ .Content }}<｜tool▁calls▁begin｜>
        {{- range .ToolCalls }}«CALL»{{ end }}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>
    {{- else if eq .Role "assistant" }}
        {{- if $lastUser }}<｜Assistant｜><think></think>{{ end }}{{ $lastUser = false }}
        {{- if and $isTool .Thinking }}<think>{{ "\\n" }}{{ .Thinking }}{{ "\\n" }}</think>{{ end }}{{ $isTool = false }}{{ .Content }}
        {{- if not $last }}<｜end▁of▁sentence｜>{{ end }}
    {{- else if eq .Role "tool" }}{{ $lastUser = false }}{{ $isTool = true }}<｜tool▁output▁begin｜>{{ .Content }}<｜tool▁output▁end｜>
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if and $lastUser (not $isTool) (ne $prev "assistant") }}<｜Assistant｜>{{ if .Think }}<think>{{ else }}<think></think>{{ end }}{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        CALL=call,
        LOOP_HEAD=_DEEPSEEK_LOOP_HEAD,
    )


register(ChatFamily(
    name="deepseek3.1",
    title="DeepSeek V3.1 (hybrid thinking switch, <｜tool▁calls▁begin｜> tool calls)",
    detect=_detect_deepseek_v31,
    build=_build_deepseek_v31,
    stop=("<｜end▁of▁sentence｜>", "<｜User｜>"),
    bos_in_template=True,
    thinking=True,
    markers=("<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁output▁begin｜>",
             "set thinking = enable_thinking"),
    tool_calls=("none: this Jinja prints no tools (DeepSeek V3.1 leaves them to the system prompt), so the TEMPLATE "
                "uses no .Tools and Ollama does not list tools among the model's capabilities (server/images.go:"
                "247-250)"),
    notes=(
        "Ollama's RENDERER deepseek3.1 opens a non-thinking answer with '</think>' and lists the tools in the system "
        "prompt, where this Jinja writes '<think></think>' and prints no tools; modelmint publishes this TEMPLATE "
        "and names no RENDERER (Ollama's deepseek3 PARSER is not reimplemented here, so none is named)",
        "the Jinja cuts everything up to the first '</think>' out of an assistant answer's content; Go templates "
        "cannot split strings, so the TEMPLATE relies on Ollama passing reasoning in .Thinking",
        "a message's 'prefix' (continue the reasoning) is not an Ollama field: the TEMPLATE follows its absence",
        "the Jinja adds no generation prompt after tool results (the model is expected to go on); the TEMPLATE "
        "does the same",
    ),
))
