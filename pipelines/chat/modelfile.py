"""Ollama Modelfiles as a typed object, with a printer and a parser that follow Ollama's own grammar."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

from pipelines.core.errors import ModelmintError

ROLES = ("system", "user", "assistant")

# The options Ollama accepts as PARAMETER (api.Options and its runner options), with their types.
# Deprecated and removed options are left out: a Modelfile written here never carries them.
PARAMETER_TYPES: dict[str, type] = {
    "num_keep": int,
    "seed": int,
    "num_predict": int,
    "top_k": int,
    "top_p": float,
    "min_p": float,
    "typical_p": float,
    "repeat_last_n": int,
    "temperature": float,
    "repeat_penalty": float,
    "presence_penalty": float,
    "frequency_penalty": float,
    "stop": str,
    "num_ctx": int,
    "num_batch": int,
    "num_gpu": int,
    "main_gpu": int,
    "use_mmap": bool,
    "num_thread": int,
}

ParamValue = int | float | str | bool


class ModelfileError(ModelmintError):
    """A Modelfile that does not parse, or a value that no Modelfile can hold."""

    def __init__(self, message: str, *, line: int | None = None, hint: str | None = None) -> None:
        super().__init__(f"(line {line}) {message}" if line else message, hint=hint)
        self.line = line


@dataclass(frozen=True)
class Parameter:
    name: str
    value: ParamValue

    def __post_init__(self) -> None:
        want = PARAMETER_TYPES.get(self.name)
        if want is None:
            raise ModelfileError(
                f"unknown PARAMETER {self.name!r}", hint=f"Ollama accepts: {', '.join(sorted(PARAMETER_TYPES))}"
            )
        ok = isinstance(self.value, bool) if want is bool else (
            isinstance(self.value, want) and not isinstance(self.value, bool)
        )
        if not ok:
            raise ModelfileError(f"PARAMETER {self.name} must be {want.__name__}, got {self.value!r}")


@dataclass(frozen=True)
class Message:
    role: str
    content: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ModelfileError(f"MESSAGE role must be one of {', '.join(ROLES)}, got {self.role!r}")


def _check_builtin_names(renderer: str | None, parser: str | None) -> None:
    """Raises: ModelfileError: a name Ollama's rendererForName / ParserForName does not know at the pinned source."""
    from pipelines.chat.renderers import PARSERS, RENDERERS, SOURCE_TAG

    for command, name, table in (("RENDERER", renderer, RENDERERS), ("PARSER", parser, PARSERS)):
        if name is not None and name not in table:
            # `ollama create` keeps an unknown RENDERER and fails every chat with "unknown renderer"; an unknown
            # PARSER is dropped silently (no thinking or tool_calls): neither is published.
            raise ModelfileError(
                f"Ollama has no built-in {command} named {name!r} (as of {SOURCE_TAG})",
                hint=f"name one of: {', '.join(sorted(table))}; or publish a TEMPLATE with "
                     "`modelmint modelfile <file.gguf> --template FILE`",
            )


@dataclass(frozen=True)
class Modelfile:
    """FROM, TEMPLATE, RENDERER, PARSER, REQUIRES, SYSTEM, PARAMETER, MESSAGE and LICENSE commands; `to_text`
    and `parse` round-trip.

    `comments` are header lines printed as `# …` before FROM and read back from the comment lines
    that precede the first command.
    """

    from_: str
    template: str | None = None
    system: str | None = None
    renderer: str | None = None
    """One of Ollama's built-in renderers (pipelines.chat.renderers.RENDERERS)."""
    parser: str | None = None
    """One of Ollama's built-in parsers (pipelines.chat.renderers.PARSERS)."""
    requires: str | None = None
    """The oldest Ollama release the Modelfile is for (REQUIRES, e.g. 0.14.3)."""
    parameters: tuple[Parameter, ...] = ()
    messages: tuple[Message, ...] = ()
    licenses: tuple[str, ...] = ()
    comments: tuple[str, ...] = field(default=())

    def parameter(self, name: str) -> list[ParamValue]:
        """Every value of PARAMETER `name`, in order (stop can appear many times)."""
        return [p.value for p in self.parameters if p.name == name]

    def to_text(self) -> str:
        """The Modelfile text. Every value is written so that Ollama's parser reads back exactly it.

        Raises:
            ModelfileError: a value holds a character Ollama's parser drops, or cannot be quoted; a RENDERER or
                PARSER name Ollama does not know (Ollama's parser accepts any name; chat would fail on it).
        """
        _check_builtin_names(self.renderer, self.parser)
        lines = [f"# {c}" if c else "#" for c in self.comments]
        for c in self.comments:
            if "\n" in c or "\r" in c:
                raise ModelfileError("a comment line cannot contain a line break")
        triple, double = '"""', '"'
        lines.append("FROM " + _encode(self.from_, "FROM"))
        if self.template is not None:
            lines.append("TEMPLATE " + _encode(self.template, "TEMPLATE", prefer=triple))
        for command, value in (("RENDERER", self.renderer), ("PARSER", self.parser), ("REQUIRES", self.requires)):
            if value is not None:
                lines.append(f"{command} " + _encode(value, command))
        if self.system is not None:
            lines.append("SYSTEM " + _encode(self.system, "SYSTEM", prefer=triple))
        for p in self.parameters:
            encoded = _encode(_format_value(p.value), f"PARAMETER {p.name}",
                              prefer=double if p.name == "stop" else None)
            lines.append(f"PARAMETER {p.name} {encoded}")
        for m in self.messages:
            lines.append(f"MESSAGE {m.role} " + _encode(m.content, "MESSAGE", prefer=double))
        for text in self.licenses:
            lines.append("LICENSE " + _encode(text, "LICENSE", prefer=triple))
        return "\n".join(lines) + "\n"

    @classmethod
    def parse(cls, text: str) -> Modelfile:
        """Read a Modelfile the way `ollama create` does (commands are case-insensitive, `#` comments).

        Raises:
            ModelfileError: a syntax error, an unterminated quote, an unknown command, parameter or role,
                a command modelmint does not model (ADAPTER, DRAFT, …), or no FROM.
        """
        commands, header = _scan(text)
        from_: str | None = None
        template = system = None
        named: dict[str, str] = {}
        params: list[Parameter] = []
        messages: list[Message] = []
        licenses: list[str] = []
        for name, args, line in commands:
            if name == "model":
                from_ = args
            elif name == "template":
                template = args
            elif name == "system":
                system = args
            elif name in _NAMED:
                named[name] = args
            elif name == "license":
                licenses.append(args)
            elif name == "message":
                role, _, content = args.partition(": ")
                messages.append(Message(role, content))
            elif name in _UNMODELLED:
                raise ModelfileError(f"{name.upper()} is valid in Ollama but modelmint does not write it", line=line)
            else:
                params.append(Parameter(name, _parse_value(name, args, line)))
        if from_ is None:
            raise ModelfileError("no FROM line", hint="a Modelfile starts with FROM <path to .gguf or model name>")
        return cls(from_=from_, template=template, system=system, parameters=tuple(params), **named,
                   messages=tuple(messages), licenses=tuple(licenses), comments=tuple(header))


_UNMODELLED = ("adapter", "draft")
_NAMED = ("renderer", "parser", "requires")
_COMMANDS = ("from", "license", "template", "system", "adapter", "draft", "renderer", "parser", "parameter",
             "message", "requires")


def _format_value(v: ParamValue) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v) if isinstance(v, float) else str(v)


def _parse_value(name: str, raw: str, line: int) -> ParamValue:
    want = PARAMETER_TYPES.get(name)
    if want is None:
        raise ModelfileError(f"unknown PARAMETER {name!r}", line=line,
                             hint=f"Ollama accepts: {', '.join(sorted(PARAMETER_TYPES))}")
    try:
        if want is bool:
            if raw.lower() not in ("true", "false", "1", "0", "t", "f"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1", "t")
        return want(raw)
    except ValueError as err:
        raise ModelfileError(f"PARAMETER {name} wants {want.__name__}, got {raw!r}", line=line) from err


# ---------------------------------------------------------------- Ollama's grammar (parser/parser.go)
#
# Ollama reads a Modelfile rune by rune. A value runs to the end of its line unless it opens with " or
# """; then it runs to the first line end at which the text so far (trimmed) is a complete quoted string.
# There are no escape sequences, and runes Go does not consider printable (other than space, tab, CR
# and LF) are dropped. So a value is written bare, in "…" or in """…""", whichever reads back as itself.


class _S(Enum):
    NIL = 0
    NAME = 1
    VALUE = 2
    PARAMETER = 3
    MESSAGE = 4
    COMMENT = 5


def _is_space(c: str) -> bool:
    return c in " \t"


def _is_newline(c: str) -> bool:
    return c in "\r\n"


def _is_alpha(c: str) -> bool:
    return ("a" <= c <= "z") or ("A" <= c <= "Z")


def _unquote(s: str) -> tuple[str, bool]:
    if s.startswith('"""'):
        if len(s) >= 6 and s.endswith('"""'):
            return s[3:-3], True
        return "", False
    if s.startswith('"'):
        if len(s) >= 2 and s.endswith('"'):
            return s[1:-1], True
        return "", False
    return s, True


_TRIM = " \t\r\n"


def _scan(text: str) -> tuple[list[tuple[str, str, int]], list[str]]:
    """Commands as (name, args, line) the way Ollama's ParseFile reads them, and the header comments."""
    if text.startswith("\ufeff"):
        text = text[1:]
    commands: list[tuple[str, str, int]] = []
    header: list[str] = []
    comment: list[str] | None = None
    state = _S.NIL
    buf: list[str] = []
    name = role = ""
    line = 1
    for ch in text:
        if _is_newline(ch):
            line += 1
        nxt, r = _step(ch, state, line)
        if state is _S.COMMENT and comment is not None and nxt is _S.COMMENT:
            comment.append(ch)
        if nxt is not state:
            if state is _S.NAME:
                word = "".join(buf).lower()
                if word not in _COMMANDS:
                    raise ModelfileError(f"unknown command {''.join(buf)!r}", line=line,
                                         hint=f"commands are {', '.join(c.upper() for c in _COMMANDS)}")
                if word == "from":
                    name = "model"
                elif word == "parameter":
                    nxt = _S.PARAMETER
                elif word == "message":
                    nxt = _S.MESSAGE
                    name = word
                else:
                    name = word
            elif state is _S.PARAMETER:
                name = "".join(buf)
            elif state is _S.MESSAGE:
                role = "".join(buf)
                if role not in ROLES:
                    raise ModelfileError(f"message role must be one of {', '.join(ROLES)}, got {role!r}", line=line)
            elif state is _S.COMMENT:
                if comment is not None and not commands:
                    header.append("".join(comment).removeprefix(" "))
                comment = None
            elif state is _S.VALUE:
                value, ok = _unquote("".join(buf).strip(_TRIM))
                if not ok or _is_space(r):
                    buf.append(r)
                    continue
                if role:
                    value, role = f"{role}: {value}", ""
                commands.append((name, value, line - 1 if _is_newline(r) else line))
            if nxt is _S.COMMENT:
                comment = []
            buf = []
            state = nxt
        if r and r.isprintable():
            buf.append(r)
    if state is _S.VALUE:
        value, ok = _unquote("".join(buf).strip(_TRIM))
        if not ok:
            raise ModelfileError("unexpected end of file inside a quoted value", line=line,
                                 hint='close the value with the quote it opened with (" or """)')
        if role:
            value = f"{role}: {value}"
        commands.append((name, value, line))
    elif state is _S.COMMENT:
        if comment is not None and not commands:
            header.append("".join(comment).removeprefix(" "))
    elif state is not _S.NIL:
        raise ModelfileError("unexpected end of file after a command name", line=line)
    return commands, header


def _step(c: str, state: _S, line: int) -> tuple[_S, str]:
    if state is _S.NIL:
        if c == "#":
            return _S.COMMENT, ""
        if _is_space(c) or _is_newline(c):
            return _S.NIL, ""
        return _S.NAME, c
    if state is _S.NAME:
        if _is_alpha(c):
            return _S.NAME, c
        if _is_space(c):
            return _S.VALUE, ""
        raise ModelfileError("a command name must be letters followed by a space", line=line)
    if state is _S.VALUE:
        if _is_newline(c) or _is_space(c):
            return _S.NIL, c
        return _S.VALUE, c
    if state is _S.PARAMETER:
        if _is_alpha(c) or (c.isascii() and c.isdigit()) or c == "_":
            return _S.PARAMETER, c
        if _is_space(c):
            return _S.VALUE, ""
        raise ModelfileError("a PARAMETER name must be letters, digits or _ followed by a space", line=line)
    if state is _S.MESSAGE:
        if _is_alpha(c):
            return _S.MESSAGE, c
        if _is_space(c):
            return _S.VALUE, ""
        raise ModelfileError("a MESSAGE role must be followed by a space", line=line)
    if _is_newline(c):
        return _S.NIL, ""
    return _S.COMMENT, ""


def _reads_back(encoded: str, value: str) -> bool:
    try:
        commands, _ = _scan(f"SYSTEM {encoded}\n")
    except ModelfileError:
        return False
    return len(commands) == 1 and commands[0][:2] == ("system", value)


def _encode(value: str, what: str, *, prefer: str | None = None) -> str:
    """`value` bare, in "…" or in \"\"\"…\"\"\": the first form (`prefer` first) Ollama reads back as `value`.

    Raises:
        ModelfileError: the value holds a rune Ollama drops, or no form reads back as it.
    """
    for i, ch in enumerate(value):
        if not (ch.isprintable() or ch in "\t\r\n"):
            raise ModelfileError(
                f"{what} holds the character U+{ord(ch):04X} at offset {i}, which Ollama's Modelfile parser "
                "drops (it keeps only printable characters, spaces, tabs and line breaks)",
                hint="remove or replace that character",
            )
    forms = ["bare", '"', '"""']
    if prefer:
        forms.remove(prefer)
        forms.insert(0, prefer)
    for form in forms:
        if form == "bare":
            if not value:
                continue
            candidate = value
        else:
            candidate = f"{form}{value}{form}"
        if _reads_back(candidate, value):
            return candidate
    lines = [n for n, line in enumerate(re.split(r"\r|\n", value)[:-1], 1) if line.rstrip(" \t").endswith('"')]
    raise ModelfileError(
        f"{what} cannot be written in a Modelfile: Ollama's parser has no escape sequences and ends a quoted "
        "value at the first line end where the text so far ends in a quote"
        + (f"; line(s) {', '.join(map(str, lines))} end in a quote" if lines else ""),
        hint="add a character (a period, say) after the quote at the end of those lines",
    )
