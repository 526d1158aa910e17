"""Chat families: each detects its Hugging Face chat template and writes the Ollama Go TEMPLATE that renders alike.

One small entry per family. `detect` looks at the Jinja source; `build` writes the Go template (and
may read constants such as a default system prompt out of the Jinja source); `stop` are the strings
that end a turn. The proof that a TEMPLATE renders what the Jinja renders lives in
`pipelines.chat.proof` and in tests/test_ollama_templates.py.

Conventions every TEMPLATE here follows, because Ollama works this way:
- The begin-of-sequence token is left out when the engine adds it (GGUF `tokenizer.ggml.add_bos_token`);
  Ollama's runner tokenizes the prompt with special tokens added, so writing it would double it.
- A conversation that ends with a user or tool message gets the generation prompt (transformers'
  `add_generation_prompt=True`); one that ends with an assistant message is left open for the model
  to continue it (transformers' `continue_final_message=True`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from pipelines.chat.gojson import html_json_defines, json_defines
from pipelines.core.errors import UnsupportedModel


class UnsupportedChatTemplate(UnsupportedModel):
    """A chat template outside the families modelmint can convert."""

    def __init__(self, message: str, *, families: list[str]) -> None:
        super().__init__(
            message,
            hint="supported families: " + ", ".join(families) + ". To publish anyway, write the Ollama TEMPLATE "
            "by hand (Go text/template over .Messages, see https://github.com/ollama/ollama/blob/main/docs/"
            "template.md) and pass it with `modelmint modelfile <file.gguf> --template FILE`",
        )
        self.families = families


@dataclass(frozen=True)
class TemplateTokens:
    """The special-token texts a template prints, and whether the engine adds the BOS token itself."""

    bos: str | None = None
    eos: str | None = None
    engine_adds_bos: bool = True

    @property
    def bos_text(self) -> str:
        """What the TEMPLATE must print where the Jinja prints bos_token."""
        return "" if self.engine_adds_bos or not self.bos else self.bos


@dataclass(frozen=True)
class ChatFamily:
    name: str
    title: str
    detect: Callable[[str], bool]
    build: Callable[[str, TemplateTokens], str] | None
    """Writes the proven Go TEMPLATE; None for a family Ollama renders with a built-in RENDERER only."""
    stop: tuple[str, ...]
    """Strings that end a turn in this family's format (Modelfile `PARAMETER stop`)."""
    bos_in_template: bool = False
    """The Jinja prints bos_token first (so the Ollama rendering equals it minus an engine-added BOS)."""
    thinking: bool = False
    reasoning_key: str | None = None
    """The message key this Jinja reads reasoning from (e.g. reasoning_content); None: reasoning comes inside
    the content as <think>…</think>, the way a thinking model wrote it."""
    think_variable: str = "enable_thinking"
    """The Jinja variable that switches thinking on (Ollama's think setting maps onto it)."""
    jinja_date: str | None = None
    """The strftime format in which the Jinja prints today's date; Ollama's currentDate prints the same date as
    YYYY-MM-DD, the one normalisation the proof applies."""
    content_none_ok: bool = True
    """Whether the Jinja accepts a tool-call message whose content is None (one that concatenates the content
    needs '', which is what Ollama always passes)."""
    string_arguments: Callable[[str], bool] = lambda _src: False
    """Whether this Jinja concatenates tool-call arguments as a JSON string (the OpenAI wire format)
    instead of printing an object with tojson."""
    notes: tuple[str, ...] = field(default=())
    """Known, documented ways the Ollama rendering cannot follow the Jinja (also asserted in the tests)."""
    markers: tuple[str, ...] = field(default=())
    """Texts of the Jinja source that identify the family: the evidence shown to users, and what a
    near-miss lacks when a template resembles this family without being it."""
    renderer: str | None = None
    """Ollama's built-in RENDERER for this family (pipelines.chat.renderers.RENDERERS)."""
    parser: str | None = None
    """Ollama's built-in PARSER that returns thinking and structured tool_calls for it."""
    tool_calls: str = ""
    """How Ollama returns structured tool_calls for this family (the PARSER, or the TEMPLATE's tag)."""

    @property
    def kind(self) -> str:
        """'proven' (a TEMPLATE proven on the suite) or 'renderer' (Ollama's built-in RENDERER only)."""
        return "proven" if self.build is not None else "renderer"

    def template(self, jinja: str, tokens: TemplateTokens) -> str:
        """The Go TEMPLATE for this Jinja.

        Raises:
            UnsupportedChatTemplate: the family has no TEMPLATE (Ollama renders it with a RENDERER).
        """
        if self.build is None:
            raise UnsupportedChatTemplate(
                f"the {self.name} family has no Go TEMPLATE: Ollama renders it with RENDERER {self.renderer}",
                families=sorted(FAMILIES))
        return self.build(jinja, tokens)

    def evidence(self, jinja: str) -> tuple[list[str], list[str]]:
        """(markers found, markers missing) in this Jinja source."""
        return [m for m in self.markers if m in jinja], [m for m in self.markers if m not in jinja]


FAMILIES: dict[str, ChatFamily] = {}


def register(family: ChatFamily) -> ChatFamily:
    if family.name in FAMILIES:
        raise ValueError(f"chat family {family.name} registered twice")
    FAMILIES[family.name] = family
    return family


def matching_families(jinja: str) -> list[ChatFamily]:
    """Every family whose detector accepts this Jinja (more than one means: refuse)."""
    return [f for f in FAMILIES.values() if f.detect(jinja)]


def nearest_family(jinja: str) -> tuple[ChatFamily, list[str], list[str]] | None:
    """The family whose markers this Jinja shares most (markers found less markers missing, then markers
    found), with the markers found and missing; None when it shares none."""
    best: tuple[tuple[int, int], ChatFamily, list[str], list[str]] | None = None
    for fam in FAMILIES.values():
        found, missing = fam.evidence(jinja)
        if fam.markers and found:
            score = (len(found) - len(missing), len(found))
            if best is None or score > best[0]:
                best = (score, fam, found, missing)
    return None if best is None else best[1:]


# Jinja constructs Go's text/template (with Ollama's functions) has no counterpart for: no string methods, no
# arithmetic, no Python value printing.
_GO_CANNOT = (
    (re.compile(r"\.split\("), "splitting strings (.split)"),
    (re.compile(r"\.(?:l|r)?strip\(|\|\s*trim\b"), "stripping whitespace (.strip / trim)"),
    (re.compile(r"\.(?:startswith|endswith)\("), "prefix and suffix tests (.startswith / .endswith)"),
    (re.compile(r"\.replace\("), "replacing text (.replace)"),
    (re.compile(r"'[^']*'\s+in\s+\w|\"[^\"]*\"\s+in\s+\w"), "substring tests ('x' in s)"),
    (re.compile(r"\|\s*string\b"), "Python's str() of values (| string)"),
    (re.compile(r"[\w)\]]\s*[-+*%]\s*\d|\d\s*[-+*%]\s*[\w(]"), "arithmetic"),
)


def go_blockers(jinja: str) -> list[str]:
    """The constructs of this Jinja that a Go TEMPLATE cannot reproduce (where a family's TEMPLATE works around one,
    its notes say how)."""
    return [what for pattern, what in _GO_CANNOT if pattern.search(jinja)]


def refusal_reason(jinja: str) -> str:
    """Why no family accepts this Jinja, naming the nearest family and what differs from it, and the constructs a
    hand-written TEMPLATE would have to do without."""
    hits = matching_families(jinja)
    if len(hits) > 1:
        return f"matches several families ({', '.join(f.name for f in hits)}); refusing to guess"
    near = nearest_family(jinja)
    blockers = go_blockers(jinja)
    tail = f"; it uses what Go templates cannot express: {', '.join(blockers)}" if blockers else ""
    if near is None:
        return "shares no marker with any family" + tail
    fam, found, missing = near
    if not missing:
        return (f"has every marker of {fam.name} but is not the template modelmint proved for it "
                "(a variant or an edited version)" + tail)
    return (f"nearest family {fam.name} ({len(found)} of {len(fam.markers)} markers); lacks "
            + ", ".join(repr(m) for m in missing) + tail)


def detect_family(jinja: str) -> ChatFamily:
    """The one family whose detector accepts this Jinja chat template.

    Raises:
        UnsupportedChatTemplate: no family (or more than one) recognises it; the message names the
            nearest family and what differs.
    """
    hits = matching_families(jinja)
    if len(hits) == 1:
        return hits[0]
    names = sorted(FAMILIES)
    if not hits:
        head = " ".join(jinja.split())[:120]
        raise UnsupportedChatTemplate(
            f"the chat template is not one modelmint can convert: {refusal_reason(jinja)} (it begins: {head!r})",
            families=names)
    raise UnsupportedChatTemplate(f"the chat template {refusal_reason(jinja)}", families=names)


def get_family(name: str) -> ChatFamily:
    """Raises: UnsupportedChatTemplate: no family of that name."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise UnsupportedChatTemplate(f"no chat family named {name!r}", families=sorted(FAMILIES)) from None


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


# ---------------------------------------------------------------- ChatML with Qwen2.5's tool calling

_QWEN_TOOLS_HEAD = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_QWEN_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call><|im_end|>\n"
)
_QWEN_SYSTEM = re.compile(r"^<\|im_start\|>system\n(.+)<\|im_end\|>\n$", re.S)


def _qwen_default_system(src: str) -> str | None:
    for s in _jinja_strings(src):
        m = _QWEN_SYSTEM.match(s)
        if m and m.group(1) in _jinja_strings(src):
            return m.group(1)
    return None


def _squash(src: str) -> str:
    """The Jinja source without whitespace outside string literals and without trim markers."""
    out, quote, i = [], "", 0
    while i < len(src):
        ch = src[i]
        if quote:
            out.append(ch)
            if ch == "\\" and i + 1 < len(src):
                out.append(src[i + 1])
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
            out.append(ch)
        elif not ch.isspace():
            out.append(ch)
        i += 1
    text = "".join(out)
    for a, b in (("{%-", "{%"), ("-%}", "%}"), ("{{-", "{{"), ("-}}", "}}")):
        text = text.replace(a, b)
    return text


# Plain ChatML as Qwen2 (and many fine-tunes) write it: one loop, an optional default system prompt.
_PLAIN_CHATML = re.compile(
    r"^\{%formessageinmessages%\}"
    r"(?P<default>\{%ifloop\.firstandmessages\[0\]\['role'\]!='system'%\}"
    r"\{\{'<\|im_start\|>system(?:\\n|\n)[^'\\]+<\|im_end\|>(?:\\n|\n)'\}\}\{%endif%\})?"
    r"\{\{'<\|im_start\|>'\+message\['role'\]\+'(?:\\n|\n)'\+message\['content'\]\+'<\|im_end\|>'\+'(?:\\n|\n)'\}\}"
    r"\{%endfor%\}\{%ifadd_generation_prompt%\}\{\{'<\|im_start\|>assistant(?:\\n|\n)'\}\}\{%endif%\}$"
)


def _plain_chatml(src: str) -> re.Match[str] | None:
    return _PLAIN_CHATML.match(_squash(src))


def _detect_chatml(src: str) -> bool:
    return _detect_qwen25(src) or _plain_chatml(src) is not None


def _detect_qwen25(src: str) -> bool:
    strings = _jinja_strings(src)
    return (
        _has_all(src, "<|im_start|>", "<|im_end|>", "<tool_call>", "<tool_response>", "tool_call.arguments | tojson")
        and _QWEN_TOOLS_HEAD in strings
        and _QWEN_TOOLS_TAIL in strings
        and _qwen_default_system(src) is not None
        and _has_none(src, "<think>", "reasoning_content", "enable_thinking", "tool_call.arguments is string")
    )


def _build_chatml(src: str, tokens: TemplateTokens) -> str:
    plain = _plain_chatml(src)
    if plain is not None:
        return _build_plain_chatml(src, plain)
    default = _qwen_default_system(src)
    assert default is not None
    return json_defines() + _fill(
        """
{{- $msgs := .Messages }}{{ $first := "" }}{{ if $msgs }}{{ $first = (index $msgs 0).Role }}{{ end }}
{{- if .Tools }}<|im_start|>system{{ "\\n" }}
    {{- if eq $first "system" }}{{ (index $msgs 0).Content }}{{ else }}«DEFAULT»{{ end }}
    {{- «TOOLS_HEAD» }}
    {{- range .Tools }}{{ "\\n" }}{{ template "mm_tool" . }}{{ end }}
    {{- «TOOLS_TAIL» }}
{{- else if eq $first "system" }}<|im_start|>system{{ "\\n" }}{{ (index $msgs 0).Content }}<|im_end|>{{ "\\n" }}
{{- else }}<|im_start|>system{{ "\\n" }}«DEFAULT»<|im_end|>{{ "\\n" }}
{{- end }}
{{- $prev := "" }}
{{- range $i, $m := $msgs }}
    «LOOP_HEAD»
    {{- if or (eq .Role "user") (and (eq .Role "system") $i) (and (eq .Role "assistant") (not .ToolCalls)) }}
        {{- "<|im_start|>" }}{{ .Role }}{{ "\\n" }}{{ .Content }}
        {{- if not (and $last (eq .Role "assistant")) }}<|im_end|>{{ "\\n" }}{{ end }}
    {{- else if eq .Role "assistant" }}<|im_start|>assistant
        {{- if .Content }}{{ "\\n" }}{{ .Content }}{{ end }}
        {{- if .ToolCalls }}{{ range .ToolCalls }}«NL»<tool_call>«NL»{"name": "{{ .Function.Name }}", "arguments": {{ template "mm_args" .Function.Arguments }}}«NL»</tool_call>{{ end }}{{ end }}<|im_end|>{{ "\\n" }}
    {{- else if eq .Role "tool" }}
        {{- if ne $prev "tool" }}<|im_start|>user{{ end }}
        {{- "\\n<tool_response>\\n" }}{{ .Content }}{{ "\\n</tool_response>" }}
        {{- if ne $next "tool" }}<|im_end|>{{ "\\n" }}{{ end }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<|im_start|>assistant{{ "\\n" }}{{ end }}
""",
        DEFAULT=golit(default),
        TOOLS_HEAD=golit(_QWEN_TOOLS_HEAD)[3:-3],
        TOOLS_TAIL=golit(_QWEN_TOOLS_TAIL)[3:-3],
        LOOP_HEAD=_LOOP_HEAD,
    )


def _build_plain_chatml(src: str, plain: re.Match[str]) -> str:
    default = ""
    if plain.group("default"):
        found = next(m.group(1) for m in map(_QWEN_SYSTEM.match, _jinja_strings(src)) if m)
        default = f'{{{{- if and (eq $i 0) (ne .Role "system") }}}}<|im_start|>system{{{{ "\\n" }}}}' \
                  f'{golit(found)}<|im_end|>{{{{ "\\n" }}}}{{{{ end }}}}'
    return _fill(
        """
{{- $msgs := .Messages }}{{ $prev := "" }}
{{- range $i, $m := $msgs }}
    «LOOP_HEAD»
    «DEFAULT»
    {{- "<|im_start|>" }}{{ .Role }}{{ "\\n" }}{{ .Content }}
    {{- if not (and $last (eq .Role "assistant")) }}<|im_end|>{{ "\\n" }}{{ end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<|im_start|>assistant{{ "\\n" }}{{ end }}
""",
        LOOP_HEAD=_LOOP_HEAD,
        DEFAULT=default or '{{- "" }}',
    )


register(ChatFamily(
    name="chatml",
    title="ChatML: plain (Qwen2) or as Qwen2.5 writes it (default system prompt, <tools>, <tool_call>)",
    detect=_detect_chatml,
    build=_build_chatml,
    stop=("<|im_end|>", "<|im_start|>"),
    markers=("<|im_start|>", "<|im_end|>", "<tool_call>", "<tool_response>"),
    tool_calls="TEMPLATE: Ollama's tool parser reads the <tool_call> tag from the TEMPLATE (Qwen2.5); plain ChatML has none",
))


# ---------------------------------------------------------------- Qwen3 and QwQ (ChatML, <think>, Qwen tool calls)

_QWEN3_TOOLS_HEAD = _QWEN_TOOLS_HEAD[2:]  # Qwen3 writes "\n\n" after the system text only when there is one
_QWEN3_NO_THINK = "{%- if enable_thinking is defined and enable_thinking is false %}"


def _detect_qwen3(src: str) -> bool:
    strings = _jinja_strings(src)
    return (
        _has_all(src, "<|im_start|>", "<|im_end|>", "multi_step_tool=true, last_query_index=messages|length - 1",
                 "message.content.startswith('<tool_response>')", "message.reasoning_content is defined",
                 "'\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n')",
                 _QWEN3_NO_THINK, "tool_call.arguments | tojson")
        and _QWEN3_TOOLS_HEAD in strings and _QWEN_TOOLS_TAIL in strings
        and _has_none(src, "<|vision_start|>", "<function=", "render_content", "default_system", "xml_tools")
    )


def _detect_qwq(src: str) -> bool:
    strings = _jinja_strings(src)
    return (
        _has_all(src, "<|im_start|>", "<|im_end|>", "{{- '<|im_start|>assistant\\n<think>\\n' }}",
                 "{%- if not enable_thinking -%}{{- '</think>' -}}{%- endif -%}",
                 "{%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}",
                 "tool_call.arguments | tojson")
        and _QWEN_TOOLS_HEAD in strings and _QWEN_TOOLS_TAIL in strings
        and _has_none(src, "multi_step_tool", "reasoning_content", "<function=", "default_system", "xml_tools")
    )


_QWEN3_BODY = """
{{- $msgs := .Messages }}{{ $first := "" }}{{ if $msgs }}{{ $first = (index $msgs 0).Role }}{{ end }}
{{- if .Tools }}<|im_start|>system{{ "\\n" }}
    {{- if eq $first "system" }}{{ (index $msgs 0).Content }}«SYS_SEP»{{ end }}
    {{- «TOOLS_HEAD» }}
    {{- range .Tools }}{{ "\\n" }}{{ template "mm_tool" . }}{{ end }}
    {{- «TOOLS_TAIL» }}
{{- else if eq $first "system" }}<|im_start|>system{{ "\\n" }}{{ (index $msgs 0).Content }}<|im_end|>{{ "\\n" }}
{{- end }}
{{- $lastQuery := -1 }}{{ range $i, $m := $msgs }}{{ if eq .Role "user" }}{{ $lastQuery = $i }}{{ end }}{{ end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if or (eq .Role "user") (and (eq .Role "system") $i) }}
        {{- "<|im_start|>" }}{{ .Role }}{{ "\\n" }}{{ .Content }}<|im_end|>{{ "\\n" }}
    {{- else if eq .Role "assistant" }}<|im_start|>assistant
        «ASSISTANT»
        {{- if not (and $last (not .ToolCalls)) }}<|im_end|>{{ "\\n" }}{{ end }}
    {{- else if eq .Role "tool" }}
        {{- if ne $prev "tool" }}<|im_start|>user{{ end }}
        {{- "\\n<tool_response>\\n" }}{{ .Content }}{{ "\\n</tool_response>" }}
        {{- if ne $next "tool" }}<|im_end|>{{ "\\n" }}{{ end }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<|im_start|>assistant{{ "\\n" }}«GEN»{{ end }}
"""

# Qwen3: the reasoning of turns after the last user query is kept inside <think>; earlier turns lose it.
_QWEN3_ASSISTANT = """
        {{- if and (gt $i $lastQuery) (or $last .Thinking) }}{{ "\\n<think>\\n" }}{{ .Thinking }}{{ "\\n</think>\\n\\n" }}{{ .Content }}
        {{- else }}{{ "\\n" }}{{ .Content }}{{ end }}
        {{- if and $m.Content $m.ToolCalls }}{{ "\\n" }}{{ end }}
        «CALLS»
        «THINK_TAGS»"""

# QwQ: reasoning never comes back; a message with tool calls prints its content only when the Jinja sees some
# (reasoning reaches the Jinja inside the content, so .Thinking counts).
_QWQ_ASSISTANT = """
        {{- if or .Content .Thinking (not $m.ToolCalls) }}{{ "\\n" }}{{ .Content }}{{ end }}
        {{- if .ToolCalls }}{{ range .ToolCalls }}«NL»<tool_call>«NL»{"name": "{{ .Function.Name }}", "arguments": {{ template "mm_args" .Function.Arguments }}}«NL»</tool_call>{{ end }}{{ end }}
        «THINK_TAGS»"""

# Ollama reads its tool-call tag from the first text inside the first `if` on .ToolCalls, so the tag opens it.
_QWEN3_CALLS = (
    '{{- if .ToolCalls }}{{ range $j, $c := .ToolCalls }}<tool_call>«NL»{"name": "{{ .Function.Name }}", '
    '"arguments": {{ template "mm_args" .Function.Arguments }}}«NL»</tool_call>'
    '{{ if gt (len (slice $m.ToolCalls $j)) 1 }}«NL»{{ end }}{{ end }}{{ end }}'
)
# Never renders: declares <think>…</think> around .Thinking, which Ollama reads as the thinking tags.
_THINK_TAGS = "{{- if false }}<think>{{ .Thinking }}</think>{{ end }}"


def _build_qwen3(src: str, tokens: TemplateTokens) -> str:
    qwq = _detect_qwq(src)
    return json_defines() + _fill(
        _QWEN3_BODY,
        SYS_SEP="" if qwq else '{{ "\\n\\n" }}',
        TOOLS_HEAD=golit(_QWEN_TOOLS_HEAD if qwq else _QWEN3_TOOLS_HEAD)[3:-3],
        TOOLS_TAIL=golit(_QWEN_TOOLS_TAIL)[3:-3],
        LOOP_HEAD=_LOOP_HEAD,
        ASSISTANT=(_QWQ_ASSISTANT if qwq else _QWEN3_ASSISTANT).strip("\n"),
        CALLS=_QWEN3_CALLS,
        THINK_TAGS=_THINK_TAGS,
        GEN=('<think>{{ "\\n" }}{{ if not .Think }}</think>{{ end }}' if qwq
             else '{{ if and .IsThinkSet (not .Think) }}<think>{{ "\\n\\n" }}</think>{{ "\\n\\n" }}{{ end }}'),
    )


register(ChatFamily(
    name="qwen3",
    title="Qwen3 (hybrid thinking, enable_thinking) and QwQ (always thinks): ChatML with <think> and <tool_call>",
    detect=lambda src: _detect_qwen3(src) or _detect_qwq(src),
    build=_build_qwen3,
    stop=("<|im_end|>", "<|im_start|>"),
    thinking=True,
    content_none_ok=False,
    markers=("<|im_start|>", "<|im_end|>", "<tool_call>", "<tool_response>", "<think>", "</think>",
             "enable_thinking"),
    tool_calls="TEMPLATE: Ollama's tool parser reads the <tool_call> tag from the TEMPLATE; its thinking parser "
               "the <think> tags",
    notes=(
        "the Jinja cuts '<think>…</think>' out of assistant contents; Go templates cannot split strings, so the "
        "TEMPLATE relies on Ollama passing reasoning in .Thinking (its thinking parser does), never inside .Content",
        "Qwen3's Jinja strips line breaks around the kept reasoning (strip('\\n')); the TEMPLATE prints .Thinking "
        "as Ollama stores it",
        "Qwen3's Jinja does not count a user message that is wholly a '<tool_response>…</tool_response>' as a "
        "query; Go templates cannot test a suffix, so the TEMPLATE counts every user message",
        "the Jinja concatenates message contents, so a tool-call message needs content '' rather than None "
        "(Ollama's contents are always strings)",
    ),
))


# ---------------------------------------------------------------- Hermes 2 Pro / Hermes 3 tool use (ChatML + Python signatures)

_HERMES_INTRO = (
    "You are a function calling AI model. You are provided with function signatures within <tools></tools> XML "
    "tags. You may call one or more functions to assist with the user query. Don't make assumptions about what "
    "values to plug into functions. Here are the available tools: <tools> "
)
_HERMES_TAIL = (
    " </tools>",
    'Use the following pydantic model json schema for each tool call you will make: {"properties": {"name": '
    '{"title": "Name", "type": "string"}, "arguments": {"title": "Arguments", "type": "object"}}, "required": '
    '["name", "arguments"], "title": "FunctionCall", "type": "object"}}\n',
    "For each function call return a json object with function name and arguments within <tool_call></tool_call> "
    "XML tags as follows:\n",
    "<tool_call>\n",
    '{"name": <function-name>, "arguments": <args-dict>}\n',
    "</tool_call><|im_end|>\n",
)
# json_to_python_type of the Jinja: its array branch passes `json_spec|items` (the schema's key/value pairs, not
# its items), whose type is undefined and so iterable and empty: every array prints as list[Union[]]. (The
# same reasoning makes an unknown type name print one Any per character; the TEMPLATE prints Any.)
_HERMES_PYTYPE = (
    '{{- define "mm_pytype" }}{{ if eq (len .Type) 1 }}{{ template "mm_pytype1" index .Type 0 }}{{ else if .Type }}'
    'Union[{{ range $i, $t := .Type }}{{ if $i }},{{ end }}{{ template "mm_pytype1" $t }}{{ end }}]'
    '{{ else }}Any{{ end }}{{ end }}\n'
    '{{- define "mm_pytype1" }}{{ if eq . "string" }}str{{ else if eq . "number" }}float{{ else if eq . "integer" }}'
    'int{{ else if eq . "boolean" }}bool{{ else if eq . "array" }}list[Union[]]{{ else if eq . "object" }}dict'
    '{{ else }}Any{{ end }}{{ end }}\n'
)


def _detect_hermes(src: str) -> bool:
    strings = _jinja_strings(src)
    return (
        _has_all(src, "<|im_start|>", "macro json_to_python_type(json_spec)", "loop.previtem.role != \"tool\"",
                 "message.tool_calls is not defined", "tool_call.arguments|tojson", "param_fields.description|trim")
        and _HERMES_INTRO in strings and all(t in strings for t in _HERMES_TAIL)
    )


def _build_hermes(src: str, tokens: TemplateTokens) -> str:
    return json_defines() + _HERMES_PYTYPE + _fill(
        """
{{- $msgs := .Messages }}{{ «BOS» }}<|im_start|>system{{ "\\n" }}«INTRO»
{{- range $ti, $t := .Tools }}{{ if $ti }}{{ "\\n" }}{{ end }}
    {{- with .Function }}{"type": "function", "function": {"name": "{{ .Name }}", "description": "{{ .Name }}(
        {{- $first := true }}{{ range $k, $v := .Parameters.Properties }}{{ if not $first }}, {{ end }}{{ $first = false }}{{ $k }}: {{ template "mm_pytype" $v }}{{ end }}) - {{ .Description }}{{ "\\n\\n" }}
        {{- $first = true }}{{ range $k, $v := .Parameters.Properties }}{{ if $first }}{{ "    Args:\\n" }}{{ end }}{{ $first = false }}{{ "        " }}{{ $k }}({{ template "mm_pytype" $v }}): {{ $v.Description }}{{ end }}", "parameters": {{ if $first }}{{ "{}" }}{{ else }}{{ template "mm_params" .Parameters }}{{ end }}{{ "}" }}
    {{- end }}
{{- end }}«TAIL»
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if or (eq .Role "user") (eq .Role "system") (and (eq .Role "assistant") (not $m.ToolCalls)) }}
        {{- "<|im_start|>" }}{{ .Role }}{{ "\\n" }}{{ .Content }}
        {{- if not (and $last (eq .Role "assistant")) }}<|im_end|>{{ "\\n" }}{{ end }}
    {{- else if eq .Role "assistant" }}<|im_start|>assistant
        {{- if .ToolCalls }}{{ range .ToolCalls }}«NL»<tool_call>«NL»{"name": "{{ .Function.Name }}", "arguments": {{ template "mm_args" .Function.Arguments }}}«NL»</tool_call>{{ end }}{{ end }}<|im_end|>{{ "\\n" }}
    {{- else if eq .Role "tool" }}
        {{- if and $i (ne $prev "tool") }}<|im_start|>tool{{ "\\n" }}{{ end }}<tool_response>{{ "\\n" }}{{ .Content }}
        {{- if $last }}{{ "\\n</tool_response>" }}<|im_end|>{{ else }}{{ "\\n</tool_response>\\n" }}{{ if ne $next "tool" }}<|im_end|>{{ end }}{{ end }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<|im_start|>assistant{{ "\\n" }}{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        INTRO=golit(_HERMES_INTRO),
        TAIL=golit("".join(_HERMES_TAIL)),
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="hermes",
    title="Hermes 2 Pro / Hermes 3 tool use (ChatML; tools as Python signatures, <tool_call> and a tool role)",
    detect=_detect_hermes,
    build=_build_hermes,
    stop=("<|im_end|>", "<|im_start|>"),
    bos_in_template=True,
    content_none_ok=False,
    markers=("<|im_start|>", "<|im_end|>", "<tool_call>", "<tool_response>", "json_to_python_type",
             "You are a function calling AI model"),
    tool_calls="TEMPLATE: Ollama's tool parser reads the <tool_call> tag from the TEMPLATE",
    notes=(
        "the Jinja trims each parameter description (| trim); Go templates cannot",
        "the Jinja prints 'dict[str, …]' for an object with additionalProperties and '-> type' for a tool's "
        "return; Ollama's tool schema carries neither, so the TEMPLATE prints 'dict' and no return",
        "the Jinja prints a type name it does not know as 'Union[Any,…]' with one Any per character; the "
        "TEMPLATE prints 'Any'",
        "the Jinja (the tool_use variant) fails without tools ('NoneType' object is not iterable); the TEMPLATE "
        "prints the tool system prompt with an empty <tools>  </tools>",
    ),
))


# ---------------------------------------------------------------- SmolLM3 (ChatML, /think and /no_think modes)

_SMOL_HEAD = ("## Metadata\n\n", "Knowledge Cutoff Date: June 2025\n", "## Custom Instructions\n\n")
_SMOL_DEFAULT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face."


def _smol_defaults(src: str) -> tuple[str, str] | None:
    """(the /think default system text, the /no_think one), read from the Jinja."""
    found = [t for t in _jinja_strings(src) if t.startswith(_SMOL_DEFAULT)]
    long = [t for t in found if t != _SMOL_DEFAULT + "\n\n"]
    return (long[0], _SMOL_DEFAULT + "\n\n") if len(found) == 2 and len(long) == 1 else None


def _detect_smollm3(src: str) -> bool:
    return (
        _has_all(src, "<|im_start|>", "<|im_end|>", 'set reasoning_mode = "/think"', 'set reasoning_mode = "/no_think"',
                 '"Reasoning Mode: " + reasoning_mode', '"<think>\\n\\n</think>\\n"', 'content.lstrip("\\n")',
                 'system_message.replace("/no_think", "")')
        and all(h in _jinja_strings(src) for h in _SMOL_HEAD)
        and _smol_defaults(src) is not None
        and _has_none(src, "tools", "tool_call", "xml_tools", "python_tools")
    )


def _build_smollm3(src: str, tokens: TemplateTokens) -> str:
    defaults = _smol_defaults(src)
    assert defaults is not None
    return _fill(
        """
{{- $msgs := .Messages }}{{ $noThink := and .IsThinkSet (not .Think) }}{{ $sys := "" }}
{{- if and $msgs (eq (index $msgs 0).Role "system") }}{{ $sys = (index $msgs 0).Content }}{{ end }}
{{- "<|im_start|>system\\n" }}«HEAD0»«HEAD1»{{ "Reasoning Mode: " }}{{ if $noThink }}/no_think{{ else }}/think{{ end }}{{ "\\n\\n" }}«HEAD2»
{{- if $sys }}{{ $sys }}{{ "\\n\\n" }}{{ else if $noThink }}«SHORT»{{ else }}«LONG»{{ end }}<|im_end|>{{ "\\n" }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}<|im_start|>user{{ "\\n" }}{{ .Content }}<|im_end|>{{ "\\n" }}
    {{- else if eq .Role "assistant" }}<|im_start|>assistant{{ "\\n" }}
        {{- if $noThink }}<think>«NL»«NL»</think>«NL»{{ end }}
        {{- if .Thinking }}<think>«NL»{{ .Thinking }}«NL»</think>{{ end }}{{ .Content }}
        {{- if not $last }}<|im_end|>{{ "\\n" }}{{ end }}
    {{- else if eq .Role "tool" }}<|im_start|>user{{ "\\n" }}{{ .Content }}<|im_end|>{{ "\\n" }}
    {{- end }}
    {{- if ne .Role "system" }}{{ $prev = .Role }}{{ end }}
{{- end }}
{{- if ne $prev "assistant" }}<|im_start|>assistant{{ "\\n" }}{{ if $noThink }}<think>«NL»«NL»</think>«NL»{{ end }}{{ end }}
""",
        HEAD0=golit(_SMOL_HEAD[0]), HEAD1=golit(_SMOL_HEAD[1]), HEAD2=golit(_SMOL_HEAD[2]),
        SHORT=golit(defaults[1]), LONG=golit(defaults[0]),
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="smollm3",
    title="SmolLM3 (ChatML; Reasoning Mode /think or /no_think; no tool calling in this template)",
    detect=_detect_smollm3,
    build=_build_smollm3,
    stop=("<|im_end|>", "<|im_start|>"),
    thinking=True,
    markers=("<|im_start|>", "<|im_end|>", "Knowledge Cutoff Date: June 2025", "Reasoning Mode: ",
             "named SmolLM", "/no_think"),
    tool_calls="none: this template prints neither tools nor tool calls (tool results go in as user turns)",
    notes=(
        "the Jinja switches to /no_think or /think when the system prompt contains that word, and removes it; Go "
        "templates cannot search strings, so the TEMPLATE follows Ollama's think setting only and prints the "
        "system prompt as given",
        "the Jinja strips line breaks at the start of assistant contents and trailing whitespace of the system "
        "prompt; Go templates cannot",
        "the Jinja prints reasoning kept inside assistant contents; the TEMPLATE prints Ollama's .Thinking in "
        "<think>…</think> before the content, which is the same text",
    ),
))


# ---------------------------------------------------------------- Granite 4.0 / 4.1 (<|start_of_role|>, <tool_call>)

_GRANITE4_PREFIX = (
    "You are a helpful assistant with access to the following tools. You may call one or more tools to assist "
    "with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_GRANITE4_SUFFIX = (
    '\n</tools>\n\nFor each tool call, return a json object with function name and arguments within '
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    '<args-json-object>}\n</tool_call>. If a tool does not exist in the provided list of tools, notify the user '
    "that you do not have the ability to fulfill the request."
)
_GRANITE4_DEFAULT = "You are a helpful assistant. Please ensure responses are professional, accurate, and safe."


def _detect_granite4(src: str) -> bool:
    strings = _jinja_strings(src)
    return (
        _has_all(src, "<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "tools_system_message_prefix",
                 "ns.tools_system_message + '\\n' + (tool | tojson)", "(loop.first and content.val) or (not loop.first)",
                 "tool_call.arguments | tojson", "messages[loop.index0 - 1].role != 'tool'")
        and _GRANITE4_PREFIX in strings and _GRANITE4_SUFFIX in strings
        and _has_none(src, "<think>", "enable_thinking", "<|tool_call|>")
    )


def _build_granite4(src: str, tokens: TemplateTokens) -> str:
    default = ""
    if f"g4_default_system_message = '{_GRANITE4_DEFAULT}'" in src:  # Granite 4.0 (4.1 prints no system turn)
        default = f'<|start_of_role|>system<|end_of_role|>{golit(_GRANITE4_DEFAULT)}<|end_of_text|>{{{{ "\\n" }}}}'
    return json_defines() + _fill(
        """
{{- $msgs := .Messages }}{{ $first := "" }}{{ if $msgs }}{{ $first = (index $msgs 0).Role }}{{ end }}
{{- $sys := "" }}{{ if eq $first "system" }}{{ $sys = (index $msgs 0).Content }}{{ end }}
{{- if or $sys .Tools }}<|start_of_role|>system<|end_of_role|>{{ $sys }}
    {{- if .Tools }}{{ if eq $first "system" }}{{ "\\n\\n" }}{{ end }}«PREFIX»{{ range .Tools }}{{ "\\n" }}{{ template "mm_tool" . }}{{ end }}«SUFFIX»{{ end }}
    {{- "<|end_of_text|>\\n" }}
{{- else }}«DEFAULT»{{ end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if or (eq .Role "user") (and (eq .Role "system") $i) }}<|start_of_role|>{{ .Role }}<|end_of_role|>{{ .Content }}<|end_of_text|>{{ "\\n" }}
    {{- else if eq .Role "assistant" }}<|start_of_role|>assistant<|end_of_role|>{{ .Content }}
        {{- if and $m.Content $m.ToolCalls }}{{ "\\n" }}{{ end }}
        «CALLS»
        {{- if not (and $last (not $m.ToolCalls)) }}<|end_of_text|>{{ "\\n" }}{{ end }}
    {{- else if eq .Role "tool" }}
        {{- if ne $prev "tool" }}<|start_of_role|>user<|end_of_role|>{{ end }}
        {{- "\\n<tool_response>\\n" }}{{ .Content }}{{ "\\n</tool_response>" }}
        {{- if ne $next "tool" }}<|end_of_text|>{{ "\\n" }}{{ end }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<|start_of_role|>assistant<|end_of_role|>{{ end }}
""",
        PREFIX=golit(_GRANITE4_PREFIX), SUFFIX=golit(_GRANITE4_SUFFIX), DEFAULT=default or '{{- "" }}',
        LOOP_HEAD=_LOOP_HEAD, CALLS=_QWEN3_CALLS,
    )


register(ChatFamily(
    name="granite4",
    title="Granite 4.0 / 4.1 (<|start_of_role|>…<|end_of_role|>, tools in the system turn, <tool_call> JSON)",
    detect=_detect_granite4,
    build=_build_granite4,
    stop=("<|end_of_text|>", "<|start_of_role|>"),
    markers=("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "<tool_call>", "<tool_response>",
             "tools_system_message_prefix"),
    tool_calls="TEMPLATE: Ollama's tool parser reads the <tool_call> tag from the TEMPLATE",
    notes=("Ollama has no documents: the Jinja's <documents> system section is never printed",),
))


# ---------------------------------------------------------------- Bielik v3 (ChatML, Polish tool and thinking prompts)

_BIELIK_TOOLS = (
    "\n\nMasz dostęp do następujących narzędzi. Definicje narzędzi znajdują się poniżej wewnątrz znaczników "
    "<|function_list|>:\n<|function_list|>\n"
)
_BIELIK_TOOLS_TAIL_START = "]\n<|function_list|>\n\nAby wywołać narzędzie"


def _bielik_texts(src: str) -> tuple[str, str] | None:
    """(the text after the tool list, the thinking instructions), read from the Jinja."""
    strings = _jinja_strings(src)
    tail = [t for t in strings if t.startswith(_BIELIK_TOOLS_TAIL_START)]
    at = next((i for i, t in enumerate(strings) if t.startswith("\n\nZanim odpowiesz")), None)
    if len(tail) != 1 or at is None or _BIELIK_TOOLS not in strings:
        return None
    return tail[0], "".join(strings[at:at + 5])


def _detect_bielik(src: str) -> bool:
    return (
        _has_all(src, "<|im_start|>", "<|function_list|>", "<|function_output|>", "reasoning_content.strip()",
                 "content.lstrip()", "{%- if enable_thinking %}", "{{- ',\\n' }}", "messages[loop_start_index:]")
        and _bielik_texts(src) is not None
    )


def _build_bielik(src: str, tokens: TemplateTokens) -> str:
    texts = _bielik_texts(src)
    assert texts is not None
    return json_defines() + _fill(
        """
{{- $msgs := .Messages }}{{ $sys := "" }}
{{- if and $msgs (eq (index $msgs 0).Role "system") }}{{ $sys = (index $msgs 0).Content }}{{ end }}
{{- «BOS» }}
{{- $prev2 := "" }}
{{- if or $sys .Tools }}<|im_start|>system{{ "\\n" }}{{ $sys }}
    {{- if .Tools }}«TOOLS»[{{ range $j, $t := .Tools }}{{ if $j }}{{ ",\\n" }}{{ end }}{{ template "mm_tool" . }}{{ end }}«TAIL»{{ end }}
    {{- if .Think }}«THINK»{{ end }}<|im_end|>{{ "\\n" }}
{{- end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}<|im_start|>user{{ "\\n" }}{{ .Content }}<|im_end|>{{ "\\n" }}
    {{- else if eq .Role "assistant" }}<|im_start|>assistant{{ "\\n" }}
        {{- if .Thinking }}<think>«NL»{{ .Thinking }}«NL»</think>«NL»{{ end }}{{ .Content }}
        {{- if .ToolCalls }}{{ range .ToolCalls }}«NL»<tool_call>«NL»{"name": "{{ .Function.Name }}", "arguments": {{ template "mm_args" .Function.Arguments }}}«NL»</tool_call>{{ end }}{{ end }}
        {{- if not (and $last (not $m.ToolCalls)) }}<|im_end|>{{ "\\n" }}{{ end }}
    {{- else if and (eq .Role "tool") $sys }}
        {{- if or (eq $i 1) (ne $prev2 "tool") }}<|im_start|>user{{ "\\n" }}{{ end }}<|function_output|>{{ .Content }}
        {{- if $last }}<|im_end|>{{ "\\n" }}{{ end }}
    {{- else if eq .Role "tool" }}
        {{- if ne $prev "tool" }}<|im_start|>user{{ "\\n" }}{{ end }}<|function_output|>{{ .Content }}
        {{- if ne $next "tool" }}<|im_end|>{{ "\\n" }}{{ end }}
    {{- end }}
    {{- $prev2 = $prev }}{{ $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<|im_start|>assistant{{ "\\n" }}{{ if .Think }}<think>{{ "\\n" }}{{ end }}{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        TOOLS=golit(_BIELIK_TOOLS), TAIL=golit(texts[0]), THINK=golit(texts[1]),
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="bielik",
    title="Bielik v3 (ChatML; Polish tool and thinking instructions, <tool_call>, <|function_output|>)",
    detect=_detect_bielik,
    build=_build_bielik,
    stop=("<|im_end|>", "<|im_start|>"),
    bos_in_template=True,
    thinking=True,
    content_none_ok=False,
    markers=("<|im_start|>", "<|im_end|>", "<tool_call>", "<|function_list|>", "<|function_output|>", "<think>"),
    tool_calls="TEMPLATE: Ollama's tool parser reads the <tool_call> tag from the TEMPLATE",
    notes=(
        "the Jinja strips whitespace around kept reasoning and at the start of assistant contents; Go templates "
        "cannot",
        "the Jinja ignores later system messages; so does the TEMPLATE",
        "after a system message the Jinja looks at tool neighbours one place off (it indexes the whole list while "
        "looping over the rest), so tool results stay open until the end; the TEMPLATE does the same",
        "the Jinja leaves out the system turn, and with it the thinking instructions, when there is neither a "
        "system message nor tools; so does the TEMPLATE",
    ),
))


# ---------------------------------------------------------------- Granite 3.3 (<|start_of_role|>, available_tools role)

_GRANITE33_BASE = ("Knowledge Cutoff Date: April 2024. Today's Date: ", ". You are Granite, developed by IBM.")
_GRANITE33_TOOLS = " You are a helpful assistant with access to the following tools. When a tool is required"
_GRANITE33_PLAIN = " You are a helpful AI assistant."
_GRANITE33_THINK = " You are a helpful AI assistant.\nRespond to every user query in a comprehensive and detailed way."


def _granite33_texts(src: str) -> tuple[str, str] | None:
    """(the tools sentence, the thinking instructions) the Jinja appends to its default system prompt."""
    strings = _jinja_strings(src)
    tools = [t for t in strings if t.startswith(_GRANITE33_TOOLS) and "documents" not in t]
    think = [t for t in strings if t.startswith(_GRANITE33_THINK)]
    return (tools[0], think[0]) if len(tools) == 1 and len(think) == 1 else None


def _detect_granite33(src: str) -> bool:
    strings = _jinja_strings(src)
    return (
        _has_all(src, "<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "strftime_now('%B %d, %Y')",
                 "<|start_of_role|>available_tools<|end_of_role|>", "available_tools | tojson(indent=4)",
                 "{%- elif thinking %}", "{%- if loop.last and add_generation_prompt %}")
        and all(t in strings for t in (*_GRANITE33_BASE, _GRANITE33_PLAIN))
        and _granite33_texts(src) is not None
        and _has_none(src, "tool_calls", "<tool_call>")
    )


def _build_granite33(src: str, tokens: TemplateTokens) -> str:
    texts = _granite33_texts(src)
    assert texts is not None
    return json_defines(indent=True, tool_depths=(1,)) + _fill(
        """
{{- $msgs := .Messages }}{{ $hasSys := and $msgs (eq (index $msgs 0).Role "system") }}
{{- "<|start_of_role|>system<|end_of_role|>" }}
{{- if $hasSys }}{{ (index $msgs 0).Content }}{{ $msgs = slice $msgs 1 }}
{{- else }}«BASE0»{{ currentDate }}«BASE1»{{ if .Tools }}«TOOLS»{{ else if .Think }}«THINK»{{ else }}«PLAIN»{{ end }}
{{- end }}<|end_of_text|>{{ "\\n" }}
{{- if .Tools }}<|start_of_role|>available_tools<|end_of_role|>[
    {{- range $j, $t := .Tools }}{{ if $j }},{{ end }}{{ "\\n    " }}{{ template "mm_tool_i1" . }}{{ end }}{{ "\\n]" }}<|end_of_text|>{{ "\\n" }}
{{- end }}
{{- /* Never renders: the model calls tools as <|tool_call|>[…], the tag Ollama's tool parser waits for. */}}
{{- if false }}{{ if .ToolCalls }}<|tool_call|>[{{ range .ToolCalls }}{{ .Function.Name }}{{ end }}]{{ end }}{{ end }}
{{- range $i, $m := $msgs }}
    «LOOP_HEAD»
    {{- "<|start_of_role|>" }}{{ .Role }}<|end_of_role|>{{ .Content }}
    {{- if not (and $last (eq .Role "assistant")) }}<|end_of_text|>{{ "\\n" }}{{ end }}
    {{- if and $last (ne .Role "assistant") }}<|start_of_role|>assistant<|end_of_role|>{{ end }}
{{- end }}
""",
        BASE0=golit(_GRANITE33_BASE[0]), BASE1=golit(_GRANITE33_BASE[1]),
        TOOLS=golit(texts[0]), THINK=golit(texts[1]), PLAIN=golit(_GRANITE33_PLAIN),
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="granite3.3",
    title="Granite 3.3 (<|start_of_role|>…<|end_of_role|>, tools as an available_tools turn, thinking switch)",
    detect=_detect_granite33,
    build=_build_granite33,
    stop=("<|end_of_text|>", "<|start_of_role|>"),
    think_variable="thinking",
    jinja_date="%B %d, %Y",
    content_none_ok=False,
    markers=("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "available_tools",
             "You are Granite, developed by IBM."),
    tool_calls="TEMPLATE: the model answers <|tool_call|>[…]; a never-rendered block names that tag for Ollama's "
               "tool parser (the Jinja prints no tool calls in the history)",
    notes=(
        "the Jinja prints today's date as '%B %d, %Y' through strftime_now; Ollama's currentDate is always "
        "YYYY-MM-DD, so the default system prompt has the same date in ISO form",
        "the Jinja prints no tool calls in assistant history (only their content); neither does the TEMPLATE",
        "Ollama has no documents or controls: the Jinja's document turns and citation/hallucination "
        "instructions are never printed",
    ),
))


# ---------------------------------------------------------------- LFM2.5 Instruct (ChatML, "List of tools: [...]")


def _detect_lfm25(src: str) -> bool:
    return (
        _has_all(src, "<|im_start|>", "<|im_end|>", "keep_past_thinking | default(false)", '"List of tools: ["',
                 "ns.last_assistant_index = loop.index0", 'content.split("</think>")[-1] | trim',
                 '("\\n" if ns.system_prompt else "")')
        and _has_none(src, "<|tool_list_start|>", "<|tool_call_start|>", "{%- generation", "tool_calls")
    )


def _build_lfm25(src: str, tokens: TemplateTokens) -> str:
    return json_defines() + _fill(
        """
{{- $msgs := .Messages }}{{ $sys := "" }}{{ $hasSys := and $msgs (eq (index $msgs 0).Role "system") }}
{{- if $hasSys }}{{ $sys = (index $msgs 0).Content }}{{ end }}
{{- $lastA := -1 }}{{ range $i, $m := $msgs }}{{ if eq .Role "assistant" }}{{ $lastA = $i }}{{ end }}{{ end }}
{{- «BOS» }}
{{- if or $sys .Tools }}<|im_start|>system{{ "\\n" }}{{ $sys }}
    {{- if .Tools }}{{ if $sys }}{{ "\\n" }}{{ end }}List of tools: [{{ range $j, $t := .Tools }}{{ if $j }}, {{ end }}{{ template "mm_tool" . }}{{ end }}]{{ end }}<|im_end|>{{ "\\n" }}
{{- end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if or $i (not $hasSys) }}<|im_start|>{{ .Role }}{{ "\\n" }}
        {{- if and (eq .Role "assistant") (eq $i $lastA) .Thinking }}<think>«NL»{{ .Thinking }}«NL»</think>{{ end }}{{ .Content }}
        {{- if not (and $last (eq .Role "assistant")) }}<|im_end|>{{ "\\n" }}{{ end }}
        {{- $prev = .Role }}
    {{- end }}
{{- end }}
{{- if ne $prev "assistant" }}<|im_start|>assistant{{ "\\n" }}{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        LOOP_HEAD=_LOOP_HEAD,
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
    tool_calls="PARSER lfm2 returns structured tool_calls (<|tool_call_start|>[…]<|tool_call_end|>); the Jinja "
               "prints no tool calls in the history, and neither does the TEMPLATE",
    notes=(
        "the Jinja keeps the reasoning of the last assistant turn inside its content and trims earlier contents "
        "after cutting it; the TEMPLATE prints .Thinking in <think>…</think> on the last assistant turn only and "
        "cannot trim",
        "the Jinja prints a tool-call message's None content as 'null'; with '' (what Ollama holds) both print "
        "nothing",
        "keep_past_thinking is not an Ollama setting: the TEMPLATE follows its default (false)",
    ),
))


# ---------------------------------------------------------------- Step 3.5 Flash (ChatML, XML tool calls; PARSER qwen3.5)

_STEP_TOOLS_HEAD = "# Tools\n\nYou have access to the following functions in JSONSchema format:\n\n<tools>"
_STEP_TOOLS_TAIL = "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:"
# A tool-call argument as the Jinja prints it: mappings and lists as JSON, anything else as Python's str().
_PYSTR_DEFINE = (
    '{{- define "mm_pystr" }}{{ $t := printf "%T" . }}{{ if eq $t "string" }}{{ . }}'
    '{{ else if or (eq $t "map[string]interface {}") (eq $t "[]interface {}") }}{{ template "mm_json" . }}'
    '{{ else if eq $t "bool" }}{{ if . }}True{{ else }}False{{ end }}{{ else if eq $t "<nil>" }}None'
    '{{ else }}{{ json . }}{{ end }}{{ end }}\n'
)


def _step_tail(src: str) -> str | None:
    found = [t for t in _jinja_strings(src) if t.startswith(_STEP_TOOLS_TAIL)]
    return found[0] if len(found) == 1 else None


def _detect_step35(src: str) -> bool:
    return (
        _has_all(src, "<|im_start|>", "<|im_end|>", "<|im_start|>tool_response\\n", "'<tool_call>\\n<function='",
                 "'<parameter=' + args_name + '>\\n'", "multi_step_tool=true", "'\\n<think>\\n' + reasoning_content",
                 "{{- '<|im_start|>assistant\\n<think>\\n' }}", "message.name == 'observation'")
        and _STEP_TOOLS_HEAD in _jinja_strings(src) and _step_tail(src) is not None
    )


def _build_step35(src: str, tokens: TemplateTokens) -> str:
    tail = _step_tail(src)
    assert tail is not None
    return json_defines() + _PYSTR_DEFINE + _fill(
        """
{{- $msgs := .Messages }}{{ $first := "" }}{{ if $msgs }}{{ $first = (index $msgs 0).Role }}{{ end }}
{{- «BOS» }}
{{- if .Tools }}<|im_start|>system{{ "\\n" }}
    {{- if eq $first "system" }}{{ (index $msgs 0).Content }}{{ "\\n\\n" }}{{ end }}
    {{- «HEAD» }}{{ range .Tools }}{{ "\\n" }}{{ template "mm_tool" . }}{{ end }}«TAIL»
{{- else if eq $first "system" }}<|im_start|>system{{ "\\n" }}{{ (index $msgs 0).Content }}<|im_end|>{{ "\\n" }}
{{- end }}
{{- $lastQuery := -1 }}{{ range $i, $m := $msgs }}{{ if eq .Role "user" }}{{ $lastQuery = $i }}{{ end }}{{ end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if or (eq .Role "user") (and (eq .Role "system") $i) }}<|im_start|>{{ .Role }}{{ "\\n" }}{{ .Content }}<|im_end|>{{ "\\n" }}
    {{- else if eq .Role "assistant" }}<|im_start|>assistant{{ "\\n" }}
        {{- if gt $i $lastQuery }}<think>«NL»{{ .Thinking }}«NL»</think>«NL»{{ end }}{{ .Content }}
        {{- if .ToolCalls }}{{ range .ToolCalls }}<tool_call>«NL»<function={{ .Function.Name }}>{{ "\\n" }}
            {{- range $k, $v := .Function.Arguments }}<parameter={{ $k }}>«NL»{{ template "mm_pystr" $v }}«NL»</parameter>«NL»{{ end }}
            {{- "</function>\\n</tool_call>" }}{{ end }}{{ end }}
        {{- if not (and $last (not $m.ToolCalls)) }}<|im_end|>{{ "\\n" }}{{ end }}
    {{- else if eq .Role "tool" }}
        {{- if ne $prev "tool" }}<|im_start|>tool_response{{ "\\n" }}{{ end }}<tool_response>{{ .Content }}</tool_response>
        {{- if ne $next "tool" }}<|im_end|>{{ "\\n" }}{{ end }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<|im_start|>assistant{{ "\\n" }}<think>{{ "\\n" }}{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        HEAD=golit(_STEP_TOOLS_HEAD)[3:-3],
        TAIL=golit(tail),
        LOOP_HEAD=_LOOP_HEAD,
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
    tool_calls="PARSER qwen3.5 returns the <think> reasoning and the XML tool calls as structured tool_calls",
    notes=(
        "the Jinja counts a user message that is wholly '<tool_response>…</tool_response>' as no query; Go "
        "templates cannot test a suffix, so the TEMPLATE counts every user message",
        "the Jinja renames a later system message named 'observation'; Ollama messages carry no name",
        "tool-call arguments print as Python's str(); numbers print as JSON does (1e21 and beyond differ)",
        "the Jinja always opens <think>; Ollama's think=false cannot switch it off",
    ),
))


# ---------------------------------------------------------------- Kimi K2 (<|im_system|>/<|im_user|>/<|im_assistant|>)


def _detect_kimi_k2(src: str) -> bool:
    return _has_all(
        src, "<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>",
        "<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>", "<|im_user|>user<|im_middle|>",
        "<|im_assistant|>assistant<|im_middle|>", "<|im_system|>tool<|im_middle|>", "<|tool_calls_section_begin|>",
        "'functions.' + func_name + ':' + loop.index0|string", "## Return of {{ message.tool_call_id }}\\n{{",
    ) and _has_none(src, "<think>", "reasoning_content", "toolcall_")


def _build_kimi_k2(src: str, tokens: TemplateTokens) -> str:
    return json_defines() + _fill(
        """
{{- if .Tools }}<|im_system|>tool_declare<|im_middle|>[{{ range $j, $t := .Tools }}{{ if $j }}, {{ end }}{{ template "mm_tool" . }}{{ end }}]<|im_end|>{{ end }}
{{- $msgs := .Messages }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if and (eq $i 0) (ne .Role "system") }}<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>{{ end }}
    {{- if eq .Role "system" }}<|im_system|>system<|im_middle|>{{ .Content }}
    {{- else if eq .Role "user" }}<|im_user|>user<|im_middle|>{{ .Content }}
    {{- else if eq .Role "assistant" }}<|im_assistant|>assistant<|im_middle|>{{ .Content }}
        {{- if .ToolCalls }}<|tool_calls_section_begin|>{{ range $j, $c := .ToolCalls }}<|tool_call_begin|>functions.{{ .Function.Name }}:{{ $j }}<|tool_call_argument_begin|>{{ template "mm_args" .Function.Arguments }}<|tool_call_end|>{{ end }}<|tool_calls_section_end|>{{ end }}
    {{- else if eq .Role "tool" }}<|im_system|>tool<|im_middle|>## Return of {{ .ToolCallID }}{{ "\\\\n" }}{{ .Content }}
    {{- end }}
    {{- if not (and $last (eq .Role "assistant") (not $m.ToolCalls)) }}<|im_end|>{{ end }}
    {{- if and $last (ne .Role "assistant") }}<|im_assistant|>assistant<|im_middle|>{{ end }}
{{- end }}
""",
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="kimi-k2",
    title="Kimi K2 Instruct (<|im_system|>/<|im_user|>/<|im_assistant|>, tool_declare, <|tool_call_begin|>)",
    detect=_detect_kimi_k2,
    build=_build_kimi_k2,
    stop=("<|im_end|>",),
    markers=("<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|tool_calls_section_begin|>",
             "tool_declare"),
    tool_calls="TEMPLATE: Ollama's tool parser waits for <|tool_calls_section_begin|>, but the calls inside are "
               "not plain JSON and Ollama ships no Kimi PARSER, so structured tool_calls are not guaranteed",
    notes=("the Jinja writes a literal backslash-n after '## Return of <id>' (it is template text, not an "
           "escape); so does the TEMPLATE",),
))


# ---------------------------------------------------------------- Spark 2.5 (<|System|>/<|User|>/<|Bot|>, GLM-style calls)

_ARGVAL_DEFINE = (
    '{{- define "mm_argval" }}{{ if eq (printf "%T" .) "string" }}{{ . }}{{ else }}{{ template "mm_json" . }}'
    '{{ end }}{{ end }}\n'
)


def _detect_spark(src: str) -> bool:
    return _has_all(
        src, "'<｜start▁of▁sentence｜><|System|>' + '\\n' + default_system", "set default_system = 'you are a helpful assistant.'",
        "'## Tools' + '\\n' + 'You have access to the following functions:' + '\\n' + '<tools>'",
        "'\\n' + tool.function | tojson", "'<｜start▁of▁sentence｜><|Bot|>'", "'<tool_call>' + tool_call.function.name",
        "'<arg_key>' ~ k ~ '</arg_key><arg_value>' ~ (v if v is string else v | tojson) ~ '</arg_value>'",
        "enable_thinking | default(true)", "message.reasoning_content",
    )


def _build_spark(src: str, tokens: TemplateTokens) -> str:
    sos, eos = "<｜start▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
    return json_defines() + _ARGVAL_DEFINE + _fill(
        """
{{- $msgs := .Messages }}{{ $sys := "" }}{{ if and $msgs (eq (index $msgs 0).Role "system") }}{{ $sys = (index $msgs 0).Content }}{{ end }}
{{- "«SOS»<|System|>\\nyou are a helpful assistant." }}
{{- if .Tools }}{{ "## Tools\\nYou have access to the following functions:\\n<tools>" }}{{ range .Tools }}{{ "\\n" }}{{ template "mm_function" .Function }}{{ end }}{{ "\\n</tools>" }}{{ end }}
{{- if $sys }}{{ "\\n\\n" }}{{ $sys }}{{ end }}«EOS»
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if and (eq .Role "system") $i }}«SOS»<|System|>{{ "\\n" }}{{ .Content }}«EOS»
    {{- else if eq .Role "user" }}«SOS»<|User|>{{ .Content }}«EOS»
    {{- else if eq .Role "assistant" }}«SOS»<|Bot|>{{ if .Thinking }}<think>{{ .Thinking }}</think>{{ else }}</think>{{ end }}{{ .Content }}
        {{- if .ToolCalls }}{{ range .ToolCalls }}<tool_call>{{ .Function.Name }}{{ range $k, $v := .Function.Arguments }}<arg_key>{{ $k }}</arg_key><arg_value>{{ template "mm_argval" $v }}</arg_value>{{ end }}</tool_call>{{ end }}{{ end }}
        {{- if not (and $last (not $m.ToolCalls)) }}«EOS»{{ end }}
    {{- else if eq .Role "tool" }}
        {{- if ne $prev "tool" }}«SOS»<|Tool|>{{ end }}<tool_response>{{ .Content }}</tool_response>
        {{- if ne $next "tool" }}«EOS»{{ end }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}«SOS»<|Bot|>{{ if and .IsThinkSet (not .Think) }}</think>{{ else }}<think>{{ end }}{{ end }}
""",
        SOS=sos, EOS=eos, LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="spark2.5",
    title="Spark 2.5 (<｜start▁of▁sentence｜><|System|>/<|User|>/<|Bot|>, <think>, <arg_key>/<arg_value> tool calls)",
    detect=_detect_spark,
    build=_build_spark,
    stop=("<｜end▁of▁sentence｜>",),
    thinking=True,
    reasoning_key="reasoning_content",
    markers=("<|System|>", "<|User|>", "<|Bot|>", "<|Tool|>", "<arg_key>", "<tool_call>"),
    tool_calls="TEMPLATE: Ollama's tool parser reads the <tool_call> tag; the <arg_key>/<arg_value> pairs are not "
               "JSON, so structured tool_calls need a PARSER Ollama does not ship for this family",
    notes=("the Jinja prints its own <｜start▁of▁sentence｜> before every turn; the TEMPLATE does the same",),
))


# ---------------------------------------------------------------- Ling 3.0 / Bailing V3 (<role>…</role>, detailed thinking)

_LING_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\n<tools>"
)
_LING_TOOLS_TAIL_START = "\n</tools>\n\nIf none of the functions can be used, point it out."


def _ling_tail(src: str) -> str | None:
    found = [t for t in _jinja_strings(src) if t.startswith(_LING_TOOLS_TAIL_START)]
    return found[0] if len(found) == 1 else None


def _detect_ling(src: str) -> bool:
    return (
        _has_all(src, "{#- Bailing V3 chat template -#}", "'<role>SYSTEM</role>'", "'<role>HUMAN</role>'",
                 "'<role>ASSISTANT</role>\\n<think></think>'", "'<role>OBSERVATION</role>'", "<|role_end|>",
                 "{% set preserved_thinking = true %}", "'detailed thinking ' + thinking_option + '<|role_end|>'",
                 "'\\n<arg_value>'")
        and _LING_TOOLS_HEAD in _jinja_strings(src) and _ling_tail(src) is not None
    )


def _build_ling(src: str, tokens: TemplateTokens) -> str:
    tail = _ling_tail(src)
    assert tail is not None
    return json_defines() + _ARGVAL_DEFINE + _fill(
        """
{{- $msgs := .Messages }}{{ $sys := false }}{{ if and $msgs (eq (index $msgs 0).Role "system") }}{{ $sys = true }}{{ end }}
{{- $opt := "on" }}{{ if and .IsThinkSet (not .Think) }}{{ $opt = "off" }}{{ end }}
{{- "<role>SYSTEM</role>" }}{{ if $sys }}{{ (index $msgs 0).Content }}{{ "\\n" }}{{ end }}
{{- if .Tools }}«HEAD»{{ range .Tools }}{{ "\\n" }}{{ template "mm_tool" . }}{{ end }}«TAIL»{{ end }}
{{- "detailed thinking " }}{{ $opt }}<|role_end|>
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}<role>HUMAN</role>{{ .Content }}<|role_end|>
    {{- else if and (eq .Role "system") $i }}<role>SYSTEM</role>{{ .Content }}<|role_end|>
    {{- else if eq .Role "assistant" }}<role>ASSISTANT</role>{{ "\\n" }}<think>{{ .Thinking }}</think>{{ .Content }}
        {{- if .ToolCalls }}{{ range $j, $c := .ToolCalls }}{{ if or $j $m.Content }}{{ "\\n" }}{{ end }}<tool_call>{{ .Function.Name }}{{ "\\n" }}
            {{- range $k, $v := .Function.Arguments }}<arg_key>{{ $k }}</arg_key>{{ "\\n" }}<arg_value>{{ template "mm_argval" $v }}</arg_value>{{ end }}
            {{- "\\n</tool_call>" }}{{ end }}{{ end }}
        {{- if not (and $last (not $m.ToolCalls)) }}<|role_end|>{{ end }}
        «THINK_TAGS»
    {{- else if eq .Role "tool" }}
        {{- if ne $prev "tool" }}<role>OBSERVATION</role>{{ end }}{{ "\\n<tool_response>\\n" }}{{ .Content }}{{ "\\n</tool_response>" }}
        {{- if ne $next "tool" }}<|role_end|>{{ end }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<role>ASSISTANT</role>{{ "\\n" }}<think>{{ if eq $opt "off" }}</think>{{ end }}{{ end }}
""",
        HEAD=golit(_LING_TOOLS_HEAD), TAIL=golit(tail), LOOP_HEAD=_LOOP_HEAD, THINK_TAGS=_THINK_TAGS,
    )


register(ChatFamily(
    name="ling3",
    title="Ling 3.0 / Bailing V3 (<role>SYSTEM|HUMAN|ASSISTANT|OBSERVATION</role>, detailed thinking on/off)",
    detect=_detect_ling,
    build=_build_ling,
    stop=("<|role_end|>", "<role>HUMAN</role>"),
    thinking=True,
    markers=("<role>SYSTEM</role>", "<role>HUMAN</role>", "<role>ASSISTANT</role>", "<|role_end|>",
             "detailed thinking ", "<arg_key>"),
    tool_calls="none structured: the calls are <tool_call> blocks of <arg_key>/<arg_value> pairs, not JSON, and "
               "Ollama ships no Ling PARSER",
    notes=(
        "the Jinja leaves out its 'detailed thinking on/off' line when the system prompt already says it; Go "
        "templates cannot search strings, so the TEMPLATE always writes the line from Ollama's think setting",
        "the Jinja strips line breaks around the reasoning and at the start of contents; Go templates cannot",
        "the Jinja counts a user message that is wholly '<tool_response>…</tool_response>' as no query, which "
        "only matters when preserved_thinking is off; it is always on in this template",
    ),
))


# ---------------------------------------------------------------- GLM-4.6 ([gMASK]<sop>, /nothink, <arg_key>/<arg_value>)

_GLM46_TOOLS_HEAD = (
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
    "with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
_GLM46_TOOLS_TAIL = (
    "</tools>\n\nFor each function call, output the function name and arguments within the following XML format:\n"
    "<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n"
    "<arg_key>{arg-key-2}</arg_key>\n<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>"
)


def _detect_glm46(src: str) -> bool:
    return _has_all(
        src, "[gMASK]<sop>", _GLM46_TOOLS_HEAD.replace("<tools>\n", "<tools>\n{% for tool in tools %}"),
        _GLM46_TOOLS_TAIL, "'/nothink' if (enable_thinking is defined and not enable_thinking",
        "{{ '\\n<think>' + reasoning_content.strip() +  '</think>'}}", "{{ '\\n' + content.strip() }}",
        "{{ '\\n<tool_call>' + tc.name }}", "<arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}",
        "<|assistant|>{{- '\\n<think></think>' if (enable_thinking is defined and not enable_thinking) else '' -}}",
    ) and _has_none(src, "clear_thinking")


def _build_glm46(src: str, tokens: TemplateTokens) -> str:
    return json_defines() + _ARGVAL_DEFINE + _fill(
        """
{{- $msgs := .Messages }}{{ $noThink := and .IsThinkSet (not .Think) }}
{{- "[gMASK]<sop>" }}
{{- if .Tools }}«HEAD»{{ range .Tools }}{{ template "mm_tool" . }}{{ "\\n" }}{{ end }}«TAIL»{{ end }}
{{- $lastUser := -1 }}{{ range $i, $m := $msgs }}{{ if eq .Role "user" }}{{ $lastUser = $i }}{{ end }}{{ end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}<|user|>{{ "\\n" }}{{ .Content }}{{ if $noThink }}/nothink{{ end }}
    {{- else if eq .Role "assistant" }}<|assistant|>
        {{- if and (gt $i $lastUser) .Thinking }}«NL»<think>{{ .Thinking }}</think>{{ else }}«NL»<think></think>{{ end }}
        {{- if .Content }}{{ "\\n" }}{{ .Content }}{{ end }}
        {{- if .ToolCalls }}{{ range .ToolCalls }}«NL»<tool_call>{{ .Function.Name }}{{ "\\n" }}
            {{- range $k, $v := .Function.Arguments }}<arg_key>{{ $k }}</arg_key>{{ "\\n" }}<arg_value>{{ template "mm_argval" $v }}</arg_value>{{ "\\n" }}{{ end }}
            {{- "</tool_call>" }}{{ end }}{{ end }}
    {{- else if eq .Role "tool" }}
        {{- if ne $prev "tool" }}<|observation|>{{ end }}{{ "\\n<tool_response>\\n" }}{{ .Content }}{{ "\\n</tool_response>" }}
    {{- else if eq .Role "system" }}<|system|>{{ "\\n" }}{{ .Content }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<|assistant|>{{ if $noThink }}{{ "\\n" }}<think></think>{{ end }}{{ end }}
""",
        HEAD=golit(_GLM46_TOOLS_HEAD), TAIL=golit(_GLM46_TOOLS_TAIL), LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="glm-4.6",
    title="GLM-4.6 ([gMASK]<sop>, <|user|>/<|assistant|>/<|observation|>, /nothink, <arg_key>/<arg_value> calls)",
    detect=_detect_glm46,
    build=_build_glm46,
    stop=("<|user|>", "<|observation|>", "<|endoftext|>"),
    thinking=True,
    content_none_ok=False,
    markers=("[gMASK]<sop>", "<|observation|>", "<arg_key>", "<arg_value>", "/nothink"),
    tool_calls="none structured: <tool_call> blocks of <arg_key>/<arg_value> pairs are not JSON; Ollama's "
               "glm-4.7 PARSER reads this format but modelmint has not checked it against GLM-4.6",
    notes=(
        "the Jinja strips whitespace around reasoning and contents; Go templates cannot",
        "the Jinja prints a None content as 'None'; with '' (what Ollama holds) both print nothing",
        "the Jinja adds '/nothink' to a user message only when it does not already end with it; Go templates "
        "cannot test a suffix, so the TEMPLATE always adds it when thinking is off",
    ),
))


# ---------------------------------------------------------------- RWKV World (System: / User: / Assistant:)


def _detect_rwkv(src: str) -> bool:
    return _has_all(
        src, "{{- 'System: ' + ns.system_prompt + '\\n\\n' -}}", "{{- 'User: ' + message['content']|trim + '\\n\\n' -}}",
        "{{- 'Assistant: ' + content|trim + '\\n\\n' -}}", "{{- 'Assistant:' -}}", "{{- ' <think>\\n</think>' }}",
        "{{- ' <think>' }}", "message['content'] is  not none",
    ) and _has_none(src, "tool")


def _build_rwkv(src: str, tokens: TemplateTokens) -> str:
    return _fill(
        """
{{- $msgs := .Messages }}{{ $sys := "" }}{{ range $msgs }}{{ if eq .Role "system" }}{{ $sys = .Content }}{{ end }}{{ end }}
{{- «BOS» }}{{ if $sys }}System: {{ $sys }}{{ "\\n\\n" }}{{ end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}User: {{ .Content }}{{ "\\n\\n" }}
    {{- else if and (eq .Role "assistant") (or .Content .Thinking (not .ToolCalls)) }}Assistant: {{ .Content }}
        {{- if not $last }}{{ "\\n\\n" }}{{ end }}
        «THINK_TAGS»
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}Assistant:{{ if .IsThinkSet }}{{ if .Think }} <think>{{ else }} <think>{{ "\\n" }}</think>{{ end }}{{ end }}{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3], LOOP_HEAD=_LOOP_HEAD, THINK_TAGS=_THINK_TAGS,
    )


register(ChatFamily(
    name="rwkv-world",
    title="RWKV World as llama.cpp writes it (System: / User: / Assistant:, optional <think>)",
    detect=_detect_rwkv,
    build=_build_rwkv,
    stop=("\n\nUser:", "\n\nSystem:"),
    bos_in_template=True,
    thinking=True,
    markers=("System: ", "User: ", "Assistant: ", "Assistant:"),
    tool_calls="none: the Jinja prints neither tools nor tool results",
    notes=(
        "the Jinja trims user and assistant contents; Go templates cannot",
        "the Jinja uses the last system message only; so does the TEMPLATE",
        "the Jinja cuts reasoning out of assistant contents; the TEMPLATE relies on Ollama passing it in .Thinking",
    ),
))


# ---------------------------------------------------------------- MiniMax-M1 (<beginning_of_sentence>role name=…)

_MINIMAX_DEFAULT = "You are a helpful assistant created by Minimax based on MiniMax-M1 model."
_MINIMAX_TOOLS_HEAD = "<beginning_of_sentence>system tool_setting=tools\nYou are provided with these tools:\n<tools>\n"
_MINIMAX_TOOLS_TAIL = (
    "</tools>\n\nIf you need to call tools, please respond with <tool_calls></tool_calls> XML tags, and provide "
    "tool-name and json-object of arguments, following the format below:\n<tool_calls>\n{\"name\": <tool-name>, "
    "\"arguments\": <args-json-object>}\n...\n</tool_calls><end_of_sentence>\n"
)


def _detect_minimax_m1(src: str) -> bool:
    strings = _jinja_strings(src)
    return (
        _has_all(src, "{{ '<begin_of_document>' -}}", "'<beginning_of_sentence>system ai_setting=assistant\\n'",
                 "'<beginning_of_sentence>user name=user\\n'", "'<beginning_of_sentence>ai name=assistant\\n'",
                 "'<beginning_of_sentence>tool name=tools\\n'", "'tool result: ' + message.content + '\\n\\n'",
                 "tool_call.function.arguments | tojson + '}\\n'")
        and all(t in strings for t in (_MINIMAX_DEFAULT, _MINIMAX_TOOLS_HEAD, _MINIMAX_TOOLS_TAIL))
    )


def _build_minimax_m1(src: str, tokens: TemplateTokens) -> str:
    return json_defines() + _fill(
        """
{{- $msgs := .Messages }}{{ $hasSys := and $msgs (eq (index $msgs 0).Role "system") }}
{{- "<begin_of_document>" }}
{{- if $hasSys }}{{ with (index $msgs 0).Content }}<beginning_of_sentence>system ai_setting=assistant{{ "\\n" }}{{ . }}<end_of_sentence>{{ "\\n" }}{{ end }}
{{- else }}<beginning_of_sentence>system ai_setting=assistant{{ "\\n" }}«DEFAULT»<end_of_sentence>{{ "\\n" }}{{ end }}
{{- if .Tools }}«HEAD»{{ range .Tools }}{{ template "mm_tool" . }}{{ "\\n" }}{{ end }}«TAIL»{{ end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}<beginning_of_sentence>user name=user{{ "\\n" }}{{ .Content }}<end_of_sentence>{{ "\\n" }}
    {{- else if eq .Role "assistant" }}<beginning_of_sentence>ai name=assistant{{ "\\n" }}
        {{- if .ToolCalls }}<tool_calls>{{ "\\n" }}
            {{- range .ToolCalls }}{"name": "{{ .Function.Name }}", "arguments": {{ template "mm_args" .Function.Arguments }}}{{ "\\n" }}{{ end }}
            {{- "</tool_calls><end_of_sentence>\\n" }}
        {{- else }}{{ .Content }}{{ if not $last }}<end_of_sentence>{{ "\\n" }}{{ end }}{{ end }}
    {{- else if eq .Role "tool" }}<beginning_of_sentence>tool name=tools{{ "\\n" }}tool result: {{ .Content }}{{ "\\n\\n" }}<end_of_sentence>{{ "\\n" }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<beginning_of_sentence>ai name=assistant{{ "\\n" }}{{ end }}
""",
        DEFAULT=golit(_MINIMAX_DEFAULT), HEAD=golit(_MINIMAX_TOOLS_HEAD), TAIL=golit(_MINIMAX_TOOLS_TAIL),
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="minimax-m1",
    title="MiniMax-M1 (<beginning_of_sentence>system/user/ai/tool name=…, <tool_calls> JSON lines)",
    detect=_detect_minimax_m1,
    build=_build_minimax_m1,
    stop=("<end_of_sentence>",),
    markers=("<begin_of_document>", "<beginning_of_sentence>", "<end_of_sentence>", "ai name=assistant",
             "<tool_calls>"),
    tool_calls="TEMPLATE: Ollama's tool parser reads the <tool_calls> tag and the JSON objects after it",
    notes=(
        "the Jinja trims the system prompt and message contents; Go templates cannot",
        "the Jinja drops system messages after the first; so does the TEMPLATE",
    ),
))


# ---------------------------------------------------------------- Functionary v3.1 (Llama 3.1 headers, <function=…>)

_FUNCTIONARY_TAIL_START = "\nThink very carefully before calling functions."


def _functionary_tail(src: str) -> str | None:
    found = [t for t in _jinja_strings(src) if t.startswith(_FUNCTIONARY_TAIL_START)]
    return found[0] if len(found) == 1 else None


def _detect_functionary31(src: str) -> bool:
    return (
        _has_all(src, "{# version=v3-llama3.1 #}", "<|start_header_id|>ipython<|end_header_id|>\\n\\n",
                 "\"\\nYou have access to the following functions:\\n\\n\"", "'<function=' + tool_call['function']['name'] + '>'",
                 "'<|python_tag|>'", "{{ '<|eom_id|>' }}", "\"Use the function '\"|safe + t[\"function\"][\"name\"]")
        and _functionary_tail(src) is not None
    )


def _build_functionary31(src: str, tokens: TemplateTokens) -> str:
    tail = _functionary_tail(src)
    assert tail is not None
    return json_defines() + html_json_defines() + _fill(
        """
{{- $msgs := .Messages }}
{{- «BOS» }}<|start_header_id|>system<|end_header_id|>{{ "\\n\\n\\nCutting Knowledge Date: December 2023\\n\\n" }}
{{- if .Tools }}{{ "\\nYou have access to the following functions:\\n\\n" }}
    {{- range .Tools }}Use the function '{{ html .Function.Name }}' to '{{ html .Function.Description }}'{{ "\\n" }}{{ template "mmh_function" .Function }}{{ "\\n\\n" }}{{ end }}«TAIL»
{{- end }}<|eot_id|>
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if or (eq .Role "user") (eq .Role "system") }}<|start_header_id|>{{ .Role }}<|end_header_id|>{{ "\\n\\n" }}{{ .Content }}<|eot_id|>
    {{- else if eq .Role "tool" }}<|start_header_id|>ipython<|end_header_id|>{{ "\\n\\n" }}{{ .Content }}<|eot_id|>
    {{- else }}<|start_header_id|>{{ .Role }}<|end_header_id|>{{ "\\n\\n" }}{{ .Content }}
        {{- if .ToolCalls }}{{ range .ToolCalls }}<function={{ .Function.Name }}>{{ template "mm_args" .Function.Arguments }}</function>{{ end }}<|eom_id|>
        {{- else if not $last }}<|eot_id|>{{ end }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<|start_header_id|>assistant<|end_header_id|>{{ "\\n\\n" }}{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3], TAIL=golit(tail), LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="functionary-v3.1",
    title="Functionary medium v3.1 (Llama 3.1 headers, <function=name>{json}</function> calls, ipython results)",
    detect=_detect_functionary31,
    build=_build_functionary31,
    stop=("<|eot_id|>", "<|eom_id|>", "<|start_header_id|>"),
    bos_in_template=True,
    markers=("<|start_header_id|>", "<|eot_id|>", "<|eom_id|>", "<function=", "<|python_tag|>",
             "version=v3-llama3.1"),
    tool_calls="TEMPLATE: Ollama's tool parser waits for <function=, but the function name precedes the JSON, so "
               "structured tool_calls are not guaranteed (Ollama ships no Functionary PARSER)",
    notes=(
        "a call to the function named 'python' prints as <|python_tag|> in the Jinja; the TEMPLATE prints every "
        "call as <function=…>",
        "the Jinja's code_interpreter tool type ('Environment: ipython') has no counterpart in Ollama's tools",
        "the Jinja adds '|safe' strings to the tool name, description and JSON, which HTML-escapes them (&#34;); "
        "the TEMPLATE escapes them the same way",
    ),
))


# ---------------------------------------------------------------- Laguna XS 2.1 (<system>/<user>/<assistant> tags)

_LAGUNA21_TOOLS = (
    "You may call functions to assist with the user query.\nAll available function signatures are listed below:\n"
    "<available_tools>\n"
)
_LAGUNA21_CALL_FORMAT = (
    "<tool_call>function-name\n<arg_key>argument-key</arg_key>\n<arg_value>value-of-argument-key</arg_value>\n"
    "</tool_call>"
)
_LAGUNA21_THINK = (
    "</available_tools>\n\nWrap your thinking in '<think>', '</think>' tags, followed by a function call. For each "
    "function call, return an unescaped XML-like object with function name and arguments within '<tool_call>' and "
    "'</tool_call>' tags, like here:\n<think> your thoughts here </think>\n" + _LAGUNA21_CALL_FORMAT
)
_LAGUNA21_PLAIN = (
    "</available_tools>\n\nFor each function call, return an unescaped XML-like object with function name and "
    "arguments within '<tool_call>' and '</tool_call>' tags, like here:\n" + _LAGUNA21_CALL_FORMAT
)


def _detect_laguna21(src: str) -> bool:
    return _has_all(
        src, '{{- "〈|EOS|〉" -}}', "enable_thinking | default(false)", "render_assistant_messages_raw | default(false)",
        '"\\n\\n### Tools\\n\\n"', '"<user>\\n" + content + "\\n</user>\\n"', "'<think>\\n' + reasoning_content.strip() + '\\n</think>\\n'",
        '"<tool_response>\\n" + content + "\\n</tool_response>\\n"', '"<system>\\n" + content + "\\n</system>\\n"',
        "Wrap your thinking in '<think>', '</think>' tags, followed by a function call.",
    ) and _has_none(src, "You are a helpful, conversationally-fluent assistant made by Poolside.", "preserve_thinking")


def _build_laguna21(src: str, tokens: TemplateTokens) -> str:
    return json_defines() + _ARGVAL_DEFINE + _fill(
        """
{{- $msgs := .Messages }}{{ $sys := "" }}{{ if and $msgs (eq (index $msgs 0).Role "system") }}{{ $sys = (index $msgs 0).Content }}{{ end }}
{{- "〈|EOS|〉" }}
{{- if or $sys .Tools }}<system>{{ "\\n" }}{{ if $sys }}{{ "\\n" }}{{ $sys }}{{ end }}
    {{- if .Tools }}{{ "\\n\\n### Tools\\n\\n" }}«TOOLS»{{ range .Tools }}{{ template "mm_tool" . }}{{ "\\n" }}{{ end }}{{ if .Think }}«THINK»{{ else }}«PLAIN»{{ end }}{{ end }}
    {{- "\\n</system>\\n" }}
{{- end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}<user>{{ "\\n" }}{{ .Content }}{{ "\\n" }}</user>{{ "\\n" }}
    {{- else if eq .Role "assistant" }}<assistant>{{ "\\n" }}
        {{- if .Thinking }}<think>«NL»{{ .Thinking }}«NL»</think>«NL»{{ else }}</think>«NL»{{ end }}
        {{- if .Content }}{{ .Content }}{{ if not (and $last (not $m.ToolCalls)) }}{{ "\\n" }}{{ end }}{{ end }}
        {{- if .ToolCalls }}{{ range .ToolCalls }}<tool_call>{{ .Function.Name }}{{ "\\n" }}
            {{- range $k, $v := .Function.Arguments }}<arg_key>{{ $k }}</arg_key>{{ "\\n" }}<arg_value>{{ template "mm_argval" $v }}</arg_value>{{ "\\n" }}{{ end }}
            {{- "</tool_call>\\n" }}{{ end }}{{ end }}
        {{- if not (and $last (not $m.ToolCalls)) }}</assistant>{{ "\\n" }}{{ end }}
    {{- else if eq .Role "tool" }}<tool_response>{{ "\\n" }}{{ .Content }}{{ "\\n" }}</tool_response>{{ "\\n" }}
    {{- else if and (eq .Role "system") $i }}<system>{{ "\\n" }}{{ .Content }}{{ "\\n" }}</system>{{ "\\n" }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<assistant>{{ "\\n" }}{{ if .Think }}<think>{{ else }}</think>{{ end }}{{ end }}
""",
        TOOLS=golit(_LAGUNA21_TOOLS), THINK=golit(_LAGUNA21_THINK), PLAIN=golit(_LAGUNA21_PLAIN),
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="laguna-xs-2.1",
    title="Poolside Laguna XS 2.1 (〈|EOS|〉, <system>/<user>/<assistant> tags, <arg_key>/<arg_value> calls)",
    detect=_detect_laguna21,
    build=_build_laguna21,
    stop=("〈|EOS|〉", "</assistant>"),
    thinking=True,
    reasoning_key="reasoning",
    markers=("〈|EOS|〉", "<assistant>", "<user>", "<arg_key>", "render_assistant_messages_raw"),
    tool_calls="none structured: <tool_call> blocks of <arg_key>/<arg_value> pairs are not JSON; Ollama's laguna "
               "PARSER follows Laguna XS.2 and modelmint has not checked it against 2.1",
    notes=(
        "the Jinja strips whitespace around the system prompt, reasoning and contents; Go templates cannot",
        "render_assistant_messages_raw is not an Ollama setting: the TEMPLATE follows its default (false)",
    ),
))


# ---------------------------------------------------------------- Laguna S 2.1 (thinking on by default, compact tags)

_LAGUNA_DEFAULT = ("You are a helpful, conversationally-fluent assistant made by Poolside. You are here to be helpful "
                   "to users through natural language conversations.")


def _detect_laguna_s21(src: str) -> bool:
    return _has_all(
        src, '{{- "〈|EOS|〉" -}}', "enable_thinking | default(true)", "preserve_thinking | default(false)",
        f'set system_message = "{_LAGUNA_DEFAULT}"', '"<user>" + content + "</user>\\n"',
        "'<think>' + reasoning_content + '</think>'", '"<tool_response>" + content + "</tool_response>\\n"',
        '"<system>" + content + "</system>\\n"', '"### Tools\\n\\n"', '"</available_tools>"',
    ) and _has_none(src, "render_assistant_messages_raw")


def _build_laguna_s21(src: str, tokens: TemplateTokens) -> str:
    return json_defines() + _ARGVAL_DEFINE + _fill(
        """
{{- $msgs := .Messages }}{{ $think := or (not .IsThinkSet) .Think }}
{{- $hasSys := and $msgs (eq (index $msgs 0).Role "system") }}{{ $sys := «DEFAULT» }}{{ if $hasSys }}{{ $sys = (index $msgs 0).Content }}{{ end }}
{{- "〈|EOS|〉" }}
{{- if or $sys .Tools $think }}<system>{{ $sys }}{{ if and $sys .Tools }}{{ "\\n\\n" }}{{ end }}
    {{- if .Tools }}«TOOLS»{{ range .Tools }}{{ template "mm_tool" . }}{{ "\\n" }}{{ end }}</available_tools>{{ end }}</system>{{ "\\n" }}
{{- end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}<user>{{ .Content }}</user>{{ "\\n" }}
    {{- else if eq .Role "assistant" }}<assistant>{{ if $think }}<think>{{ .Thinking }}</think>{{ else }}</think>{{ end }}{{ .Content }}
        {{- if .ToolCalls }}{{ range .ToolCalls }}<tool_call>{{ .Function.Name }}
            {{- range $k, $v := .Function.Arguments }}<arg_key>{{ $k }}</arg_key><arg_value>{{ template "mm_argval" $v }}</arg_value>{{ end }}</tool_call>{{ end }}{{ end }}
        {{- if not (and $last (not $m.ToolCalls)) }}</assistant>{{ "\\n" }}{{ end }}
    {{- else if eq .Role "tool" }}<tool_response>{{ .Content }}</tool_response>{{ "\\n" }}
    {{- else if and (eq .Role "system") $i }}<system>{{ .Content }}</system>{{ "\\n" }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<assistant>{{ if $think }}<think>{{ else }}</think>{{ end }}{{ end }}
""",
        DEFAULT=golit(_LAGUNA_DEFAULT)[3:-3],
        TOOLS=golit("### Tools\n\nYou may call functions to assist with the user query.\n"
                    "All available function signatures are listed below:\n<available_tools>\n"),
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="laguna-s-2.1",
    title="Poolside Laguna S 2.1 (〈|EOS|〉, <system>/<user>/<assistant>, thinking on unless switched off)",
    detect=_detect_laguna_s21,
    build=_build_laguna_s21,
    stop=("〈|EOS|〉", "</assistant>"),
    thinking=True,
    reasoning_key="reasoning",
    markers=("〈|EOS|〉", "<assistant>", "<user>", "<arg_key>", "preserve_thinking", "made by Poolside"),
    tool_calls="none structured: <tool_call> blocks of <arg_key>/<arg_value> pairs are not JSON; Ollama's "
               "poolside-v1 PARSER follows a neighbouring Laguna template that modelmint has not checked against S 2.1",
    notes=(
        "the Jinja trims the system prompt's trailing whitespace and treats a whitespace-only one as none; Go "
        "templates cannot",
        "preserve_thinking is not an Ollama setting: the TEMPLATE follows its default (false)",
    ),
))


# ---------------------------------------------------------------- LFM2.5 8B-A1B (Pythonic tool calls; PARSER lfm2-thinking)

# format_arg_value of the Jinja: a string in single quotes, a mapping as JSON, anything else as Python's str().
_PYVAL_DEFINE = (
    '{{- define "mm_pyrepr" }}{{ $t := printf "%T" . }}{{ if eq $t "string" }}\'{{ . }}\''
    '{{ else if eq $t "[]interface {}" }}[{{ range $i, $v := . }}{{ if $i }}, {{ end }}{{ template "mm_pyrepr" $v }}{{ end }}]'
    '{{ else if eq $t "map[string]interface {}" }}{{ "{" }}{{ $first := true }}{{ range $k, $v := . }}'
    '{{ if not $first }}, {{ end }}{{ $first = false }}\'{{ $k }}\': {{ template "mm_pyrepr" $v }}{{ end }}{{ "}" }}'
    '{{ else if eq $t "bool" }}{{ if . }}True{{ else }}False{{ end }}{{ else if eq $t "<nil>" }}None'
    '{{ else }}{{ json . }}{{ end }}{{ end }}\n'
    '{{- define "mm_pyval" }}{{ if eq (printf "%T" .) "map[string]interface {}" }}{{ template "mm_json" . }}'
    '{{ else }}{{ template "mm_pyrepr" . }}{{ end }}{{ end }}\n'
)


def _detect_lfm25_moe(src: str) -> bool:
    return _has_all(
        src, "{{- bos_token -}}", "preserve_thinking | default(false)", "macro format_arg_value(arg_value)",
        "{{- \"'\" + arg_value + \"'\" -}}", '"<|tool_call_start|>[" + (tool_calls_ns.tool_calls | join(", ")) + "]<|tool_call_end|>"',
        '"List of tools: ["', "message.thinking is defined and (preserve_thinking or loop.index0 > ns.last_user_index)",
        "{%- generation -%}",
    )


def _build_lfm25_moe(src: str, tokens: TemplateTokens) -> str:
    return json_defines() + _PYVAL_DEFINE + _fill(
        """
{{- $msgs := .Messages }}{{ $sys := "" }}{{ $hasSys := and $msgs (eq (index $msgs 0).Role "system") }}
{{- if $hasSys }}{{ $sys = (index $msgs 0).Content }}{{ end }}
{{- $lastUser := -1 }}{{ range $i, $m := $msgs }}{{ if eq .Role "user" }}{{ $lastUser = $i }}{{ end }}{{ end }}
{{- «BOS» }}
{{- if or $sys .Tools }}<|im_start|>system{{ "\\n" }}{{ $sys }}
    {{- if .Tools }}{{ if $sys }}{{ "\\n" }}{{ end }}List of tools: [{{ range $j, $t := .Tools }}{{ if $j }}, {{ end }}{{ template "mm_tool" . }}{{ end }}]{{ end }}<|im_end|>{{ "\\n" }}
{{- end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if or $i (not $hasSys) }}<|im_start|>{{ .Role }}{{ "\\n" }}
        {{- if and (eq .Role "assistant") .Thinking (gt $i $lastUser) }}<think>{{ .Thinking }}</think>{{ end }}{{ .Content }}
        {{- if .ToolCalls }}<|tool_call_start|>[{{ range $j, $c := .ToolCalls }}{{ if $j }}, {{ end }}{{ .Function.Name }}(
            {{- $first := true }}{{ range $k, $v := .Function.Arguments }}{{ if not $first }}, {{ end }}{{ $first = false }}{{ $k }}={{ template "mm_pyval" $v }}{{ end }})
            {{- end }}]<|tool_call_end|>{{ end }}
        {{- if not (and $last (eq .Role "assistant") (not $m.ToolCalls)) }}<|im_end|>{{ "\\n" }}{{ end }}
        {{- $prev = .Role }}
    {{- end }}
{{- end }}
{{- if ne $prev "assistant" }}<|im_start|>assistant{{ "\\n" }}{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="lfm2.5-moe",
    title="Liquid LFM2.5 8B-A1B (ChatML, Pythonic <|tool_call_start|>[f(a='x')]<|tool_call_end|>; PARSER lfm2-thinking)",
    detect=_detect_lfm25_moe,
    build=_build_lfm25_moe,
    stop=("<|im_end|>", "<|im_start|>"),
    bos_in_template=True,
    thinking=True,
    reasoning_key="thinking",
    content_none_ok=False,
    markers=("<|im_start|>", "<|im_end|>", "List of tools: [", "<|tool_call_start|>", "format_arg_value",
             "preserve_thinking"),
    parser="lfm2-thinking",
    tool_calls="PARSER lfm2-thinking returns structured tool_calls and the <think> reasoning",
    notes=(
        "tool-call arguments print as the Jinja's format_arg_value does (strings in single quotes, Python str() of "
        "other values); strings holding quotes or backslashes and floats with no fraction (2.0) print differently",
        "preserve_thinking is not an Ollama setting: the TEMPLATE follows its default (false)",
        "the Jinja fails on a None content; Ollama's contents are always strings",
    ),
))


# ---------------------------------------------------------------- Solar Open (<|begin|>role<|content|>…<|end|>)

_SOLAR_PROVIDER = ("## Provider System Prompt\n\nYou are Solar Open 100B, a large language model trained by Upstage AI, "
                   "a Korean startup. Your knowledge cutoff is 2025-07. The current date is ")
_SOLAR_TOOLS_START = "\nYou may invoke one or more tools to assist with the user's query."


def _solar_tools_texts(src: str) -> list[str] | None:
    """The tool instructions after the tool list, in order, read from the Jinja."""
    strings = _jinja_strings(src)
    try:
        at = strings.index("<|tools:end|>\n")
    except ValueError:
        return None
    tail = strings[at + 1:at + 7]
    ok = len(tail) == 6 and tail[0] == "\n### Tool Call Format\n" and tail[-1].startswith("- Ensure the <tool-call-id>")
    return tail if ok else None


def _detect_solar(src: str) -> bool:
    return (
        _has_all(src, '"<|begin|>system<|content|>"', '"<|begin|>user<|content|>" + message.content + "<|end|>"',
                 '"<|begin|>assistant<|content|>" + message.content + "<|end|>"', '"<|begin|>assistant<|tool_calls|>"',
                 '"<|begin|>tool<|tool_response|>"', "strftime_now(\"%Y-%m-%d\")", 'think_render_option == "lastthink"',
                 '"<|begin|>assistant<|think|>" + message.reasoning + "<|end|>"', '{{- "<|begin|>assistant" }}')
        and _SOLAR_PROVIDER in _jinja_strings(src) and _solar_tools_texts(src) is not None
        and any(t.startswith(_SOLAR_TOOLS_START) for t in _jinja_strings(src))
    )


def _build_solar(src: str, tokens: TemplateTokens) -> str:
    tail = _solar_tools_texts(src)
    intro = next(t for t in _jinja_strings(src) if t.startswith(_SOLAR_TOOLS_START))
    assert tail is not None
    return json_defines() + _fill(
        """
{{- $msgs := .Messages }}{{ $hasSys := false }}{{ range $msgs }}{{ if eq .Role "system" }}{{ $hasSys = true }}{{ end }}{{ end }}
{{- $lastUser := -1 }}{{ range $i, $m := $msgs }}{{ if eq .Role "user" }}{{ $lastUser = $i }}{{ end }}{{ end }}
{{- "<|begin|>system<|content|>" }}«PROVIDER»{{ currentDate }}.
{{- if $hasSys }}{{ "\\n\\n## System Prompt" }}{{ range $msgs }}{{ if eq .Role "system" }}{{ "\\n\\n" }}{{ .Content }}{{ end }}{{ end }}{{ end }}
{{- if .Tools }}{{ "\\n\\n## Tools\\n\\n### Tool Call Instruction" }}«INTRO»{{ "\\n### Available Tools\\n<|tools:begin|>" }}
    {{- range .Tools }}<|tool:begin|>{{ template "mm_function" .Function }}<|tool:end|>{{ end }}{{ "<|tools:end|>\\n" }}«TAIL»
{{- end }}<|end|>
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
    «LOOP_HEAD»
    {{- if eq .Role "user" }}<|begin|>user<|content|>{{ .Content }}<|end|>
    {{- else if eq .Role "tool" }}
        {{- if ne $prev "tool" }}<|begin|>tool<|tool_response|>{{ end }}
        {{- "<|tool_response:begin|>" }}{{ .ToolCallID }}<|tool_response:name|>{{ .ToolName }}<|tool_response:result|>{{ .Content }}<|tool_response:end|>
        {{- if ne $next "tool" }}<|end|>{{ end }}
    {{- else if eq .Role "assistant" }}
        {{- if and .Thinking (gt $i $lastUser) }}<|begin|>assistant<|think|>{{ .Thinking }}<|end|>{{ end }}
        {{- if .ToolCalls }}<|begin|>assistant<|tool_calls|>{{ range .ToolCalls }}<|tool_call:begin|>{{ .ID }}<|tool_call:name|>{{ .Function.Name }}<|tool_call:args|>{{ template "mm_args" .Function.Arguments }}<|tool_call:end|>{{ end }}<|calls|>
        {{- else }}<|begin|>assistant<|content|>{{ .Content }}{{ if not $last }}<|end|>{{ end }}{{ end }}
        {{- /* Never renders: the model's reasoning sits between <|think|> and <|end|>, the tags Ollama's thinking parser reads. */}}
        {{- if false }}<|think|>{{ .Thinking }}<|end|>{{ end }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}{{ if eq .ThinkLevel "low" }}<|begin|>assistant<|think|><|end|>{{ end }}<|begin|>assistant{{ end }}
""",
        PROVIDER=golit(_SOLAR_PROVIDER), INTRO=golit(intro), TAIL=golit("".join(tail)), LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="solar-open",
    title="Upstage Solar Open (<|begin|>role<|content|>…<|end|>, <|think|> reasoning, <|tool_call:begin|> calls)",
    detect=_detect_solar,
    build=_build_solar,
    stop=("<|end|>", "<|calls|>"),
    thinking=True,
    reasoning_key="reasoning",
    markers=("<|begin|>", "<|content|>", "<|end|>", "<|tool_calls|>", "<|tool_call:begin|>", "Solar Open"),
    tool_calls="none structured: the calls are <|tool_call:begin|>id<|tool_call:name|>…<|tool_call:args|>{…}, "
               "not a format Ollama's tool parser reads, and Ollama ships no Solar PARSER",
    notes=(
        "the Jinja names a tool result's tool by looking up its call id; the TEMPLATE prints Ollama's tool_name",
        "the Jinja's reasoning_effort low/minimal maps to Ollama's think level 'low'; its think_render_option and "
        "response_format have no Ollama counterpart (the TEMPLATE follows their defaults)",
    ),
))


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
    {{- /* Never renders: declares <think>…</think> around .Thinking, which Ollama reads as the thinking tags. */}}
    {{- if false }}<think>{{ .Thinking }}</think>{{ end }}
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
        LOOP_HEAD=_LOOP_HEAD,
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


# ---------------------------------------------------------------- Gemma 2 (<start_of_turn>, no system role)


def _detect_gemma(src: str) -> bool:
    return _has_all(
        src, "<start_of_turn>", "<end_of_turn>", "System role not supported", "set role = 'model'",
        "message['content'] | trim",
    ) and _has_none(src, "tool", "image", "first_user_prefix")


def _build_gemma(src: str, tokens: TemplateTokens) -> str:
    # Gemma 2's Jinja refuses system messages; Ollama users set SYSTEM all the same, so the TEMPLATE puts
    # the system text at the top of the first user turn, as Gemma 3's own template does.
    return _fill(
        """
{{- $msgs := .Messages }}{{ $pending := .System }}{{ $prev := "" }}
{{- «BOS» }}
{{- range $i, $m := $msgs }}
    «LOOP_HEAD»
    {{- if ne .Role "system" }}
        {{- if eq .Role "assistant" }}<start_of_turn>model{{ else }}<start_of_turn>{{ .Role }}{{ end }}{{ "\\n" }}
        {{- if and $pending (eq .Role "user") }}{{ $pending }}{{ "\\n\\n" }}{{ $pending = "" }}{{ end }}
        {{- .Content }}{{ if not (and $last (eq .Role "assistant")) }}<end_of_turn>{{ "\\n" }}{{ end }}
        {{- $prev = .Role }}
    {{- end }}
{{- end }}
{{- if ne $prev "assistant" }}<start_of_turn>model{{ "\\n" }}{{ end }}
""",
        BOS=golit(tokens.bos_text)[3:-3],
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="gemma",
    title="Gemma 2 (<start_of_turn>user/model, no system role, no tools)",
    detect=_detect_gemma,
    build=_build_gemma,
    stop=("<end_of_turn>", "<start_of_turn>"),
    markers=("<start_of_turn>", "<end_of_turn>", "System role not supported", "set role = 'model'"),
    tool_calls="none: the Jinja has no tools",
    bos_in_template=True,
    notes=(
        "the Jinja raises on a system message; the TEMPLATE prepends the system text to the first user turn",
        "the Jinja trims message contents (| trim); Go templates cannot",
        "no tool calling: the Jinja has none",
    ),
))


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


# ---------------------------------------------------------------- Phi-3.5 (<|user|> … <|end|>)


def _detect_phi3(src: str) -> bool:
    norm = "".join(src.split())
    return _has_all(
        norm,
        "{%ifmessage['role']=='system'andmessage['content']%}{{'<|system|>'+message['content']+'<|end|>'}}",
        "{%elifmessage['role']=='user'%}{{'<|user|>'+message['content']+'<|end|>'}}",
        "{%elifmessage['role']=='assistant'%}{{'<|assistant|>'+message['content']+'<|end|>'}}",
        "{%ifadd_generation_prompt%}{{'<|assistant|>'}}{%else%}{{eos_token}}{%endif%}",
    ) and _has_none(src, "tool", "bos_token", "<|im_start|>")


def _build_phi3(src: str, tokens: TemplateTokens) -> str:
    return _fill(
        """
{{- $msgs := .Messages }}{{ $prev := "" }}
{{- range $i, $m := $msgs }}
    «LOOP_HEAD»
    {{- if and (eq .Role "system") .Content }}<|system|>{{ "\\n" }}{{ .Content }}<|end|>{{ "\\n" }}
    {{- else if eq .Role "user" }}<|user|>{{ "\\n" }}{{ .Content }}<|end|>{{ "\\n" }}
    {{- else if eq .Role "assistant" }}<|assistant|>{{ "\\n" }}{{ .Content }}{{ if not $last }}<|end|>{{ "\\n" }}{{ end }}
    {{- end }}
    {{- $prev = .Role }}
{{- end }}
{{- if ne $prev "assistant" }}<|assistant|>{{ "\\n" }}{{ end }}
""",
        LOOP_HEAD=_LOOP_HEAD,
    )


register(ChatFamily(
    name="phi3",
    title="Phi-3.5 (<|system|>/<|user|>/<|assistant|> … <|end|>)",
    detect=_detect_phi3,
    build=_build_phi3,
    stop=("<|end|>", "<|user|>", "<|assistant|>", "<|endoftext|>"),
    markers=("<|system|>", "<|user|>", "<|assistant|>", "<|end|>"),
    tool_calls="none: the Jinja has no tools",
    notes=("no tool calling: the Jinja has none (tool messages are dropped by both)",),
))


# ---------------------------------------------------------------- families Ollama renders in Go code
#
# Their Jinja needs what Go's text/template cannot do (string splitting and stripping of reasoning,
# Python-style value printing, per-argument XML), so Ollama ships a RENDERER for each. They are
# recognised by markers taken from the template itself; every marker must be present and no
# forbidden text, so a neighbour (an older or newer version of the same model line) is refused with
# what it lacks instead of being published with the wrong renderer.


def _renderer_family(name: str, title: str, *, renderer: str, parser: str, markers: tuple[str, ...],
                     forbidden: tuple[str, ...], stop: tuple[str, ...], notes: tuple[str, ...] = (),
                     thinking: bool = False) -> ChatFamily:
    from pipelines.chat.renderers import PARSERS, RENDERERS

    if renderer not in RENDERERS or parser not in PARSERS:
        raise ValueError(f"{name}: Ollama has no renderer {renderer!r} or parser {parser!r}")
    return register(ChatFamily(
        name=name,
        title=title,
        detect=lambda src: _has_all(src, *markers) and _has_none(src, *forbidden),
        build=None,
        stop=stop,
        thinking=thinking,
        notes=("rendered by Ollama's built-in RENDERER " + renderer + "; modelmint does not prove it on its "
               "suite (no Go TEMPLATE can follow this Jinja)", *notes),
        markers=markers,
        renderer=renderer,
        parser=parser,
        tool_calls=f"PARSER {parser} returns structured tool_calls",
    ))


_IM = ("<|im_end|>", "<|im_start|>")

_renderer_family(
    "qwen3-coder", "Qwen3-Coder (<tool_call><function=…><parameter=…> XML tool calls, no thinking)",
    renderer="qwen3-coder", parser="qwen3-coder", stop=_IM,
    markers=("<|im_start|>", "<tool_call>", "<function=", "<parameter=", "render_extra_keys"),
    forbidden=("<think>", "enable_thinking", "truncate_history_thinking", "<|vision_start|>"),
)
_renderer_family(
    "qwen3.5", "Qwen3.5 (hybrid thinking, XML tool calls, vision placeholders)",
    renderer="qwen3.5", parser="qwen3.5", stop=_IM, thinking=True,
    markers=("<|im_start|>", "<think>", "<function=", "<parameter=", "<|vision_start|>", "enable_thinking",
             "render_content"),
    forbidden=("truncate_history_thinking",),
)
_renderer_family(
    "nemotron-3-nano", "NVIDIA Nemotron 3 Nano (ChatML, <think> with history truncation, XML tool calls)",
    renderer="nemotron-3-nano", parser="nemotron-3-nano", stop=_IM, thinking=True,
    markers=("<|im_start|>", "<think>", "<function=", "<parameter=", "truncate_history_thinking",
             "render_extra_keys"),
    forbidden=("<|vision_start|>",),
)
_renderer_family(
    "deepseek3.1", "DeepSeek V3.1 (hybrid thinking switch, <｜tool▁calls▁begin｜> tool calls)",
    renderer="deepseek3.1", parser="deepseek3", stop=("<｜end▁of▁sentence｜>",), thinking=True,
    markers=("<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁output▁begin｜>",
             "set thinking = enable_thinking"),
    forbidden=("reasoning_content", "DSML"),
)
_renderer_family(
    "glm-4.7", "GLM-4.7 ([gMASK]<sop>, <arg_key>/<arg_value> tool calls, clear_thinking)",
    renderer="glm-4.7", parser="glm-4.7", stop=("<|user|>", "<|observation|>", "<|endoftext|>"), thinking=True,
    markers=("[gMASK]<sop>", "<|observation|>", "<arg_key>", "<arg_value>", "clear_thinking"),
    forbidden=(),
)
_renderer_family(
    "gemma4", "Gemma 4 26B/31B (<|turn>, <|\"|> strings, <|tool_call>, empty thought channel when not thinking)",
    renderer="gemma4-large", parser="gemma4", stop=("<turn|>",), thinking=True,
    markers=("<|turn>", "<turn|>", '<|"|>', "<|tool_call>", "<|channel>", "'<|channel>thought\\n<channel|>'"),
    forbidden=(),
    notes=("Ollama's gemma4-large renderer follows Google's 31B template; the E2B/E4B templates (no empty "
           "thought channel) would need RENDERER gemma4-small",),
)
_renderer_family(
    "lfm2", "Liquid LFM2 (ChatML, 'List of tools:' with <|tool_list_start|>, no thinking)",
    renderer="lfm2", parser="lfm2", stop=_IM,
    markers=("<|im_start|>", "List of tools: ", "<|tool_list_start|>", "<|tool_list_end|>",
             "<|tool_response_start|>"),
    forbidden=("<think>", "keep_past_thinking", "preserve_thinking"),
)
_renderer_family(
    "cohere", "Cohere Command A 2026 / North (Cohere2 MoE: <|START_TEXT|>, <|START_THINKING|>, <|START_ACTION|>)",
    renderer="cohere", parser="cohere", stop=("<|END_OF_TURN_TOKEN|>",), thinking=True,
    markers=("<|START_OF_TURN_TOKEN|>", "<|START_TEXT|>", "<|START_THINKING|>", "<|START_ACTION|>",
             "<|START_TOOL_RESULT|>", "platform_instruction_override"),
    forbidden=(),
    notes=("Ollama's cohere renderer leaves the template's platform instructions to the Modelfile SYSTEM",),
)
_renderer_family(
    "glimmer", "Muse Glimmer (ATEM channels: <|start|>…<|message|>…<|eom|>)",
    renderer="glimmer", parser="glimmer", stop=("<|eot|>",), thinking=True,
    markers=("<|start|>", "<|message|>", "<|eom|>", "<|eot|>", "Muse Glimmer ATEM"),
    forbidden=(),
)
_renderer_family(
    "laguna", "Poolside Laguna XS.2 (〈|EOS|〉 prefix, default system prompt, <think> off by default)",
    renderer="laguna", parser="laguna", stop=("〈|EOS|〉",), thinking=True,
    markers=("〈|EOS|〉", "render_assistant_messages_raw", "enable_thinking | default(false)",
             "You are a helpful, conversationally-fluent assistant made by Poolside.", "<think>", "<tool_call>",
             "reasoning_content"),
    forbidden=("preserve_thinking",),
)
