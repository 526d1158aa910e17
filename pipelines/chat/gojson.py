"""Go-template definitions that print Ollama's tool data as Python's json.dumps does, for TEMPLATE parity.

Hugging Face templates print tools and tool-call arguments with `tojson` (Python's json.dumps, ", " and
": " separators or an indent, non-ASCII kept). Ollama's `json` function prints Go's compact JSON with
HTML escaping, so a TEMPLATE that must match byte for byte prints them itself with these `define`d
templates. What Ollama's data model makes impossible to reproduce, and so differs from transformers:
object keys of `properties` and of tool-call `arguments` come in sorted order (they are Go maps in
Ollama); a property's keys come in the order `anyOf, type, items, enum, description` (the order
transformers' `get_json_schema` writes), other schema keys (nested `properties`, `nullable`, …) are
dropped by Ollama's API before the template sees them; numbers print as Go's JSON does (20.0 → 20);
strings are quoted with Go's %q, equal to json.dumps(ensure_ascii=False) for printable text, quotes,
backslashes, newlines, tabs and carriage returns.
"""

from __future__ import annotations

import re

_DEPTH = 8  # deepest nesting printed with an indent; deeper values fall back to the compact form


def _q(text: str) -> str:
    """A Go template string literal printing `text` (for indentation and punctuation)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return '{{ "' + escaped + '" }}'


def _compact_defines() -> str:
    """mm_json (any JSON value), mm_args (tool-call arguments), mm_prop, mm_params, mm_tool."""
    return (
        '{{- define "mm_json" }}{{ $t := printf "%T" . }}'
        '{{- if eq $t "string" }}{{ printf "%q" . }}'
        '{{- else if eq $t "map[string]interface {}" }}{{ "{" }}{{ $first := true }}'
        '{{- range $k, $v := . }}{{ if not $first }}, {{ end }}{{ $first = false }}'
        '{{ printf "%q" $k }}: {{ template "mm_json" $v }}{{ end }}{{ "}" }}'
        '{{- else if eq $t "[]interface {}" }}[{{ range $i, $v := . }}{{ if $i }}, {{ end }}'
        '{{ template "mm_json" $v }}{{ end }}]'
        '{{- else }}{{ json . }}{{ end }}{{ end }}'
        '{{- define "mm_args" }}{{ "{" }}{{ $first := true }}{{ range $k, $v := . }}'
        '{{ if not $first }}, {{ end }}{{ $first = false }}{{ printf "%q" $k }}: {{ template "mm_json" $v }}'
        '{{ end }}{{ "}" }}{{ end }}'
        '{{- define "mm_type" }}{{ if eq (len .) 1 }}{{ printf "%q" (index . 0) }}{{ else }}['
        '{{ range $i, $t := . }}{{ if $i }}, {{ end }}{{ printf "%q" $t }}{{ end }}]{{ end }}{{ end }}'
        '{{- define "mm_prop" }}{{ "{" }}{{ $sep := "" }}'
        '{{- if .AnyOf }}{{ $sep }}"anyOf": [{{ range $i, $a := .AnyOf }}{{ if $i }}, {{ end }}'
        '{{ template "mm_prop" $a }}{{ end }}]{{ $sep = ", " }}{{ end }}'
        '{{- if .Type }}{{ $sep }}"type": {{ template "mm_type" .Type }}{{ $sep = ", " }}{{ end }}'
        '{{- if .Items }}{{ $sep }}"items": {{ template "mm_json" .Items }}{{ $sep = ", " }}{{ end }}'
        '{{- if .Enum }}{{ $sep }}"enum": [{{ range $i, $e := .Enum }}{{ if $i }}, {{ end }}'
        '{{ template "mm_json" $e }}{{ end }}]{{ $sep = ", " }}{{ end }}'
        '{{- if .Description }}{{ $sep }}"description": {{ printf "%q" .Description }}{{ end }}{{ "}" }}{{ end }}'
        '{{- define "mm_params" }}{{ "{" }}"type": {{ printf "%q" .Type }}, "properties": {{ "{" }}'
        '{{- $first := true }}{{ range $k, $v := .Properties }}{{ if not $first }}, {{ end }}{{ $first = false }}'
        '{{ printf "%q" $k }}: {{ template "mm_prop" $v }}{{ end }}{{ "}" }}'
        '{{- if .Required }}, "required": [{{ range $i, $r := .Required }}{{ if $i }}, {{ end }}'
        '{{ printf "%q" $r }}{{ end }}]{{ end }}{{ "}" }}{{ end }}'
        '{{- define "mm_function" }}{{ "{" }}"name": {{ printf "%q" .Name }}'
        '{{- if .Description }}, "description": {{ printf "%q" .Description }}{{ end }}'
        ', "parameters": {{ template "mm_params" .Parameters }}{{ "}" }}{{ end }}'
        '{{- define "mm_tool" }}{{ "{" }}"type": {{ printf "%q" .Type }}, "function": '
        '{{ template "mm_function" .Function }}{{ "}" }}{{ end }}'
    )


def _nl(depth: int) -> str:
    return _q("\n" + "    " * depth)


def _indent_defines() -> str:
    """mm_json_i<d>, mm_prop_i<d> and mm_tool_i: json.dumps(…, indent=4) at nesting depth d."""
    parts = []
    for d in range(_DEPTH + 1):
        child = f"mm_json_i{d + 1}" if d < _DEPTH else "mm_json"
        parts.append(
            f'{{{{- define "mm_json_i{d}" }}}}{{{{ $t := printf "%T" . }}}}'
            '{{- if eq $t "string" }}{{ printf "%q" . }}'
            '{{- else if eq $t "map[string]interface {}" }}{{ if not . }}{{ "{}" }}{{ else }}{{ "{" }}'
            '{{- $first := true }}{{ range $k, $v := . }}{{ if not $first }},{{ end }}{{ $first = false }}'
            f'{_nl(d + 1)}{{{{ printf "%q" $k }}}}: {{{{ template "{child}" $v }}}}{{{{ end }}}}{_nl(d)}{{{{ "}}" }}}}'
            '{{ end }}'
            '{{- else if eq $t "[]interface {}" }}{{ if not . }}[]{{ else }}['
            f'{{{{- range $i, $v := . }}}}{{{{ if $i }}}},{{{{ end }}}}{_nl(d + 1)}{{{{ template "{child}" $v }}}}'
            f'{{{{ end }}}}{_nl(d)}]{{{{ end }}}}'
            '{{- else }}{{ json . }}{{ end }}{{ end }}'
        )
    for d in range(_DEPTH):
        inner = f"mm_json_i{d + 1}"
        prop = f"mm_prop_i{d + 1}" if d + 1 < _DEPTH else "mm_prop"
        key = _nl(d + 1)
        strings = f'{{{{ range $i, $t := . }}}}{{{{ if $i }}}},{{{{ end }}}}{_nl(d + 2)}{{{{ printf "%q" $t }}}}{{{{ end }}}}'
        parts.append(
            f'{{{{- define "mm_prop_i{d}" }}}}{{{{ "{{" }}}}{{{{ $sep := "" }}}}'
            f'{{{{- if .AnyOf }}}}{{{{ $sep }}}}{key}"anyOf": [{{{{ range $i, $a := .AnyOf }}}}{{{{ if $i }}}},{{{{ end }}}}'
            f'{_nl(d + 2)}{{{{ template "{prop}" $a }}}}{{{{ end }}}}{_nl(d + 1)}]{{{{ $sep = "," }}}}{{{{ end }}}}'
            f'{{{{- if .Type }}}}{{{{ $sep }}}}{key}"type": {{{{ if eq (len .Type) 1 }}}}{{{{ printf "%q" (index .Type 0) }}}}'
            f'{{{{ else }}}}[{{{{ with .Type }}}}{strings}{{{{ end }}}}{_nl(d + 1)}]{{{{ end }}}}{{{{ $sep = "," }}}}{{{{ end }}}}'
            f'{{{{- if .Items }}}}{{{{ $sep }}}}{key}"items": {{{{ template "{inner}" .Items }}}}{{{{ $sep = "," }}}}{{{{ end }}}}'
            f'{{{{- if .Enum }}}}{{{{ $sep }}}}{key}"enum": [{{{{ range $i, $e := .Enum }}}}{{{{ if $i }}}},{{{{ end }}}}'
            f'{_nl(d + 2)}{{{{ template "mm_json_i{min(d + 2, _DEPTH)}" $e }}}}{{{{ end }}}}{_nl(d + 1)}]{{{{ $sep = "," }}}}{{{{ end }}}}'
            f'{{{{- if .Description }}}}{{{{ $sep }}}}{key}"description": {{{{ printf "%q" .Description }}}}{{{{ end }}}}'
            f'{_nl(d)}{{{{ "}}" }}}}{{{{ end }}}}'
        )
    parts.append(_tool_indent_define(0))
    return "".join(parts)


def _tool_indent_define(base: int) -> str:
    """mm_tool_i (base 0) or mm_tool_i<base>: one tool, {"type", "function": {"name", "description",
    "parameters": {…}}}, as json.dumps(…, indent=4) prints it nested `base` levels deep."""
    name = "mm_tool_i" if base == 0 else f"mm_tool_i{base}"
    return (
        f'{{{{- define "{name}" }}}}{{{{ "{{" }}}}'
        f'{_nl(base + 1)}"type": {{{{ printf "%q" .Type }}}},{_nl(base + 1)}"function": {{{{ "{{" }}}}'
        f'{{{{- with .Function }}}}{_nl(base + 2)}"name": {{{{ printf "%q" .Name }}}}'
        f'{{{{- if .Description }}}},{_nl(base + 2)}"description": {{{{ printf "%q" .Description }}}}{{{{ end }}}}'
        f',{_nl(base + 2)}"parameters": {{{{ "{{" }}}}{{{{ with .Parameters }}}}{_nl(base + 3)}"type": {{{{ printf "%q" .Type }}}},'
        f'{_nl(base + 3)}"properties": {{{{ if not .Properties }}}}{{{{ "{{}}" }}}}{{{{ else }}}}{{{{ "{{" }}}}'
        '{{- $first := true }}{{ range $k, $v := .Properties }}{{ if not $first }},{{ end }}{{ $first = false }}'
        f'{_nl(base + 4)}{{{{ printf "%q" $k }}}}: {{{{ template "mm_prop_i{base + 4}" $v }}}}{{{{ end }}}}{_nl(base + 3)}{{{{ "}}" }}}}{{{{ end }}}}'
        f'{{{{- if .Required }}}},{_nl(base + 3)}"required": [{{{{ range $i, $r := .Required }}}}{{{{ if $i }}}},{{{{ end }}}}'
        f'{_nl(base + 4)}{{{{ printf "%q" $r }}}}{{{{ end }}}}{_nl(base + 3)}]{{{{ end }}}}{{{{ end }}}}{_nl(base + 2)}{{{{ "}}" }}}}'
        f'{{{{ end }}}}{_nl(base + 1)}{{{{ "}}" }}}}{_nl(base + 0)}{{{{ "}}" }}}}{{{{ end }}}}'
    )


def _html_action(action: str) -> str:
    inner = re.fullmatch(r"\{\{(-?) (printf \"%q\" .+?|json \.) \}\}", action)
    if inner:
        action = f"{{{{{inner.group(1)} html ({inner.group(2)}) }}}}"
    return action.replace('define "mm_', 'define "mmh_').replace('template "mm_', 'template "mmh_')


def html_json_defines() -> str:
    """The compact set again as mmh_*, every printed character HTML-escaped the way markupsafe escapes (a Jinja
    that adds a `|safe` string to `tojson` output escapes that output: &#34; for each quote)."""
    parts = re.split(r"(\{\{.*?\}\})", _compact_defines())
    out = [_html_action(p) if p.startswith("{{") else p.replace("&", "&amp;").replace('"', "&#34;") for p in parts]
    return "".join(out).replace('{{- define "', '\n{{- define "').lstrip("\n") + "\n"


def json_defines(*, indent: bool = False, tool_depths: tuple[int, ...] = ()) -> str:
    """The `define` blocks a TEMPLATE needs (the compact set always, the indent=4 set when asked), one per line;
    `tool_depths` adds mm_tool_i<d> for tools printed d levels deep (a list of tools is 1).

    Each block starts with `{{- define`, which trims the line break before it: layout only.
    """
    text = _compact_defines() + (_indent_defines() if indent else "")
    text += "".join(_tool_indent_define(d) for d in tool_depths)
    return text.replace('{{- define "', '\n{{- define "').lstrip("\n") + "\n"
