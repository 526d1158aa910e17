"""Muse Glimmer (ATEM channels: <|start|>…<|message|>…<|eom|>), a proven TEMPLATE with Ollama's glimmer PARSER.
"""

from __future__ import annotations

from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import _LOOP_HEAD, _fill, _has_all, golit
from pipelines.chat.gojson import json_defines

# ---------------------------------------------------------------- Muse Glimmer (ATEM)
#
# Ollama ships RENDERER glimmer for this template, but it closes a final assistant message and opens a new turn
# (model/renderers/glimmer.go:341-367 at v0.33.0-rc2), where the Jinja (continue_final_message) and Ollama's own
# TEMPLATE path leave it open for the model to continue (template/template.go:272-281 hands the final assistant
# message to the TEMPLATE; server/routes.go:2685-2691 tells the PARSER it is a prefill). So modelmint names no
# RENDERER: this TEMPLATE renders what the Jinja renders, continuation included, and PARSER glimmer reads the
# model's channels and ATEM tool calls.

_GLIMMER_TOOLS_PREFIX = (
    "In this environment you have access to a set of tools you can use to answer the user's question.\n\n"
    'You can invoke a function by writing a "<atem:function_calls>" block like the following:\n'
    '<atem:function_calls>\n<atem:invoke name="$FUNCTION_NAME">\n'
    '<atem:parameter name="$PARAMETER_NAME">$PARAMETER_VALUE</atem:parameter>\n...\n</atem:invoke>\n'
    "</atem:function_calls>\n\n"
    "String and scalar parameters should be specified as is, while lists and objects should use JSON format. Note "
    "that spaces for string values are not stripped. The output is not expected to be valid XML and is parsed with "
    "regular expressions.\n"
    "Here are the functions available in JSONSchema format:\n"
    "// Tool metadata\n"
)
_GLIMMER_TOOLS_SUFFIX = (
    "\n\nHere's an example of how to call a function in the tool set:\n"
    "(If the tool namespace is not specified, invoke the function directly as `example_function_name` rather than "
    "`example_tool_name.example_function_name`)\n\n"
    "to=example_tool_name.example_function_name\n\n"
    '<atem:function_calls>\n<atem:invoke name="example_tool_name.example_function_name">\n'
    '<atem:parameter name="example_parameter_1">value_1</atem:parameter>\n'
    '<atem:parameter name="example_parameter_2">This is the value for the second parameter\nthat can span\n'
    '"multiple" lines\n</atem:parameter>\n'
    "</atem:invoke>\n</atem:function_calls>"
)
_GLIMMER_DEFAULT_SYSTEM = "You are a helpful AI assistant."
_GLIMMER_CUTOFF = "2026-01-04"


def _detect_glimmer(src: str) -> bool:
    return _has_all(src, "<|start|>", "<|message|>", "<|eom|>", "<|eot|>", "Muse Glimmer ATEM",
                    _GLIMMER_DEFAULT_SYSTEM, f"'{_GLIMMER_CUTOFF}'", "render_atem", "reasoning_strength")


# The system block's tail, after its text: reasoning strength, tool definitions, valid recipients. Tool namespaces
# are the tool names, each once (the Jinja takes the part before a '.', see ChatFamily.notes).
_SYSTEM_TAIL = """
    {{- "\\n\\nReasoning strength: " }}{{ $strength }}.
    {{- if $.Tools }}{{ "\\n\\n" }}«PREFIX»
        {{- range $i, $t := $.Tools }}{{ $seen := false }}
            {{- range $j, $u := $.Tools }}{{ if and (lt $j $i) (eq $u.Function.Name $t.Function.Name) }}{{ $seen = true }}{{ end }}{{ end }}
            {{- if not $seen }}{"name": {{ printf "%q" $t.Function.Name }}, "description": ""}«NL»{{ end }}
        {{- end }}// Function schemas
        {{- range $.Tools }}«NL»{"name": {{ printf "%q" .Function.Name }}, "description": {{ printf "%q" .Function.Description }}, "parameters": {{ template "mm_params" .Function.Parameters }}}{{ end }}
        {{- «SUFFIX» }}
    {{- end }}{{ "\\n\\n" }}# Valid recipients: "self"
    {{- range $i, $t := $.Tools }}{{ $seen := false }}
        {{- range $j, $u := $.Tools }}{{ if and (lt $j $i) (eq $u.Function.Name $t.Function.Name) }}{{ $seen = true }}{{ end }}{{ end }}
        {{- if not $seen }}, "{{ $t.Function.Name }}.*"{{ end }}
    {{- end }}, "user".<|eot|>"""


def _build_glimmer(src: str, tokens: TemplateTokens) -> str:
    tail = _SYSTEM_TAIL.replace("«PREFIX»", golit(_GLIMMER_TOOLS_PREFIX)).replace(
        "«SUFFIX»", golit(_GLIMMER_TOOLS_SUFFIX)[3:-3])
    return json_defines() + _fill(
        """
{{- $msgs := .Messages }}{{ $prev := "" }}
{{- $strength := "high" }}{{ if and .IsThinkSet (not .Think) }}{{ $strength = "none" }}
{{- else if and .IsThinkSet .ThinkLevel (ne .ThinkLevel "medium") }}{{ $strength = .ThinkLevel }}{{ end }}
{{- $hasSystem := false }}{{ range $msgs }}{{ if eq .Role "system" }}{{ $hasSystem = true }}{{ end }}{{ end }}
{{- «BOS» }}
{{- if not $hasSystem }}<|start|>system<|message|>«DEFAULT»{{ "\\nKnowledge cutoff: «CUTOFF».\\nCurrent date: " }}{{ currentDate }}.
    «TAIL»
{{- end }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- $end := "<|eot|>" }}{{ if eq $next .Role }}{{ $end = "<|eom|>" }}{{ end }}
    {{- if eq .Role "system" }}<|start|>system<|message|>{{ .Content }}
        «TAIL»
    {{- else if eq .Role "user" }}<|start|>user<|message|>{{ .Content }}<|eot|>
    {{- else if eq .Role "tool" }}<|start|>tool {{ .ToolName }}<|message|><tool_output name="{{ .ToolName }}">{{ "\\n" }}
        {{- .Content }}{{ "\\n" }}</tool_output><|eot|>
    {{- else if eq .Role "assistant" }}
        {{- if .Thinking }}<|start|>assistant to=self<|message|>{{ .Thinking }}<|eom|>{{ end }}
        {{- if .ToolCalls }}
            {{- range $j, $c := .ToolCalls }}<|start|>assistant to={{ .Function.Name }}<|message|><atem:function_calls>{{ "\\n" }}
                {{- "" }}<atem:invoke name="{{ .Function.Name }}">{{ "\\n" }}
                {{- range $k, $v := .Function.Arguments }}<atem:parameter name="{{ $k }}">
                    {{- $t := printf "%T" $v }}
                    {{- if eq $t "<nil>" }}null
                    {{- else if or (eq $t "map[string]interface {}") (eq $t "[]interface {}") }}{{ template "mm_json" $v }}
                    {{- else }}{{ $v }}{{ end }}</atem:parameter>{{ "\\n" }}
                {{- end }}</atem:invoke>{{ "\\n" }}</atem:function_calls>
                {{- if eq (len (slice $m.ToolCalls $j)) 1 }}{{ $end }}{{ else }}<|eom|>{{ end }}
            {{- end }}
        {{- else }}<|start|>assistant to=user<|message|>{{ .Content }}{{ if not $last }}<|eot|>{{ end }}
        {{- end }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<|start|>assistant{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        DEFAULT=golit(_GLIMMER_DEFAULT_SYSTEM),
        CUTOFF=_GLIMMER_CUTOFF,
        TAIL=tail.strip("\n"),
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="glimmer",
    title="Muse Glimmer (ATEM channels: <|start|>…<|message|>…<|eom|>)",
    detect=_detect_glimmer,
    build=_build_glimmer,
    stop=("<|eot|>",),
    bos_in_template=True,
    thinking=True,
    reasoning_key="reasoning_content",
    # Ollama's think false and true are reasoning strengths none and high here (as glimmer.go:65-76 maps them)
    think_variable="reasoning_strength",
    think_values=("none", "high"),
    markers=("<|start|>", "<|message|>", "<|eom|>", "<|eot|>", "Muse Glimmer ATEM"),
    parser="glimmer",
    tool_calls="PARSER glimmer returns structured tool_calls and the to=self reasoning",
    notes=(
        "Ollama's RENDERER glimmer closes a final assistant message and opens a new turn; the Jinja continues it, "
        "so modelmint publishes this TEMPLATE with PARSER glimmer and names no RENDERER",
        "the Jinja renames 'Reasoning effort' to 'Reasoning strength' in a system prompt and skips its own "
        "reasoning line when the prompt states one; Go templates cannot replace or lower-case text, so Ollama "
        "prints the system prompt as written and always adds the line",
        "the Jinja takes a tool name's part before its first '.' as the tool's namespace; Go templates cannot "
        "split strings, so the TEMPLATE uses the whole name (the same for names without a '.')",
        "Ollama's think true and think 'medium' reach a TEMPLATE alike (ThinkLevel 'medium'): both give "
        "'Reasoning strength: high', the Jinja's default",
    ),
))
