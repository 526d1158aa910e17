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


def _nl(depth: int, width: int = 4) -> str:
    return _q("\n" + " " * width * depth)


def _indent_defines() -> str:
    """mm_json_i<d>, mm_prop_i<d> and mm_tool_i: json.dumps(…, indent=4) at nesting depth d."""
    return _indent_set(4)


def _indent_set(width: int) -> str:
    """The indent=`width` set: mm_json_i<d>, mm_prop_i<d> and mm_tool_i, named mm<width>_… for a width other
    than 4."""
    parts = []
    for d in range(_DEPTH + 1):
        child = f"mm_json_i{d + 1}" if d < _DEPTH else "mm_json"
        parts.append(
            f'{{{{- define "mm_json_i{d}" }}}}{{{{ $t := printf "%T" . }}}}'
            '{{- if eq $t "string" }}{{ printf "%q" . }}'
            '{{- else if eq $t "map[string]interface {}" }}{{ if not . }}{{ "{}" }}{{ else }}{{ "{" }}'
            '{{- $first := true }}{{ range $k, $v := . }}{{ if not $first }},{{ end }}{{ $first = false }}'
            f'{_nl(d + 1, width)}{{{{ printf "%q" $k }}}}: {{{{ template "{child}" $v }}}}{{{{ end }}}}{_nl(d, width)}{{{{ "}}" }}}}'
            '{{ end }}'
            '{{- else if eq $t "[]interface {}" }}{{ if not . }}[]{{ else }}['
            f'{{{{- range $i, $v := . }}}}{{{{ if $i }}}},{{{{ end }}}}{_nl(d + 1, width)}{{{{ template "{child}" $v }}}}'
            f'{{{{ end }}}}{_nl(d, width)}]{{{{ end }}}}'
            '{{- else }}{{ json . }}{{ end }}{{ end }}'
        )
    for d in range(_DEPTH):
        inner = f"mm_json_i{d + 1}"
        prop = f"mm_prop_i{d + 1}" if d + 1 < _DEPTH else "mm_prop"
        key = _nl(d + 1, width)
        strings = f'{{{{ range $i, $t := . }}}}{{{{ if $i }}}},{{{{ end }}}}{_nl(d + 2, width)}{{{{ printf "%q" $t }}}}{{{{ end }}}}'
        parts.append(
            f'{{{{- define "mm_prop_i{d}" }}}}{{{{ "{{" }}}}{{{{ $sep := "" }}}}'
            f'{{{{- if .AnyOf }}}}{{{{ $sep }}}}{key}"anyOf": [{{{{ range $i, $a := .AnyOf }}}}{{{{ if $i }}}},{{{{ end }}}}'
            f'{_nl(d + 2, width)}{{{{ template "{prop}" $a }}}}{{{{ end }}}}{_nl(d + 1, width)}]{{{{ $sep = "," }}}}{{{{ end }}}}'
            f'{{{{- if .Type }}}}{{{{ $sep }}}}{key}"type": {{{{ if eq (len .Type) 1 }}}}{{{{ printf "%q" (index .Type 0) }}}}'
            f'{{{{ else }}}}[{{{{ with .Type }}}}{strings}{{{{ end }}}}{_nl(d + 1, width)}]{{{{ end }}}}{{{{ $sep = "," }}}}{{{{ end }}}}'
            f'{{{{- if .Items }}}}{{{{ $sep }}}}{key}"items": {{{{ template "{inner}" .Items }}}}{{{{ $sep = "," }}}}{{{{ end }}}}'
            f'{{{{- if .Enum }}}}{{{{ $sep }}}}{key}"enum": [{{{{ range $i, $e := .Enum }}}}{{{{ if $i }}}},{{{{ end }}}}'
            f'{_nl(d + 2, width)}{{{{ template "mm_json_i{min(d + 2, _DEPTH)}" $e }}}}{{{{ end }}}}{_nl(d + 1, width)}]{{{{ $sep = "," }}}}{{{{ end }}}}'
            f'{{{{- if .Description }}}}{{{{ $sep }}}}{key}"description": {{{{ printf "%q" .Description }}}}{{{{ end }}}}'
            f'{_nl(d, width)}{{{{ "}}" }}}}{{{{ end }}}}'
        )
    parts.append(_tool_indent_define(0, width))
    text = "".join(parts)
    return text if width == 4 else text.replace('"mm_json_i', f'"mm{width}_json_i').replace(
        '"mm_prop_i', f'"mm{width}_prop_i').replace('"mm_tool_i', f'"mm{width}_tool_i')


def _tool_indent_define(base: int, width: int = 4) -> str:
    """mm_tool_i (base 0) or mm_tool_i<base>: one tool, {"type", "function": {"name", "description",
    "parameters": {…}}}, as json.dumps(…, indent=width) prints it nested `base` levels deep."""
    name = "mm_tool_i" if base == 0 else f"mm_tool_i{base}"
    return (
        f'{{{{- define "{name}" }}}}{{{{ "{{" }}}}'
        f'{_nl(base + 1, width)}"type": {{{{ printf "%q" .Type }}}},{_nl(base + 1, width)}"function": '
        f'{{{{ with .Function }}}}{_function_body(base + 1, width)}{{{{ end }}}}{_nl(base, width)}{{{{ "}}" }}}}{{{{ end }}}}'
    )


def _function_body(base: int, width: int) -> str:
    """A tool's function object ({"name", "description", "parameters"}) with its braces `base` levels deep, as
    json.dumps(…, indent=width) prints it; the dot is the function. Properties print with mm_prop_i<d>."""
    def nl(depth: int) -> str:
        return _nl(depth, width)

    return (
        f'{{{{ "{{" }}}}{nl(base + 1)}"name": {{{{ printf "%q" .Name }}}}'
        f'{{{{- if .Description }}}},{nl(base + 1)}"description": {{{{ printf "%q" .Description }}}}{{{{ end }}}}'
        f',{nl(base + 1)}"parameters": {{{{ "{{" }}}}{{{{ with .Parameters }}}}{nl(base + 2)}"type": {{{{ printf "%q" .Type }}}},'
        f'{nl(base + 2)}"properties": {{{{ if not .Properties }}}}{{{{ "{{}}" }}}}{{{{ else }}}}{{{{ "{{" }}}}'
        '{{- $first := true }}{{ range $k, $v := .Properties }}{{ if not $first }},{{ end }}{{ $first = false }}'
        f'{nl(base + 3)}{{{{ printf "%q" $k }}}}: {{{{ template "mm_prop_i{base + 3}" $v }}}}{{{{ end }}}}{nl(base + 2)}{{{{ "}}" }}}}{{{{ end }}}}'
        f'{{{{- if .Required }}}},{nl(base + 2)}"required": [{{{{ range $i, $r := .Required }}}}{{{{ if $i }}}},{{{{ end }}}}'
        f'{nl(base + 3)}{{{{ printf "%q" $r }}}}{{{{ end }}}}{nl(base + 2)}]{{{{ end }}}}{{{{ end }}}}{nl(base + 1)}{{{{ "}}" }}}}'
        f'{nl(base)}{{{{ "}}" }}}}'
    )


def _function_list_indent_define(width: int) -> str:
    """mm<width>_functions_i: the tools' function objects as a list, the way
    `tools | map(attribute='function') | tojson(indent=width)` prints it."""
    return (
        f'{{{{- define "mm{width}_functions_i" }}}}{{{{ if not . }}}}[]{{{{ else }}}}['
        f'{{{{- range $i, $t := . }}}}{{{{ if $i }}}},{{{{ end }}}}{_nl(1, width)}{{{{ with $t.Function }}}}'
        f'{_function_body(1, width)}{{{{ end }}}}{{{{ end }}}}{_nl(0, width)}]{{{{ end }}}}{{{{ end }}}}'
    ).replace('"mm_prop_i', f'"mm{width}_prop_i')


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


def json_defines(*, indent: bool = False, tool_depths: tuple[int, ...] = (), indent_width: int | None = None) -> str:
    """The `define` blocks a TEMPLATE needs (the compact set always, the indent=4 set when asked), one per line;
    `tool_depths` adds mm_tool_i<d> for tools printed d levels deep (a list of tools is 1); `indent_width` adds
    the set for another indent (mm<w>_json_i<d>, mm<w>_prop_i<d>, mm<w>_tool_i) and mm<w>_functions_i.

    Each block starts with `{{- define`, which trims the line break before it: layout only.
    """
    text = _compact_defines() + (_indent_defines() if indent else "")
    if indent_width is not None and indent_width != 4:
        text += _indent_set(indent_width) + _function_list_indent_define(indent_width)
    text += "".join(_tool_indent_define(d) for d in tool_depths)
    return text.replace('{{- define "', '\n{{- define "').lstrip("\n") + "\n"
