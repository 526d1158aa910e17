"""The chat-family machinery every family module uses.

ChatFamily and TemplateTokens; the registry (FAMILIES, register); recognition and refusal (matching_families,
nearest_family, go_blockers, refusal_reason, detect_family, get_family). The conventions every TEMPLATE follows
are in the package docstring; the helpers that read Jinja and write Go are in helpers.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from pipelines.core.errors import UnsupportedModel

__all__ = ["FAMILIES", "ChatFamily", "TemplateTokens", "UnsupportedChatTemplate", "detect_family", "get_family",
           "go_blockers", "go_blockers_at", "matching_families", "nearest_family", "refusal_reason", "register"]


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
    think_values: tuple[str, str] | None = None
    """What the Jinja's think_variable takes for Ollama's think false and true, where it is not a boolean (a
    reasoning strength word, say); None: the boolean itself."""
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
    tool_use_refused: str = ""
    """Why this family is refused for tool use: its PARSER, reimplemented from Ollama's source in
    tests/ollama_parsers.py, does not recover the tool calls (name, arguments) from what the Jinja writes for an
    assistant message holding them, the model's own format; '' when it recovers them on every tool-call
    conversation of the suite (pipelines.chat.proof.SUITE), or the family names no PARSER."""
    renderer_differs: tuple[str, ...] | None = None
    """For a RENDERER family: the conversations of the suite (pipelines.chat.proof.SUITE) on which Ollama's RENDERER,
    reimplemented from Ollama's source in tests/ollama_renderers.py, renders other bytes than the Jinja; () when
    proven identical on all of them, None when not checked. A family with any is refused, never published."""
    renderer_why: str = ""
    """What the RENDERER writes differently from the Jinja on those conversations."""
    proof_note: str = ""
    """How the proof of this family's TEMPLATE departs from rendering the suite under transformers, if it does."""

    @property
    def renderer_mismatch(self) -> str | None:
        """Why this family's RENDERER cannot be published for its template, or None."""
        if not self.renderer_differs:
            return None
        return (f"Ollama's RENDERER {self.renderer} renders this {self.name} template differently from its Jinja on "
                f"{len(self.renderer_differs)} conversation{'s' if len(self.renderer_differs) != 1 else ''} of "
                f"modelmint's suite ({', '.join(self.renderer_differs)})" + (f": {self.renderer_why}" if self.renderer_why else ""))

    @property
    def kind(self) -> str:
        """'proven' (a TEMPLATE proven on the suite) or 'renderer' (Ollama's built-in RENDERER only)."""
        return "proven" if self.build is not None else "renderer"

    def template(self, jinja: str, tokens: TemplateTokens) -> str:
        """The Go TEMPLATE for this Jinja.

        Raises:
            UnsupportedChatTemplate: the family has no TEMPLATE (Ollama renders it with a RENDERER), or the
                Jinja lacks what this family's TEMPLATE is built from (a family forced onto another's template).
        """
        if self.build is None:
            raise UnsupportedChatTemplate(
                f"the {self.name} family has no Go TEMPLATE: Ollama renders it with RENDERER {self.renderer}",
                families=sorted(FAMILIES))
        if not self.detect(jinja):
            # a builder reads its family's own texts out of the Jinja (default system prompt, tool preamble):
            # forced onto another family's template, it may find none of them
            try:
                return self.build(jinja, tokens)
            except (AssertionError, AttributeError, IndexError, KeyError, StopIteration, TypeError, ValueError) as e:
                _found, missing = self.evidence(jinja)
                raise UnsupportedChatTemplate(
                    f"a {self.name} TEMPLATE cannot be built from this chat template: it lacks what {self.name}'s "
                    "TEMPLATE takes from it" + (f" ({', '.join(repr(m) for m in missing)})" if missing else ""),
                    families=sorted(FAMILIES)) from e
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


def go_blockers_at(jinja: str) -> list[str]:
    """go_blockers, each with the line of the Jinja where it first appears and that line's text."""
    out = []
    for pattern, what in _GO_CANNOT:
        found = pattern.search(jinja)
        if found:
            n = jinja.count("\n", 0, found.start())
            text = jinja.split("\n")[n].strip()
            out.append(f"{what} at line {n + 1} ({text[:80]!r})")
    return out


def refusal_reason(jinja: str) -> str:
    """Why no family accepts this Jinja, naming the nearest family and what differs from it, and the constructs a
    hand-written TEMPLATE would have to do without."""
    hits = matching_families(jinja)
    if len(hits) > 1:
        return f"matches several families ({', '.join(f.name for f in hits)}); refusing to guess"
    near = nearest_family(jinja)
    blockers = go_blockers_at(jinja)
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
            nearest family and what differs. Or the one family is rendered by an Ollama RENDERER that writes
            other bytes than this Jinja (the message names the conversations).
        InvalidJinja: it is not Jinja at all (named with its line, not read for markers or Go blockers).
    """
    from pipelines.chat.jinja import check_syntax

    check_syntax(jinja)
    hits = matching_families(jinja)
    names = sorted(n for n, f in FAMILIES.items() if not f.renderer_mismatch)  # the ones modelmint publishes
    if len(hits) == 1:
        if hits[0].renderer_mismatch:
            raise UnsupportedChatTemplate(f"the chat template is refused: {hits[0].renderer_mismatch}", families=names)
        return hits[0]
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
