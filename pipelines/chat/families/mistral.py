"""Mistral: [INST] (Nemo's [AVAILABLE_TOOLS]) and Mistral Small 3.2 / Devstral / Ministral 3
([SYSTEM_PROMPT]).
"""

from __future__ import annotations

from typing import Any

from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import _LOOP_HEAD, _fill, _has_all, _has_none, _jinja_assignment, golit
from pipelines.chat.gojson import json_defines

# ---------------------------------------------------------------- Mistral [INST] (Nemo: [AVAILABLE_TOOLS])


def _detect_mistral(src: str) -> bool:
    return _has_all(
        src, "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[TOOL_RESULTS]",
        'loop.last and system_message is defined', '{"type": "function", "function": {',
        "tool_call.function|tojson", '{"content": ',
    ) and _has_none(src, "[SYSTEM_PROMPT]", "[THINK]", "[ARGS]", "[CALL_ID]")


def _build_mistral(src: str, tokens: TemplateTokens) -> str:
    eos = golit(tokens.eos or "</s>")
    return json_defines() + _fill(
        """
{{- $msgs := .Messages }}{{ $sys := "" }}{{ $hasSys := false }}
{{- if and $msgs (eq (index $msgs 0).Role "system") }}{{ $sys = (index $msgs 0).Content }}{{ $hasSys = true }}{{ $msgs = slice $msgs 1 }}{{ end }}
{{- $lastUser := -1 }}{{ range $i, $m := $msgs }}{{ if eq .Role "user" }}{{ $lastUser = $i }}{{ end }}{{ end }}
{{- «BOS» }}
{{- $prev := "" }}
{{- range $i, $m := $msgs }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}
        {{- if and $.Tools (eq $i $lastUser) }}[AVAILABLE_TOOLS][
            {{- range $j, $t := $.Tools }}{{ if $j }}, {{ end }}
                {{- "{\\"type\\": \\"function\\", \\"function\\": {\\"name\\": \\"" }}{{ .Function.Name }}{{ "\\"" }}
                {{- if .Function.Description }}{{ ", \\"description\\": \\"" }}{{ .Function.Description }}{{ "\\"" }}{{ end }}
                {{- ", \\"parameters\\": " }}{{ template "mm_params" .Function.Parameters }}{{ "}}" }}
            {{- end }}][/AVAILABLE_TOOLS]
        {{- end }}
        {{- if and $last $hasSys }}[INST]{{ $sys }}{{ "\\n\\n" }}{{ .Content }}[/INST]{{ else }}[INST]{{ .Content }}[/INST]{{ end }}
    {{- else if .ToolCalls }}[TOOL_CALLS][
        {{- range $j, $c := .ToolCalls }}{{ if $j }}, {{ end }}
            {{- "{\\"name\\": " }}{{ printf "%q" .Function.Name }}{{ ", \\"arguments\\": " }}
            {{- template "mm_args" .Function.Arguments }}{{ ", \\"id\\": \\"" }}{{ .ID }}{{ "\\"}" }}
        {{- end }}]«EOS»
    {{- else if eq .Role "assistant" }}{{ .Content }}{{ if not $last }}«EOS»{{ end }}
    {{- else if eq .Role "tool" }}[TOOL_RESULTS]{{ "{\\"content\\": " }}{{ .Content }}{{ ", \\"call_id\\": \\"" }}
        {{- .ToolCallID }}{{ "\\"}" }}[/TOOL_RESULTS]
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        EOS=eos,
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="mistral",
    title="Mistral [INST] with [AVAILABLE_TOOLS] / [TOOL_CALLS] / [TOOL_RESULTS] (Mistral Nemo)",
    detect=_detect_mistral,
    build=_build_mistral,
    stop=("[INST]", "[/INST]"),
    markers=("[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[TOOL_RESULTS]",
             "loop.last and system_message is defined"),
    tool_calls="TEMPLATE: Ollama's tool parser reads the [TOOL_CALLS][ tag from the TEMPLATE",
    bos_in_template=True,
    notes=(
        "the Jinja puts the system prompt into the last user turn only when that turn ends the conversation; "
        "the TEMPLATE does the same (so a system prompt is invisible when continuing an assistant message)",
        "the Jinja places [AVAILABLE_TOOLS] before every user message equal to the last one; the TEMPLATE "
        "before the last user message only",
    ),
))


# ---------------------------------------------------------------- Mistral Small 3.2 / Devstral / Ministral 3 ([SYSTEM_PROMPT])


def _concat_parts(node: Any) -> list[str | None] | None:
    """A Jinja expression of string constants joined with + or ~ as its parts; None stands for a variable
    (the date), and the whole is None when anything else appears."""
    from jinja2 import nodes

    if isinstance(node, nodes.Const) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, nodes.Name):
        return [None]
    if isinstance(node, (nodes.Add, nodes.Concat)):
        parts = [node.left, node.right] if isinstance(node, nodes.Add) else list(node.nodes)
        out: list[str | None] = []
        for part in parts:
            sub = _concat_parts(part)
            if sub is None:
                return None
            out += sub
        return out
    return None


def _mistral3_default(src: str) -> str | None:
    """The default system prompt as Go template text (the date as currentDate), read from the Jinja."""
    node = _jinja_assignment(src, "default_system_message")
    parts = _concat_parts(node) if node is not None else None
    if not parts or parts.count(None) > ('set today = strftime_now("%Y-%m-%d")' in src):
        return None
    return "".join("{{ currentDate }}" if p is None else golit(p) for p in parts)


_MISTRAL3_VARIANTS: dict[str, tuple[str, ...]] = {
    # variant → texts of its Jinja that identify it
    "small": ("You are Mistral Small 3", "[CALL_ID]", "message == user_messages[-1]", "[TOOL_CONTENT]",
              'set today = strftime_now("%Y-%m-%d")', "conversation roles must alternate"),
    "devstral": ("You are Devstral", "Edits made by Unsloth", "\"[TOOL_CALLS]\" + tool['function']['name'] + \"[ARGS]\"",
                 "\"[TOOL_RESULTS]\" + content|string + \"[/TOOL_RESULTS]\""),
    "ministral": ("# HOW YOU SHOULD THINK AND ANSWER", "'[THINK]' + block['thinking'] + '[/THINK]'",
                  "name + '[ARGS]' + arguments", "'[TOOL_RESULTS]' + message['content']|string + '[/TOOL_RESULTS]'",
                  "Only user, assistant and tool roles are supported"),
}


def _mistral3_variant(src: str) -> str | None:
    if not _has_all(src, "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[AVAILABLE_TOOLS]", "[INST]", "[/INST]",
                    "[TOOL_CALLS]", "[ARGS]", "[TOOL_RESULTS]", "bos_token", "eos_token") \
            or _mistral3_default(src) is None:
        return None
    hits = [v for v, needles in _MISTRAL3_VARIANTS.items() if _has_all(src, *needles)]
    return hits[0] if len(hits) == 1 else None


_MISTRAL3_TOOLS = (
    "[AVAILABLE_TOOLS][{{ range $j, $t := $.Tools }}{{ if $j }}, {{ end }}{{ template \"mm_tool\" . }}{{ end }}]"
    "[/AVAILABLE_TOOLS]"
)


def _build_mistral3(src: str, tokens: TemplateTokens) -> str:
    variant = _mistral3_variant(src)
    assert variant is not None
    small = variant == "small"
    eos = golit(tokens.eos or "</s>")
    args = '[ARGS]{{ template "mm_args" .Function.Arguments }}'
    if small:
        assistant = ('{{ if .ToolCalls }}{{ range .ToolCalls }}[TOOL_CALLS]{{ .Function.Name }}[CALL_ID]{{ .ID }}'
                     + args + '{{ end }}«EOS»{{ else }}{{ .Content }}{{ if not $last }}«EOS»{{ end }}{{ end }}')
        result = "[TOOL_RESULTS]{{ .ToolCallID }}[TOOL_CONTENT]{{ .Content }}[/TOOL_RESULTS]"
    else:
        assistant = ('{{ .Content }}{{ if .ToolCalls }}{{ range .ToolCalls }}[TOOL_CALLS]{{ .Function.Name }}' + args
                     + '{{ end }}{{ end }}{{ if not (and $last (not $m.ToolCalls)) }}«EOS»{{ end }}')
        result = "[TOOL_RESULTS]{{ .Content }}[/TOOL_RESULTS]"
    return json_defines() + _fill(
        """
{{- $msgs := .Messages }}{{ $sys := "" }}{{ $hasSys := false }}
{{- if and $msgs (eq (index $msgs 0).Role "system") }}{{ $hasSys = true }}{{ $sys = (index $msgs 0).Content }}{{ end }}
{{- $lastUser := -1 }}{{ range $i, $m := $msgs }}{{ if eq .Role "user" }}{{ $lastUser = $i }}{{ end }}{{ end }}
{{- «BOS» }}[SYSTEM_PROMPT]{{ if $hasSys }}{{ $sys }}{{ else }}«DEFAULT»{{ end }}[/SYSTEM_PROMPT]
{{- if .Tools }}«TOOLS_TOP»{{ end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}{{ if and $.Tools (eq $i $lastUser) }}«TOOLS_USER»{{ end }}[INST]{{ .Content }}[/INST]
    {{- else if and (eq .Role "system") $i }}«LATER_SYSTEM»
    {{- else if eq .Role "assistant" }}«ASSISTANT»
    {{- else if eq .Role "tool" }}«RESULT»
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        DEFAULT=_mistral3_default(src) or "",
        TOOLS_TOP="" if small else _MISTRAL3_TOOLS,
        TOOLS_USER=_MISTRAL3_TOOLS if small else "",
        LATER_SYSTEM="" if variant == "ministral" else "[SYSTEM_PROMPT]{{ .Content }}[/SYSTEM_PROMPT]",
        ASSISTANT=assistant,
        RESULT=result,
        LOOP_HEAD=_LOOP_HEAD,
        EOS=eos,
    )


_MISTRAL3_MARKERS = ("[SYSTEM_PROMPT]", "[AVAILABLE_TOOLS]", "[INST]", "[TOOL_CALLS]", "[ARGS]", "[TOOL_RESULTS]")

register(ChatFamily(
    name="mistral3",
    title="Mistral Small 3.2 and Devstral Small ([SYSTEM_PROMPT] with a default prompt, [TOOL_CALLS]…[ARGS])",
    detect=lambda src: _mistral3_variant(src) in ("small", "devstral"),
    build=_build_mistral3,
    stop=("[INST]", "[/INST]"),
    bos_in_template=True,
    content_none_ok=False,
    markers=_MISTRAL3_MARKERS,
    tool_calls="TEMPLATE: Ollama's tool parser reads the [TOOL_CALLS] tag from the TEMPLATE",
    notes=(
        "Mistral Small 3.2's Jinja places [AVAILABLE_TOOLS] before every user message equal to the last one; the "
        "TEMPLATE before the last user message only",
        "Mistral Small 3.2's Jinja raises unless user and assistant turns alternate; the TEMPLATE renders any order",
        "Devstral's Jinja fails on a tool-call message whose content is None; Ollama's contents are always strings",
    ),
))

register(ChatFamily(
    name="ministral3",
    title="Ministral 3 Reasoning ([SYSTEM_PROMPT], [THINK] reasoning, [TOOL_CALLS]…[ARGS]; PARSER ministral)",
    detect=lambda src: _mistral3_variant(src) == "ministral",
    build=_build_mistral3,
    stop=("[INST]", "[/INST]"),
    bos_in_template=True,
    content_none_ok=False,
    markers=(*_MISTRAL3_MARKERS, "[THINK]"),
    parser="ministral",
    tool_calls="PARSER ministral returns structured tool_calls and the [THINK] reasoning",
    notes=(
        "the Jinja prints [THINK] reasoning only from structured content chunks, never from Ollama's .Thinking; "
        "reasoning in the history is dropped",
        "the Jinja raises on a system message after the first and on an empty assistant message; the TEMPLATE "
        "skips the one and prints the other",
    ),
))
