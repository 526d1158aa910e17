"""Go TEMPLATE skeletons and snippets that several chat-family modules build from."""

# Each returns, to the byte, the text its families wrote out themselves (layout included: a TEMPLATE's text is what
# Ollama stores), so a family module names only what its template does differently.

from __future__ import annotations

from pipelines.chat.families.core import TemplateTokens
from pipelines.chat.families.helpers import _LOOP_HEAD, _fill, golit

# ---------------------------------------------------------------- Liquid LFM (ChatML, "List of tools: [...]")

_LFM_SKELETON = """
{{- $msgs := .Messages }}{{ $sys := "" }}{{ $hasSys := and $msgs (eq (index $msgs 0).Role "system") }}
{{- if $hasSys }}{{ $sys = (index $msgs 0).Content }}{{ end }}
«STATE»{{- «BOS» }}
{{- if or $sys .Tools }}<|im_start|>system{{ "\\n" }}{{ $sys }}
    {{- if .Tools }}{{ if $sys }}{{ "\\n" }}{{ end }}List of tools: «TOOLS»<|im_end|>{{ "\\n" }}
{{- end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if or $i (not $hasSys) }}<|im_start|>{{ .Role }}{{ "\\n" }}
        «MESSAGE»
        {{- $prev = .Role }}
    {{- end }}
{{- end }}
{{- if ne $prev "assistant" }}<|im_start|>assistant{{ "\\n" }}{{ end }}
"""

LFM_TOOL_LIST = '{{ range $j, $t := .Tools }}{{ if $j }}, {{ end }}{{ template "mm_tool" . }}{{ end }}'
"""The tools as the LFM Jinjas list them: each whole tool as JSON, joined by ', '."""


def last_index(var: str, role: str) -> str:
    """A TEMPLATE line setting $`var` to the index of the last message of `role` in $msgs (-1: none)."""
    return (f"{{{{- ${var} := -1 }}}}{{{{ range $i, $m := $msgs }}}}{{{{ if eq .Role {golit(role)[3:-3]} }}}}"
            f"{{{{ ${var} = $i }}}}{{{{ end }}}}{{{{ end }}}}")


def lfm_template(tokens: TemplateTokens, *, message: tuple[str, ...], last: tuple[str, str] | None = None,
                 tools: str = f"[{LFM_TOOL_LIST}]{{{{ end }}}}") -> str:
    """An LFM TEMPLATE: the first system message and the tools in one system turn ('List of tools: ' and `tools`, which
    closes the `if .Tools` it opens; by default the JSON list), then each other message as <|im_start|>role and the
    `message` lines (what follows the role line, up to and with its <|im_end|>; each starts with '{{-'), and the
    generation prompt. `last`: (variable, role) for the index of the last message of that role, where the message
    lines need it."""
    state = last_index(*last) + "\n" if last else ""
    return _fill(_LFM_SKELETON.replace("«STATE»", state), BOS=golit(tokens.bos_text)[3:-3], TOOLS=tools,
                 MESSAGE="\n        ".join(message), LOOP_HEAD=_LOOP_HEAD)


# ---------------------------------------------------------------- the Qwen lineage (<|im_start|>, $lastQuery, XML calls)

QUERY_LOOP = "\n".join((last_index("lastQuery", "user"), '{{- $prev := "" }}', "{{- range $i, $m := .Messages }}",
                        "    " + _LOOP_HEAD))
"""The message loop opened the way the Qwen-lineage TEMPLATEs open it: $lastQuery (the last user message, after which
reasoning is kept), $prev (the previous message's role, set at the end of each iteration) and the loop head."""


def chatml_query_loop(has_system: str) -> str:
    """The end of a ChatML system turn that holds the tools (the first system message alone when there are none, as
    its own turn, `has_system` telling whether there is one), then QUERY_LOOP."""
    return (f'{{{{- else if {has_system} }}}}<|im_start|>system{{{{ "\\n" }}}}{{{{ (index $msgs 0).Content }}}}'
            f'<|im_end|>{{{{ "\\n" }}}}\n{{{{- end }}}}\n{QUERY_LOOP}')


def xml_call(indent: int) -> str:
    """A tool call as the Qwen3.5 / Qwen3-Coder / Step 3.5 Jinjas write it (<tool_call>, <function=NAME>, one
    <parameter=KEY> a line holding the value through the family's mm_pystr), its lines after the first indented
    by `indent`."""
    return f"\n{' ' * indent}".join((
        '<tool_call>«NL»<function={{ .Function.Name }}>{{ "\\n" }}',
        '{{- range $k, $v := .Function.Arguments }}<parameter={{ $k }}>«NL»{{ template "mm_pystr" $v }}«NL»'
        "</parameter>«NL»{{ end }}",
        '{{- "</function>\\n</tool_call>" }}',
    ))


def chatml_tool_turn(*result: str) -> str:
    """A tool message's branch of a Qwen-lineage message loop and the loop's end: the `result` lines (each starting
    with '{{-': the opening of a run of tool messages and this result), the turn closed after the run's last result."""
    return "\n".join((
        '    {{- else if eq .Role "tool" }}',
        *(f"        {line}" for line in result),
        '        {{- if ne $next "tool" }}<|im_end|>{{ "\\n" }}{{ end }}',
        "    {{- end }}",
        "    {{- $prev = .Role }}",
        "{{- end }}",
    ))
