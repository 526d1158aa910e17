"""Cohere Command R7B (<|START_OF_TURN_TOKEN|>, a fixed system preamble, <|START_ACTION|> JSON tool calls).
"""

from __future__ import annotations

from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import _LOOP_HEAD, _fill, _has_all, golit
from pipelines.chat.gojson import json_defines

# ---------------------------------------------------------------- Command R7B (tool_use template)
#
# The preamble's fixed texts are taken from the Jinja itself: it is rendered once with marker values in the places
# the TEMPLATE fills (a tool's name, description and parameters, the developer preamble) and cut at the markers.

_MARK = "\x00mm{}\x00"


def _detect_command_r7b(src: str) -> bool:
    return _has_all(
        src, "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|># System Preamble", "tool_call_id_to_int", "format_tool_message",
        "<|START_ACTION|>", "<|START_TOOL_RESULT|>", "# Developer Preamble", "# Default Preamble",
        '"responses": null}', "{%- if not enable_thinking -%}<|START_THINKING|><|END_THINKING|>",
    )


def _preamble_parts(src: str) -> tuple[str, str, str, str]:
    """(head without tools, head before the tools, head after them, the developer preamble's heading): the texts
    the Jinja prints before the first turn."""
    from pipelines.chat.jinja import render

    end = "<|END_OF_TURN_TOKEN|>"
    user = [{"role": "user", "content": _MARK.format("U")}]
    plain = render(src, user, bos_token="", eos_token="")
    head = plain[:plain.index(end)]
    tool = {"type": "function", "function": {"name": _MARK.format("N"), "description": "d",
                                             "parameters": {"type": "object", "properties": {}}}}
    with_tools = render(src, user, tools=[tool], bos_token="", eos_token="")
    first = with_tools.index('    {"name": "' + _MARK.format("N"))
    after = with_tools.index('"responses": null}', first) + len('"responses": null}')
    before_tools, after_tools = with_tools[:first], with_tools[after:with_tools.index(end, after)]
    dev = render(src, [{"role": "system", "content": _MARK.format("S")}, *user], bos_token="", eos_token="")
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
    {{- range $i, $t := .Tools }}{{ if $i }},«NL»{{ end }}    {"name": "{{ .Function.Name }}", "description": "{{ .Function.Description }}", "parameters": {{ template "mm_params" .Function.Parameters }}, "responses": null}{{ end }}{{ «AFTER» }}
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
    {{- else if eq .Role "tool" }}
        {{- if ne $prev "tool" }}<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TOOL_RESULT|>[{{ "\\n" }}{{ else }},{{ "\\n" }}{{ end }}
        {{- $id := "" }}{{ $n := "" }}{{ $found := false }}
        {{- range $msgs }}{{ range .ToolCalls }}{{ if and (not $found) (eq .ID $m.ToolCallID) }}{{ $id = printf "%d" (len $n) }}{{ $found = true }}{{ end }}{{ $n = printf "%sx" $n }}{{ end }}{{ end }}
        {{- "    {\\n        \\"tool_call_id\\": \\"" }}{{ $id }}{{ "\\",\\n        \\"results\\": {\\n            \\"0\\": " }}{{ printf "%q" .Content }}
        {{- "\\n        },\\n        \\"is_error\\": null\\n    }" }}
        {{- if ne $next "tool" }}{{ "\\n" }}]<|END_TOOL_RESULT|><|END_OF_TURN_TOKEN|>{{ end }}
    {{- end }}
    {{- /* Never renders: the last {{ .Thinking }} of the loop, between the thinking tags Ollama reads from it. */}}
    {{- if false }}<|START_THINKING|>{{ .Thinking }}<|END_THINKING|>{{ end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{{ if not .Think }}<|START_THINKING|><|END_THINKING|>{{ end }}{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        HEAD=golit(head)[3:-3],
        BEFORE=golit(before_tools)[3:-3],
        AFTER=golit(after_tools)[3:-3],
        DEV=golit(dev_heading)[3:-3],
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
