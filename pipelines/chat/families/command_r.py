"""Cohere Command R7B (<|START_OF_TURN_TOKEN|>, a fixed system preamble, <|START_ACTION|> JSON tool calls).
"""

from __future__ import annotations

from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import _LOOP_HEAD, _fill, _has_all, _render_marked, golit
from pipelines.chat.gojson import json_defines

# ---------------------------------------------------------------- Command R7B (tool_use template)
#
# The preamble's fixed texts are taken from the Jinja itself: it is rendered once with marker values in the places
# the TEMPLATE fills (a tool's name, description and parameters, the developer preamble) and cut at the markers.

_MARK = "\x00mm{}\x00"


# The tools as Command R7B and Cohere2 list them (after `range $i, $t := .Tools`): one JSON object a line.
_TOOL_LIST = ('{{ if $i }},«NL»{{ end }}    {"name": "{{ .Function.Name }}", "description": "{{ .Function.Description }}", '
              '"parameters": {{ template "mm_params" .Function.Parameters }}, "responses": null}{{ end }}')


def _tool_turn(result_open: str = "", result_close: str = "") -> str:
    """The TEMPLATE lines of a tool message and the end of the message loop, as Command R7B and Cohere2 write them: one
    <|START_TOOL_RESULT|> list per run of tool messages, each result under its call's position among all calls of the
    conversation, its content (as a JSON string) between `result_open` and `result_close`."""
    return (
        """
    {{- else if eq .Role "tool" }}
        {{- if ne $prev "tool" }}<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TOOL_RESULT|>[{{ "\\n" }}{{ else }},{{ "\\n" }}{{ end }}
        {{- $id := "" }}{{ $n := "" }}{{ $found := false }}
        {{- range $msgs }}{{ range .ToolCalls }}{{ if and (not $found) (eq .ID $m.ToolCallID) }}{{ $id = printf "%d" (len $n) }}{{ $found = true }}{{ end }}{{ $n = printf "%sx" $n }}{{ end }}{{ end }}
        {{- "    {\\n        \\"tool_call_id\\": \\"" }}{{ $id }}{{ "\\",\\n        \\"results\\": {\\n            \\"0\\": «OPEN»" }}{{ printf "%q" .Content }}
        {{- "«CLOSE»\\n        },\\n        \\"is_error\\": null\\n    }" }}
        {{- if ne $next "tool" }}{{ "\\n" }}]<|END_TOOL_RESULT|><|END_OF_TURN_TOKEN|>{{ end }}
    {{- end }}
    {{- /* Never renders: the last {{ .Thinking }} of the loop, between the thinking tags Ollama reads from it. */}}
    {{- if false }}<|START_THINKING|>{{ .Thinking }}<|END_THINKING|>{{ end }}
    {{- $prev = .Role }}
{{- end }}"""
        .strip("\n").replace("«OPEN»", result_open).replace("«CLOSE»", result_close)
    )


def _detect_command_r7b(src: str) -> bool:
    return _has_all(
        src, "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|># System Preamble", "tool_call_id_to_int", "format_tool_message",
        "<|START_ACTION|>", "<|START_TOOL_RESULT|>", "# Developer Preamble", "# Default Preamble",
        '"responses": null}', "{%- if not enable_thinking -%}<|START_THINKING|><|END_THINKING|>",
    )


def _preamble_parts(src: str) -> tuple[str, str, str, str]:
    """(head without tools, head before the tools, head after them, the developer preamble's heading): the texts
    the Jinja prints before the first turn."""
    end = "<|END_OF_TURN_TOKEN|>"
    user = [{"role": "user", "content": _MARK.format("U")}]
    plain = _render_marked(src, user, bos_token="", eos_token="")
    head = plain[:plain.index(end)]
    tool = {"type": "function", "function": {"name": _MARK.format("N"), "description": "d",
                                             "parameters": {"type": "object", "properties": {}}}}
    with_tools = _render_marked(src, user, tools=[tool], bos_token="", eos_token="")
    first = with_tools.index('    {"name": "' + _MARK.format("N"))
    after = with_tools.index('"responses": null}', first) + len('"responses": null}')
    before_tools, after_tools = with_tools[:first], with_tools[after:with_tools.index(end, after)]
    dev = _render_marked(src, [{"role": "system", "content": _MARK.format("S")}, *user], bos_token="", eos_token="")
    dev_heading = dev[len(head):dev.index(_MARK.format("S"))]
    return head, before_tools, after_tools, dev_heading


def _build_command_r7b(src: str, tokens: TemplateTokens) -> str:
    head, before_tools, after_tools, dev_heading = _preamble_parts(src)
    # A tool result names its call by that call's position among all calls of the conversation (counted as the
    # length of a string grown by one letter per call: Go templates have no arithmetic).
    return json_defines() + _fill(
        """
{{- $msgs := .Messages }}{{ $dev := "" }}{{ if and $msgs (eq (index $msgs 0).Role "system") }}{{ $dev = (index $msgs 0).Content }}{{ end }}
{{- «BOS» }}
{{- if .Tools }}{{ «BEFORE» }}
    {{- range $i, $t := .Tools }}«TOOL_LIST»{{ «AFTER» }}
{{- else }}{{ «HEAD» }}
{{- end }}
{{- if $dev }}{{ «DEV» }}{{ $dev }}{{ end }}<|END_OF_TURN_TOKEN|>
{{- $calls := "" }}{{ $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "system" }}{{ if or $i (not $dev) }}<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>{{ .Content }}<|END_OF_TURN_TOKEN|>{{ end }}
    {{- else if eq .Role "user" }}<|START_OF_TURN_TOKEN|><|USER_TOKEN|>{{ .Content }}<|END_OF_TURN_TOKEN|>
    {{- else if and (eq .Role "assistant") .ToolCalls }}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|>{{ .Thinking }}<|END_THINKING|><|START_ACTION|>[{{ "\\n" }}
        {{- range $j, $c := .ToolCalls }}{{ if $j }},{{ "\\n" }}{{ end }}    {"tool_call_id": "{{ len $calls }}", "tool_name": "{{ .Function.Name }}", "parameters": {{ template "mm_args" .Function.Arguments }}}
            {{- $calls = printf "%sx" $calls }}
        {{- end }}{{ "\\n" }}]<|END_ACTION|><|END_OF_TURN_TOKEN|>
    {{- else if eq .Role "assistant" }}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_RESPONSE|>{{ .Content }}
        {{- if not $last }}<|END_RESPONSE|><|END_OF_TURN_TOKEN|>{{ end }}
«TOOL_TURN»
{{- if ne $prev "assistant" }}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{{ if not .Think }}<|START_THINKING|><|END_THINKING|>{{ end }}{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        HEAD=golit(head)[3:-3],
        BEFORE=golit(before_tools)[3:-3],
        AFTER=golit(after_tools)[3:-3],
        DEV=golit(dev_heading)[3:-3],
        TOOL_LIST=_TOOL_LIST,
        TOOL_TURN=_tool_turn(),
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="command-r7b",
    title="Cohere Command R7B (<|START_OF_TURN_TOKEN|>, fixed preamble, <|START_ACTION|> JSON tool calls)",
    detect=_detect_command_r7b,
    build=_build_command_r7b,
    stop=("<|END_OF_TURN_TOKEN|>",),
    bos_in_template=True,
    thinking=True,
    reasoning_key="reasoning_content",
    markers=("<|START_OF_TURN_TOKEN|>", "<|SYSTEM_TOKEN|>", "<|START_ACTION|>", "<|START_TOOL_RESULT|>",
             "# System Preamble", "tool_call_id_to_int"),
    tool_calls=("none structured: the calls are a JSON list of {\"tool_call_id\", \"tool_name\", \"parameters\"} after "
                "<|START_ACTION|>, in which Ollama's tool parser (the tag it reads from the TEMPLATE) finds none; "
                "Ollama ships no PARSER for Command R7B"),
    notes=(
        "the Jinja prints a tool's description as it is between quotes; so does the TEMPLATE (a description with a "
        "'\"' prints it unescaped in both)",
        "documents and enable_citations are not Ollama settings: the TEMPLATE follows their absence",
        "the Jinja always ends with the chatbot turn, even after a final assistant message; Ollama continues that "
        "message instead (the proof compares the continuation transformers cuts)",
    ),
))


# ---------------------------------------------------------------- Command R+ (tool_use template: Python signatures)

# json_to_python_type of the Jinja: an array's `json_spec.items` is the dict's items method, whose type is undefined
# and so iterable and empty: every array prints as List[Union[]], every object as Dict[str, Union[]].
_CR_PYTYPE = (
    '{{- define "mm_crtype" }}{{ if eq (len .Type) 1 }}{{ template "mm_crtype1" index .Type 0 }}{{ else if .Type }}'
    'Union[{{ range $i, $t := .Type }}{{ if $i }},{{ end }}{{ template "mm_crtype1" $t }}{{ end }}]'
    '{{ else }}Union[]{{ end }}{{ end }}\n'
    '{{- define "mm_crtype1" }}{{ if eq . "string" }}str{{ else if eq . "number" }}float{{ else if eq . "integer" }}'
    'int{{ else if eq . "boolean" }}bool{{ else if eq . "array" }}List[Union[]]{{ else if eq . "object" }}'
    'Dict[str, Union[]]{{ else }}Union[]{{ end }}{{ end }}\n'
)


def _detect_command_r_plus(src: str) -> bool:
    return _has_all(
        src, "macro json_to_python_type(json_spec)", "macro new_tool_parser(tools)", "macro old_tool_parser(tools)",
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>", "# Safety Preamble", "# User Preamble", "## Available Tools",
        "\\nAction:\\n```json\\n[\\n", "tool_call.arguments|tojson(indent=4)|indent(8)", "<results>",
        "Write \\'Action:\\' followed by a json-formatted list of actions",
    )


def _command_r_plus_parts(src: str) -> tuple[str, str, str, str]:
    """(the preamble before the system text, the default system text, the tools heading, the closing instruction
    turn), cut out of the Jinja rendered with marker values."""
    end = "<|END_OF_TURN_TOKEN|>"
    tool = {"type": "function", "function": {"name": _MARK.format("N"), "description": "d",
                                             "parameters": {"type": "object", "properties": {}}}}
    user = {"role": "user", "content": _MARK.format("U")}
    with_sys = _render_marked(src, [{"role": "system", "content": _MARK.format("S")}, user], tools=[tool], bos_token="")
    pre = with_sys[:with_sys.index(_MARK.format("S"))]
    tools_head = with_sys[with_sys.index(_MARK.format("S")) + len(_MARK.format("S")):
                          with_sys.index("```python\ndef " + _MARK.format("N"))]
    after_user = with_sys.index(end, with_sys.index(_MARK.format("U"))) + len(end)
    instruction = with_sys[after_user:with_sys.rindex("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")]
    plain = _render_marked(src, [user], tools=[tool], bos_token="")
    default_system = plain[len(pre):plain.index(tools_head)]
    return pre, default_system, tools_head, instruction


def _build_command_r_plus(src: str, tokens: TemplateTokens) -> str:
    pre, default_system, tools_head, instruction = _command_r_plus_parts(src)
    return json_defines(indent=True) + _CR_PYTYPE + _fill(
        """
{{- $msgs := .Messages }}{{ $hasSys := and $msgs (eq (index $msgs 0).Role "system") }}
{{- «BOS» }}{{ «PRE» }}{{ if $hasSys }}{{ (index $msgs 0).Content }}{{ else }}{{ «DEFAULT» }}{{ end }}{{ «TOOLS_HEAD» }}
{{- range $ti, $t := .Tools }}{{ if $ti }}{{ "\\n\\n" }}{{ end }}
    {{- with .Function }}{{ $params := .Parameters }}```python«NL»def {{ .Name }}(
        {{- $first := true }}{{ range $k, $v := .Parameters.Properties }}{{ if not $first }}, {{ end }}{{ $first = false }}{{ $k }}{{ ": " }}
            {{- $req := false }}{{ range $params.Required }}{{ if eq . $k }}{{ $req = true }}{{ end }}{{ end }}
            {{- if $req }}{{ template "mm_crtype" $v }}{{ else }}Optional[{{ template "mm_crtype" $v }}] = None{{ end }}
        {{- end }}) -> List[Dict]:«NL»    \"\"\"{{ .Description }}
        {{- if .Parameters.Properties }}{{ "\\n\\n    Args:\\n        " }}
            {{- $first = true }}{{ range $k, $v := .Parameters.Properties }}{{ if not $first }}«NL»        {{ end }}{{ $first = false }}{{ $k }} (
                {{- $req := false }}{{ range $params.Required }}{{ if eq . $k }}{{ $req = true }}{{ end }}{{ end }}
                {{- if $req }}{{ template "mm_crtype" $v }}{{ else }}Optional[{{ template "mm_crtype" $v }}]{{ end }}): {{ $v.Description }}
            {{- end }}
        {{- end }}«NL»    \"\"\"«NL»    pass«NL»```
    {{- end }}
{{- end }}<|END_OF_TURN_TOKEN|>
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if or $i (not $hasSys) }}
        {{- if eq .Role "user" }}<|START_OF_TURN_TOKEN|><|USER_TOKEN|>{{ .Content }}<|END_OF_TURN_TOKEN|>
        {{- else if eq .Role "system" }}<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>{{ .Content }}<|END_OF_TURN_TOKEN|>
        {{- else if and (eq .Role "assistant") .ToolCalls }}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{{ .Content }}«NL»Action:«NL»```json«NL»[{{ "\\n" }}
            {{- range $j, $c := .ToolCalls }}{{ if $j }},{{ "\\n" }}{{ end }}    {«NL»        "tool_name": "{{ .Function.Name }}",«NL»        "parameters": {{ if .Function.Arguments }}{{ "{" }}{{ $first := true }}
                    {{- range $k, $v := .Function.Arguments }}{{ if not $first }},{{ end }}{{ $first = false }}«NL»            {{ printf "%q" $k }}: {{ template "mm_json_i3" $v }}{{ end }}«NL»        {{ "}" }}{{ "\\n" }}
                {{- else }}{}«NL»{{ end }}    }
            {{- end }}«NL»]```{{ "\\n" }}
        {{- else if eq .Role "assistant" }}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{{ .Content }}
            {{- if not $last }}<|END_OF_TURN_TOKEN|>{{ end }}
        {{- else if eq .Role "tool" }}<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><results>«NL»{{ .Content }}</results><|END_OF_TURN_TOKEN|>
        {{- end }}
        {{- $prev = .Role }}
    {{- end }}
{{- end }}
{{- if ne $prev "assistant" }}{{ «INSTRUCTION» }}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        PRE=golit(pre)[3:-3],
        DEFAULT=golit(default_system)[3:-3],
        TOOLS_HEAD=golit(tools_head)[3:-3],
        INSTRUCTION=golit(instruction)[3:-3],
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="command-r-plus",
    title="Cohere Command R+ tool use (<|START_OF_TURN_TOKEN|>, tools as Python signatures, Action: JSON list)",
    detect=_detect_command_r_plus,
    build=_build_command_r_plus,
    stop=("<|END_OF_TURN_TOKEN|>",),
    bos_in_template=True,
    content_none_ok=False,
    markers=("<|START_OF_TURN_TOKEN|>", "<|SYSTEM_TOKEN|>", "# Safety Preamble", "json_to_python_type",
             "Action:", "<results>"),
    tool_calls=("none structured: the calls are an 'Action:' ```json list of {\"tool_name\", \"parameters\"}; "
                "Ollama's tool parser waits for the text the TEMPLATE opens a tool-call turn with "
                "(<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>), which the model's own turn does not repeat, and Ollama "
                "ships no PARSER for Command R+"),
    notes=(
        "the Jinja iterates the tools unconditionally and fails without them (transformers refuses every "
        "conversation without tools); the TEMPLATE renders those with an empty tool list",
        "the Jinja trims message contents (| trim); Go templates cannot",
        "json_to_python_type prints every array as List[Union[]] and every object as Dict[str, Union[]] (the Jinja "
        "reads the schema dict's items method); the TEMPLATE does the same",
        "the Jinja always closes with its 'Write Action:' system turn, even after a final assistant message; "
        "Ollama continues that message instead (the proof compares the continuation transformers cuts)",
    ),
))


# ---------------------------------------------------------------- Cohere Command A 2026 / North (Cohere2 MoE)
#
# Ollama has a RENDERER cohere for these models, but it leaves the Jinja's platform instructions to a Modelfile SYSTEM
# and Ollama does not set it itself for any GGUF architecture (server/create.go:795-817 names gemma4, laguna and
# nemotron_h only), so a TEMPLATE renders the Jinja instead. The platform turn is taken from the Jinja rendered with
# a marker user message, and cut where the tool list goes.


def _detect_cohere2(src: str) -> bool:
    return _has_all(
        src, "<|START_OF_TURN_TOKEN|>", "<|START_TEXT|>", "<|START_THINKING|>", "<|START_ACTION|>",
        "<|START_TOOL_RESULT|>", "platform_instruction_override", "tool_call_id_to_int", "format_tool_message",
        '"responses": null}', "<|START_THINKING|><|END_THINKING|>",
    )


def _cohere2_parts(src: str) -> tuple[str, str]:
    """(the platform turn up to the tool list's '[' and line break, the rest of it after the tools): what the Jinja
    prints before the first message."""
    plain = _render_marked(src, [{"role": "user", "content": _MARK.format("U")}], bos_token="", eos_token="")
    head = plain[:plain.index("<|START_OF_TURN_TOKEN|><|USER_TOKEN|>")]
    cut = head.index("[\n\n]") + 2
    return head[:cut], head[cut:]


def _build_cohere2(src: str, tokens: TemplateTokens) -> str:
    before_tools, after_tools = _cohere2_parts(src)
    # Tool-call ids are positions among all calls of the conversation (the length of a string grown by one letter
    # per call: Go templates have no arithmetic), as the Jinja's regen_tool_call_ids writes them.
    return json_defines() + _fill(
        """
{{- $msgs := .Messages }}
{{- «BOS» }}{{ «BEFORE» }}
{{- range $i, $t := .Tools }}«TOOL_LIST»
{{- «AFTER» }}
{{- $calls := "" }}{{ $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "system" }}<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TEXT|>{{ .Content }}<|END_TEXT|><|END_OF_TURN_TOKEN|>
    {{- else if eq .Role "user" }}<|START_OF_TURN_TOKEN|><|USER_TOKEN|><|START_TEXT|>{{ .Content }}<|END_TEXT|><|END_OF_TURN_TOKEN|>
    {{- else if and (eq .Role "assistant") .ToolCalls }}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>
        {{- if .Thinking }}<|START_THINKING|>{{ .Thinking }}<|END_THINKING|>{{ end }}<|START_ACTION|>[
        {{- range $j, $c := .ToolCalls }}{{ if $j }},{{ end }}{{ "\\n" }}    {"tool_call_id": "{{ len $calls }}", "tool_name": "{{ .Function.Name }}", "parameters": {{ template "mm_args" .Function.Arguments }}}
            {{- $calls = printf "%sx" $calls }}
        {{- end }}{{ "\\n" }}]<|END_ACTION|><|END_OF_TURN_TOKEN|>
    {{- else if eq .Role "assistant" }}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>
        {{- if .Thinking }}<|START_THINKING|>{{ .Thinking }}<|END_THINKING|>{{ end }}<|START_TEXT|>{{ .Content }}
        {{- if not $last }}<|END_TEXT|><|END_OF_TURN_TOKEN|>{{ end }}
«TOOL_TURN»
{{- if ne $prev "assistant" }}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|>{{ if and .IsThinkSet (not .Think) }}<|END_THINKING|>{{ end }}{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        BEFORE=golit(before_tools)[3:-3],
        AFTER=golit(after_tools)[3:-3],
        TOOL_LIST=_TOOL_LIST,
        TOOL_TURN=_tool_turn('{\\"content\\": ', "}"),
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="cohere2",
    title="Cohere Command A 2026 / North (Cohere2 MoE: platform instructions, <|START_TEXT|>, <|START_ACTION|>)",
    detect=_detect_cohere2,
    build=_build_cohere2,
    stop=("<|END_OF_TURN_TOKEN|>",),
    bos_in_template=True,
    thinking=True,
    reasoning_key="reasoning_content",
    think_variable="reasoning",
    markers=("<|START_OF_TURN_TOKEN|>", "<|START_TEXT|>", "<|START_THINKING|>", "<|START_ACTION|>",
             "<|START_TOOL_RESULT|>", "platform_instruction_override"),
    tool_calls=("none structured: the calls are a JSON list of {\"tool_call_id\", \"tool_name\", \"parameters\"} after "
                "<|START_ACTION|>; Ollama's tool parser waits for the text the TEMPLATE opens a tool-call turn with "
                "(<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>), which the model's own turn does not repeat, and would "
                "find no \"name\" in them; Ollama's PARSER cohere reads this format, but modelmint has not checked "
                "it, so it names none"),
    notes=(
        "the TEMPLATE writes the Jinja's own platform instructions; Ollama's RENDERER cohere, which leaves them to a "
        "Modelfile SYSTEM, is not used (Ollama does not set it itself for any GGUF architecture)",
        "the Jinja prints a tool's description as it is between quotes; so does the TEMPLATE (a description with a "
        "'\"' prints it unescaped in both)",
        "documents, grounding, response_format, developer_instruction, skip_thinking and a "
        "platform_instruction_override are not Ollama settings: the TEMPLATE follows their defaults",
        "the Jinja's reasoning switch follows Ollama's think setting (false: an empty thinking block; true or unset: "
        "an open one); a think level is taken as true, where the Jinja reads reasoning_effort 'none' as false",
        "a tool result whose tool_call_id an earlier result of the same run already used is dropped by the Jinja; "
        "the TEMPLATE prints every result",
    ),
))
