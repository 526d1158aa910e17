"""What family modules share to read a Jinja source and write a Go TEMPLATE.

golit (a Go string literal), _fill (a TEMPLATE skeleton filled with its parts), _jinja_tree / _jinja_strings /
_jinja_string_starting / _jinja_assignment (the parsed Jinja, its string constants, the one starting with a
prefix, a `set` assignment), _render_marked (the Jinja rendered with marker values), _has_all / _has_none
(marker tests), and _LOOP_HEAD (the per-message loop state most TEMPLATEs open with).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from pipelines.core.errors import UnsupportedModel

# ---------------------------------------------------------------- helpers


def golit(text: str) -> str:
    """`text` as a Go template action printing it: {{ "…" }} with Go string escapes."""
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif not ch.isprintable():
            out.append(f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}")
        else:
            out.append(ch)
    return '{{ "' + "".join(out) + '" }}'


def _fill(template: str, **parts: str) -> str:
    """Join a readable multi-line Go template into one and substitute «NAME» markers.

    Every line after the first must start (after indentation) with `{{-`, which trims the line break and
    indentation before it in Go, so layout here never reaches the prompt; literal text lives inside
    actions or right after an action on the same line, and «NL» is a line break inside literal text
    (a text node, which is what Ollama's tool-call and thinking heuristics read).
    """
    out = template.strip("\n")
    for key, value in parts.items():
        out = out.replace(f"«{key}»", value)
    if re.search(r"«(?!NL»)", out):
        raise ValueError(f"unfilled marker in template: {re.findall(r'«[A-Z_]+»', out)}")
    for n, line in enumerate(out.split("\n")[1:], 2):
        if not line.lstrip().startswith("{{-"):
            raise ValueError(f"template line {n} does not start with '{{{{-': {line!r}")
    return out.replace("«NL»", "\n")


@lru_cache(maxsize=64)
def _jinja_tree(src: str) -> Any:
    from pipelines.chat.jinja import environment

    return environment().parse(src)


def _jinja_strings(src: str) -> list[str]:
    """Every string constant in the Jinja source, escape sequences decoded."""
    from jinja2 import nodes

    try:
        tree = _jinja_tree(src)
    except Exception:
        return []
    return [n.value for n in tree.find_all(nodes.Const) if isinstance(n.value, str)]


def _jinja_string_starting(src: str, prefix: str) -> str | None:
    """The one string constant of the Jinja source that starts with `prefix` (a tool preamble's tail, which the
    template's own wording completes); None when there is none or more than one."""
    found = [t for t in _jinja_strings(src) if t.startswith(prefix)]
    return found[0] if len(found) == 1 else None


def _jinja_assignment(src: str, name: str) -> Any:
    from jinja2 import nodes

    try:
        tree = _jinja_tree(src)
    except Exception:
        return None
    for n in tree.find_all(nodes.Assign):
        if isinstance(n.target, nodes.Name) and n.target.name == name:
            return n.node
    return None


def _render_marked(src: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    """The Jinja rendered (as transformers) with marker values, to cut the fixed texts it prints out of.

    Raises:
        ValueError: the Jinja refuses them (another family's template, forced onto this one).
    """
    from pipelines.chat.jinja import render

    try:
        return render(src, messages, **kwargs)
    except UnsupportedModel as err:
        raise ValueError(err.message) from err


def _has_all(src: str, *needles: str) -> bool:
    return all(n in src for n in needles)


def _has_none(src: str, *needles: str) -> bool:
    return not any(n in src for n in needles)


# Per-message loop state most templates need: $i, the message, whether it is the last one, the role of
# the next message, and (kept across iterations) the role of the previous one.
_LOOP_HEAD = (
    '{{- $rest := slice $msgs $i }}{{ $last := eq (len $rest) 1 }}{{ $next := "" }}'
    "{{ if not $last }}{{ $next = (index $rest 1).Role }}{{ end }}"
)
