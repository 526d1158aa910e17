"""Ollama's built-in PARSERs, reimplemented from Ollama's Go source for the tests.

Each parser follows model/parsers/*.go at Ollama v0.33.0-rc2 (commit fb30760, the pinned source of
pipelines/chat/renderers.py) rule by rule, with file:line citations, and is checked against cases copied from
Ollama's own parser tests (tests/data/ollama_parser_vectors.json). A parser is a streaming state machine: `add`
takes a chunk of the model's output and returns the (content, thinking, tool calls) that became unambiguous, as
Ollama's Parser.Add does (parsers.go:12-24). A tool call is returned as {"name": ..., "arguments": {...}} with the
arguments as Go's encoding/json would hand them on (numbers from JSON as floats, which compare equal to ints).

Only the parsers modelmint names in a published Modelfile are here: qwen3.5 (and qwen3-coder, which it hands its
content to), lfm2 / lfm2-thinking, ministral, gemma4, glimmer, and harmony (which Ollama sets itself for gpt-oss).
"""

from __future__ import annotations

import json
import re
import unicodedata
import xml.etree.ElementTree as ET
from typing import Any

Call = dict[str, Any]
Out = tuple[str, str, list[Call]]

# unicode.IsSpace: '\t', '\n', '\v', '\f', '\r', ' ', U+0085, U+00A0 and the Zs category (Go's unicode tables).
_GO_SPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
                      "\u200a\u2028\u2029\u202f\u205f\u3000")


def _lstrip(s: str) -> str:  # strings.TrimLeftFunc(s, unicode.IsSpace)
    i = 0
    while i < len(s) and s[i] in _GO_SPACE:
        i += 1
    return s[i:]


def _rstrip(s: str) -> str:  # strings.TrimRightFunc(s, unicode.IsSpace)
    i = len(s)
    while i > 0 and s[i - 1] in _GO_SPACE:
        i -= 1
    return s[:i]


def _strip(s: str) -> str:  # strings.TrimSpace
    return _lstrip(_rstrip(s))


def overlap(s: str, delim: str) -> int:
    """The longest suffix of s that is a prefix of delim (parsers.go:148-157)."""
    for i in range(min(len(delim), len(s)), 0, -1):
        if s.endswith(delim[:i]):
            return i
    return 0


def trailing_ws(s: str) -> int:
    """Length of s's trailing whitespace (parsers.go:159-175)."""
    return len(s) - len(_rstrip(s))


def split_at_tag(buf: str, tag: str, trim_after: bool) -> tuple[str, str]:
    """(before, after) of the first tag; the buffer becomes `after` (parsers.go:131-146)."""
    if tag not in buf:
        return buf, ""
    before, after = buf.split(tag, 1)
    return _rstrip(before), _lstrip(after) if trim_after else after


def _props(tools: list[dict[str, Any]] | None, name: str) -> dict[str, Any] | None:
    for t in tools or ():
        if t["function"]["name"] == name:
            props: dict[str, Any] | None = t["function"].get("parameters", {}).get("properties")
            return props
    return None


# ---------------------------------------------------------------- qwen3-coder (model/parsers/qwen3coder.go)

_TOOL_OPEN, _TOOL_CLOSE = "<tool_call>", "</tool_call>"  # qwen3coder.go:23-26
_QWEN_TAG = re.compile(r"<(\w+)=([^>]+)>")  # qwen3coder.go:423
_QWEN_XML_TAG = re.compile(r'</?(?:function|parameter)(?:\s+name="[^"]*")?>')  # qwen3coder.go:424


def _xml_escape_text(s: str) -> str:
    """encoding/xml.EscapeText: & < > ' " tab, newline and carriage return as character references."""
    return (s.replace("&", "&amp;").replace("'", "&#39;").replace('"', "&#34;").replace("<", "&lt;")
            .replace(">", "&gt;").replace("\t", "&#x9;").replace("\n", "&#xA;").replace("\r", "&#xD;"))


def transform_to_xml(raw: str) -> str:
    """<function=NAME> and <parameter=NAME> as XML attributes, text nodes escaped (qwen3coder.go:427-452)."""
    transformed = _QWEN_TAG.sub(lambda m: f'<{m[1]} name="{_xml_escape_text(m[2])}">', raw)
    out, last = [], 0
    for m in _QWEN_XML_TAG.finditer(transformed):
        out.append(transformed[last:m.start()].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"))
        out.append(m[0])
        last = m.end()
    out.append(transformed[last:].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"))
    return "".join(out)


def parse_typed_tool_value(raw: str, types: list[str]) -> Any:
    """qwen3coder.go:329-421: the value by the parameter's schema types; a string when it has none."""
    if raw.lower() == "null":
        return None
    if not types:
        return raw
    ts = set(types)
    if "boolean" in ts:
        if raw.lower() in ("true", "false"):
            return raw.lower() == "true"
        if len(types) == 1:
            return False
    if "integer" in ts:
        if re.fullmatch(r"[+-]?\d+", raw) and -(2**63) <= int(raw) < 2**63:  # strconv.ParseInt(raw, 10, 64)
            return int(raw)
        if len(types) == 1:
            return raw
    if "number" in ts:
        f = _parse_float(raw)
        if f is not None:
            return int(f) if f == int(f) else f
        if len(types) == 1:
            return raw
    if "array" in ts:
        arr = _json_or_none(raw)
        if isinstance(arr, list):
            return arr
        if len(types) == 1:
            return raw
    if "object" in ts:
        obj = _json_or_none(raw)
        if isinstance(obj, dict):
            return obj
        if len(types) == 1:
            return raw
    return raw


def _parse_float(s: str) -> float | None:
    """strconv.ParseFloat(s, 64) for decimal forms (no Inf/NaN in tool arguments)."""
    if not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", s):
        return None
    return float(s)


def _json_or_none(s: str) -> Any:
    try:
        return json.loads(s)
    except ValueError:
        return None


def parse_qwen_tool_call(raw: str, tools: list[dict[str, Any]] | None) -> Call:
    """qwen3coder.go:271-320: the XML call, each parameter typed by the matching tool's schema.

    Raises:
        ET.ParseError: what xml.Unmarshal refuses (Add returns the error; no calls).
    """
    root = ET.fromstring(transform_to_xml(raw))
    if root.tag != "function":
        raise ET.ParseError(f"expected element type <function> but have <{root.tag}>")
    name = root.get("name", "")
    props = _props(tools, name) or {}
    args: dict[str, Any] = {}
    for param in root.findall("parameter"):
        pname = param.get("name", "")
        prop = props.get(pname)
        types: list[str] = []
        if prop is not None:
            if prop.get("anyOf"):
                for alt in prop["anyOf"]:
                    types += _type_list(alt.get("type"))
            else:
                types = _type_list(prop.get("type"))
        value = (param.text or "") + "".join(c.tail or "" for c in param)  # `xml:",chardata"`: its own text
        value = value.removeprefix("\n").removesuffix("\n")  # parseValue, qwen3coder.go:322-327
        args[pname] = parse_typed_tool_value(value, types)
    return {"name": name, "arguments": args}


def _type_list(t: Any) -> list[str]:  # api.PropertyType: a string or a list of strings
    return [] if t is None else [t] if isinstance(t, str) else list(t)


class Qwen3CoderParser:
    """qwen3coder.go:30-225."""

    def __init__(self, tools: list[dict[str, Any]] | None, last: dict[str, Any] | None = None,
                 think: bool | None = None) -> None:
        self.tools, self.acc, self.collecting = tools, "", False

    def add(self, s: str, done: bool) -> Out:
        self.acc += s
        content, calls = [], []
        keep = True
        while keep:
            keep = False
            if not self.collecting:  # qwen3coder.go:140-189
                if _TOOL_OPEN in self.acc:
                    before, after = self.acc.split(_TOOL_OPEN, 1)
                    content.append(_rstrip(before))
                    self.acc, self.collecting, keep = after, True, True
                else:
                    n = overlap(self.acc, _TOOL_OPEN)
                    start = len(self.acc) - n - trailing_ws(self.acc[:len(self.acc) - n])
                    content.append(self.acc[:start])
                    self.acc = self.acc[start:]
            elif _TOOL_CLOSE in self.acc:  # qwen3coder.go:190-210
                before, after = self.acc.split(_TOOL_CLOSE, 1)
                self.acc = _lstrip(after)
                calls.append(parse_qwen_tool_call(before, self.tools))
                self.collecting, keep = False, True
        return "".join(content), "", calls


# ---------------------------------------------------------------- qwen3.5 (model/parsers/qwen35.go)

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


class Qwen35Parser:
    """qwen35.go:28-269: reasoning up to </think>, then the rest through Qwen3CoderParser."""

    THINKING, EATING_WS, CONTENT = 0, 1, 2

    def __init__(self, tools: list[dict[str, Any]] | None, last: dict[str, Any] | None = None,
                 think: bool | None = None) -> None:
        self.tool_parser = Qwen3CoderParser(tools)
        self.buf = ""
        thinking = think is None or think  # qwen35.go:59-63: thinking unless think is false
        prefill = last is not None and last.get("role") == "assistant" and last.get("content", "") != ""
        self.state = self.THINKING if thinking and not prefill else self.CONTENT
        self.allow_leading_open = self.state == self.THINKING
        self.trim_leading_thinking = False

    def add(self, s: str, done: bool) -> Out:  # qwen35.go:96-118
        self.buf += s
        content, thinking, calls = [], [], []
        for kind, text in self._events():
            if kind == "content":
                c, _t, cs = self.tool_parser.add(text, done)
                content.append(c)
                calls += cs
            else:
                thinking.append(text)
        return "".join(content), "".join(thinking), calls

    def _events(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        keep = True
        while keep:
            keep = self._eat(out)
        return out

    def _eat(self, out: list[tuple[str, str]]) -> bool:  # qwen35.go:184-269
        if self.state == self.THINKING:
            acc = self.buf
            if self.allow_leading_open:  # maybeConsumeLeadingThinkOpenTag, qwen35.go:156-182
                trimmed = _lstrip(acc)
                if trimmed.startswith(_THINK_OPEN):
                    after = _lstrip(trimmed[len(_THINK_OPEN):])
                    self.buf, self.allow_leading_open, self.trim_leading_thinking = after, False, after == ""
                    return after != ""
                if _THINK_OPEN.startswith(trimmed):
                    return False
                self.allow_leading_open = False
            if self.trim_leading_thinking:
                acc = self.buf = _lstrip(acc)
                if acc == "":
                    return False
                self.trim_leading_thinking = False
            if _THINK_CLOSE in acc:
                thinking, remaining = split_at_tag(acc, _THINK_CLOSE, True)
                self.buf = remaining
                if thinking:
                    out.append(("thinking", thinking))
                self.state = self.EATING_WS if remaining == "" else self.CONTENT
                return True
            n = max(overlap(acc, _THINK_CLOSE), overlap(acc, _TOOL_OPEN))
            if n > 0:
                before = acc[:len(acc) - n]
                start = len(before) - trailing_ws(before)
                self.buf = acc[start:]
                if start:
                    out.append(("thinking", acc[:start]))
                return False
            if _TOOL_OPEN in acc:  # a <tool_call> before </think> ends the reasoning (qwen35.go:229-237)
                thinking, tooling = split_at_tag(acc, _TOOL_OPEN, True)
                self.buf = thinking + _THINK_CLOSE + _TOOL_OPEN + tooling
                return True
            start = len(acc) - trailing_ws(acc)
            self.buf = acc[start:]
            if start:
                out.append(("thinking", acc[:start]))
            return False
        if self.state == self.EATING_WS:  # eatLeadingWhitespaceAndTransitionTo, qwen35.go:144-153
            trimmed = _lstrip(self.buf)
            self.buf = trimmed
            if trimmed == "":
                return False
            self.state = self.CONTENT
            return True
        if self.buf:
            out.append(("content", self.buf))
            self.buf = ""
        return False


# ---------------------------------------------------------------- ministral (model/parsers/ministral.go)

_M_TOOL_CALLS, _M_THINK, _M_THINK_END, _M_ARGS = "[TOOL_CALLS]", "[THINK]", "[/THINK]", "[ARGS]"  # ministral.go:103-108


class ToolNotFound(ValueError):
    """ministral.go:94-101 toolByName's error: Add returns it with the calls parsed before."""


def find_json_end(s: str) -> int:
    """ministral.go:310-352: index of the brace or bracket that closes the first JSON value; -1 if incomplete."""
    depth, in_string, escaped = 0, False, False
    for i, r in enumerate(s):
        if in_string:
            if escaped:
                escaped = False
            elif r == "\\":
                escaped = True
            elif r == '"':
                in_string = False
            continue
        if r == '"':
            in_string = True
        elif r in "{[":
            depth += 1
        elif r in "}]":
            depth -= 1
            if depth == 0:
                return i
    return -1


class MinistralParser:
    """ministral.go:43-306. `ParserForName("ministral")` builds it without thinking support (parsers.go:62-63):
    it starts in content and still reads a [THINK] block it meets there."""

    CONTENT, THINKING, TOOL_NAME, TOOL_ARGS = 0, 1, 2, 3

    def __init__(self, tools: list[dict[str, Any]] | None, last: dict[str, Any] | None = None,
                 think: bool | None = None, *, thinking_support: bool = False) -> None:
        self.tools, self.buf, self.pending = tools or [], "", ""
        prefill = last is not None and last.get("role") == "assistant"
        if not thinking_support or (prefill and last is not None and last.get("content", "") != ""):
            self.state = self.CONTENT
        else:
            self.state = self.THINKING

    def add(self, s: str, done: bool) -> Out:  # ministral.go:271-306
        self.buf += s
        events: list[tuple[str, Any]] = []
        keep = True
        while keep:
            keep = self._eat(events)
        content, thinking, calls = [], [], []
        for kind, value in events:
            if kind == "content":
                content.append(value)
            elif kind == "thinking":
                thinking.append(value)
            else:
                name, raw = value
                if not any(t["function"]["name"] == name for t in self.tools):
                    raise ToolNotFound(f"tool '{name}' not found")
                args = json.loads(raw)  # json.Unmarshal into ToolCallFunctionArguments (an object)
                if not isinstance(args, dict):
                    raise ValueError("json: cannot unmarshal array into Go value of type api.ToolCallFunctionArguments")
                calls.append({"name": name, "arguments": args})
        return "".join(content), "".join(thinking), calls

    def _eat(self, out: list[tuple[str, Any]]) -> bool:  # ministral.go:113-258
        buf = self.buf
        if self.state == self.CONTENT:
            for tag, state in ((_M_TOOL_CALLS, self.TOOL_NAME), (_M_THINK, self.THINKING)):
                if tag in buf:
                    before, after = buf.split(tag, 1)
                    if _rstrip(before):
                        out.append(("content", _rstrip(before)))
                    self.buf, self.state = after, state
                    return True
            n = max(overlap(buf, _M_TOOL_CALLS), overlap(buf, _M_THINK))
            before = buf[:len(buf) - n]
            start = len(before) - trailing_ws(before)
            self.buf = buf[start:]
            if start:
                out.append(("content", buf[:start]))
            return False
        if self.state == self.THINKING:
            if _M_THINK_END in buf:
                thinking, after = buf.split(_M_THINK_END, 1)
                self.buf, self.state = _lstrip(after), self.CONTENT
                if thinking:
                    out.append(("thinking", thinking))
                return True
            n = overlap(buf, _M_THINK_END)
            self.buf = buf[len(buf) - n:] if n else ""
            if len(buf) - n:
                out.append(("thinking", buf[:len(buf) - n]))
            return False
        if self.state == self.TOOL_NAME:
            if _M_ARGS in buf:
                self.pending, self.buf = buf.split(_M_ARGS, 1)
                self.state = self.TOOL_ARGS
                return True
            return False
        end = find_json_end(buf)
        if end != -1:
            out.append(("call", (self.pending, buf[:end + 1])))
            self.pending, self.buf, self.state = "", buf[end + 1:], self.CONTENT
            return True
        return False


# ---------------------------------------------------------------- lfm2 / lfm2-thinking (model/parsers/lfm2.go)

_L_CALL_START, _L_CALL_END = "<|tool_call_start|>", "<|tool_call_end|>"  # lfm2.go:27-32


class LFM2Parser:
    """lfm2.go:34-268; `lfm2` without thinking support, `lfm2-thinking` with it (parsers.go:89-92)."""

    LOOKING, THINKING, CONTENT, TOOL_CALLS = 0, 1, 2, 3

    def __init__(self, tools: list[dict[str, Any]] | None, last: dict[str, Any] | None = None,
                 think: bool | None = None, *, thinking_support: bool = False) -> None:
        self.tool_names = {t["function"]["name"] for t in tools or () if t["function"]["name"]}
        self.has_tools = bool(tools)
        self.buf = ""
        self.trim_thinking = self.trim_content = False
        prefill = last is not None and last.get("role") == "assistant" and last.get("content", "") != ""
        # lfm2.go:62-82: thinking only when the parser has it and the request asks for it, and not after a prefill
        self.state = self.LOOKING if thinking_support and think and not prefill else self.CONTENT

    def add(self, s: str, done: bool) -> Out:  # lfm2.go:120-166
        self.buf += s
        if done and self.state == self.LOOKING:
            trimmed = _lstrip(self.buf)
            if not trimmed.startswith(_THINK_OPEN):
                self.buf, self.state = trimmed, self.CONTENT
        events: list[tuple[str, Any]] = []
        keep = True
        while keep:
            keep = self._eat(events)
        calls = [v for k, v in events if k == "call"]
        content = "".join(v for k, v in events if k == "content")
        thinking = "".join(v for k, v in events if k == "thinking")
        if done and not calls and self.has_tools:  # bare calls without the wrapper tags (lfm2.go:149-156)
            try:
                fallback = parse_tool_calls_content(_strip(content))
            except ValueError:
                fallback = []
            if fallback and (not self.tool_names or all(c["name"] in self.tool_names for c in fallback)):
                content, calls = "", fallback
        return content, thinking, calls

    def _eat(self, out: list[tuple[str, Any]]) -> bool:  # lfm2.go:184-346
        buf = self.buf
        if buf == "":
            return False
        if self.state == self.LOOKING:
            trimmed = _lstrip(buf)
            if trimmed.startswith(_THINK_OPEN):
                self.buf, self.state, self.trim_thinking = trimmed[len(_THINK_OPEN):], self.THINKING, True
                return True
            if trimmed == "" or _THINK_OPEN.startswith(trimmed):
                return False
            self.buf, self.state = trimmed, self.CONTENT
            return True
        if self.state == self.THINKING:
            if buf.startswith(_THINK_OPEN):
                buf = self.buf = buf[len(_THINK_OPEN):]
                self.trim_thinking = True
            if self.trim_thinking:
                buf = self.buf = _lstrip(buf)
                if buf:
                    self.trim_thinking = False
            if _THINK_CLOSE in buf:
                thinking, remaining = buf.split(_THINK_CLOSE, 1)
                thinking, remaining = _rstrip(thinking), _lstrip(remaining)
                self.buf, self.state, self.trim_thinking = remaining, self.CONTENT, False
                self.trim_content = remaining == ""
                if thinking:
                    out.append(("thinking", thinking))
                return True
            n = overlap(buf, _THINK_CLOSE)
            before = buf[:len(buf) - n]
            start = len(before) - trailing_ws(before)
            self.buf = buf[start:]
            if start:
                out.append(("thinking", buf[:start]))
            return False
        if self.state == self.CONTENT:
            if self.trim_content:
                buf = self.buf = _lstrip(buf)
                if buf:
                    self.trim_content = False
            if _L_CALL_START in buf:
                before, remaining = buf.split(_L_CALL_START, 1)
                self.buf, self.state = remaining, self.TOOL_CALLS
                if _rstrip(before):
                    out.append(("content", _rstrip(before)))
                return True
            self.buf = ""
            if buf:
                out.append(("content", buf))
            return False
        idx = buf.find(_L_CALL_END)
        if idx != -1:
            try:
                calls = parse_tool_calls_content(buf[:idx])
            except ValueError:
                calls = []
            if calls:
                remaining = buf[idx + len(_L_CALL_END):]
                if remaining.startswith(_L_CALL_START):
                    remaining = remaining[len(_L_CALL_START):]
                else:
                    remaining, self.state = _lstrip(remaining), self.CONTENT
                self.buf = remaining
                out += [("call", c) for c in calls]
                return True
        return False


def parse_tool_calls_content(content: str) -> list[Call]:
    """lfm2.go:351-440: [f(a='x'), g(b=1)] or f(a='x'); ValueError for what Ollama refuses."""
    content = _strip(content)
    content = _strip(content.removeprefix(_L_CALL_START))
    content = _strip(content.removesuffix(_L_CALL_END))
    content = _strip(content)
    if content.startswith("[") and content.endswith("]"):
        content = content[1:-1]
    calls: list[Call] = []
    while content:
        content = _strip(content)
        if not content:
            break
        if content.startswith(","):
            content = _strip(content[1:])
            if not content:
                break
        paren = content.find("(")
        if paren == -1:
            raise ValueError("invalid tool call: no opening parenthesis")
        name = _strip(content[:paren])
        if not name:
            raise ValueError("invalid tool call: empty function name")
        close = _find_matching_paren(content, paren)
        if close == -1:
            raise ValueError("invalid tool call: no matching closing parenthesis")
        args_str = content[paren + 1:close]
        calls.append({"name": name, "arguments": _parse_python_args(args_str) if args_str else {}})
        content = content[close + 1:]
    if not calls:
        raise ValueError("no tool calls found")
    return calls


def _find_matching_paren(s: str, open_idx: int) -> int:  # lfm2.go:444-471
    depth, i = 1, open_idx + 1
    while i < len(s) and depth > 0:
        ch = s[i]
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i
        elif ch in "'\"":
            i += 1
            while i < len(s) and s[i] != ch:
                if s[i] == "\\" and i + 1 < len(s):
                    i += 1
                i += 1
        i += 1
    return -1


def _parse_python_args(s: str) -> dict[str, Any]:  # parsePythonArgs, lfm2.go:486-532
    args: dict[str, Any] = {}
    i = 0
    while i < len(s):
        while i < len(s) and (s[i] == "," or s[i] in _GO_SPACE):
            i += 1
        if i >= len(s):
            break
        key_start = i
        while i < len(s) and s[i] not in "=,":
            i += 1
        if i >= len(s) or s[i] != "=":
            raise ValueError("invalid argument: expected '='")
        key = _strip(s[key_start:i])
        if not key:
            raise ValueError("invalid argument: empty key")
        i += 1
        while i < len(s) and s[i] in _GO_SPACE:
            i += 1
        if i >= len(s):
            raise ValueError("invalid argument: missing value")
        args[key], i = _parse_python_arg_value(s, i)
        if i < len(s) and s[i] == ",":
            i += 1
    return args


def _parse_python_arg_value(s: str, i: int) -> tuple[Any, int]:  # lfm2.go:534-608
    if s[i] in "'\"":
        quote = s[i]
        i += 1
        start = i
        while i < len(s):
            if s[i] == "\\" and i + 1 < len(s):
                i += 2
                continue
            if s[i] == quote:
                return s[start:i], i + 1  # the text between the quotes, escapes kept as written
            i += 1
        raise ValueError("invalid argument: unterminated string")
    start = i
    paren = square = curly = 0
    in_string, quote, escaped = False, "", False
    while i < len(s):
        ch = s[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                in_string = False
            i += 1
            continue
        if ch in "'\"":
            in_string, quote = True, ch
        elif ch == "(":
            paren += 1
        elif ch == ")":
            paren = max(paren - 1, 0)
        elif ch == "[":
            square += 1
        elif ch == "]":
            square = max(square - 1, 0)
        elif ch == "{":
            curly += 1
        elif ch == "}":
            curly = max(curly - 1, 0)
        elif ch == "," and paren == square == curly == 0:
            return _parse_python_literal(_strip(s[start:i])), i
        i += 1
    return _parse_python_literal(_strip(s[start:i])), i


def _parse_python_literal(token: str) -> Any:  # lfm2.go:610-645
    fixed = {"": "", "true": True, "True": True, "false": False, "False": False, "null": None, "None": None}
    if token in fixed:
        return fixed[token]
    if re.fullmatch(r"[+-]?\d+", token) and -(2**63) <= int(token) < 2**63:
        return int(token)
    f = _parse_float(token)
    if f is not None:
        return f
    if token.startswith(("[", "{")):
        parsed = _json_or_none(token)
        if parsed is not None or token == "null":
            return parsed
        try:
            return json.loads(_python_literal_to_json(token))
        except ValueError:
            pass
    return token


def _python_literal_to_json(s: str) -> str:  # lfm2.go:647-724
    out: list[str] = []
    in_string, quote, escaped = False, "", False
    i = 0
    while i < len(s):
        ch = s[i]
        if in_string:
            if escaped:
                out.append(ch)
                escaped = False
            elif ch == "\\":
                out.append(ch)
                escaped = True
            elif ch == quote:
                out.append('"')
                in_string = False
            elif quote == "'" and ch == '"':
                out.append('\\"')
            else:
                out.append(ch)
            i += 1
            continue
        if ch in "'\"":
            in_string, quote, escaped = True, ch, False
            out.append('"')
            i += 1
            continue
        if ch.isascii() and (ch.isalpha() or ch == "_"):
            j = i + 1
            while j < len(s) and s[j].isascii() and (s[j].isalnum() or s[j] == "_"):
                j += 1
            ident = s[i:j]
            out.append({"True": "true", "False": "false", "None": "null"}.get(ident, ident))
            i = j
            continue
        out.append(ch)
        i += 1
    if in_string:
        raise ValueError("unterminated string")
    return "".join(out)


# ---------------------------------------------------------------- gemma4 (model/parsers/gemma4.go)

_G_THINK_OPEN, _G_THINK_CLOSE = "<|channel>", "<channel|>"  # gemma4.go:24-31
_G_CALL_OPEN, _G_CALL_CLOSE, _G_RESPONSE, _G_STR = "<|tool_call>", "<tool_call|>", "<|tool_response>", '<|"|>'
_G_QUOTED = re.compile(r'<\|"\|>(.*?)<\|"\|>', re.S)  # gemma4.go:33


class Gemma4Parser:
    """gemma4.go:35-390 (`gemma4`: thinking support). Not reimplemented: the best-effort repairs of arguments
    that do not parse as JSON (repairGemma4ToolCallArgs, gemma4.go:503-856); such a call raises here."""

    CONTENT, THINKING, TOOL_CALL, POST_CALL = 0, 1, 2, 3

    def __init__(self, tools: list[dict[str, Any]] | None, last: dict[str, Any] | None = None,
                 think: bool | None = None, *, thinking_support: bool = True) -> None:
        self.tools, self.buf, self.strip_channel = tools or [], "", False
        self.thinking_enabled = thinking_support and bool(think)
        # gemma4.go:64-96: content first in every case but a thinking turn right after a tool result
        self.state = self.THINKING if self.thinking_enabled and last is not None and last.get("role") == "tool" \
            else self.CONTENT

    def add(self, s: str, done: bool) -> Out:  # gemma4.go:115-142
        self.buf += s
        content, thinking, calls = [], [], []
        keep = True
        while keep:
            events: list[tuple[str, Any]] = []
            keep = self._eat(done, events)
            for kind, value in events:
                if kind == "call":
                    calls.append(value)
                elif kind == "thinking":
                    if self.thinking_enabled:
                        thinking.append(value)
                else:
                    content.append(value)
        return "".join(content), "".join(thinking), calls

    def _eat(self, done: bool, out: list[tuple[str, Any]]) -> bool:  # gemma4.go:171-390
        buf = self.buf
        if buf == "":
            return False
        if self.state == self.CONTENT:
            for tag, state in ((_G_THINK_OPEN, self.THINKING), (_G_CALL_OPEN, self.TOOL_CALL)):
                if tag in buf:
                    before, self.buf = buf.split(tag, 1)
                    self.state, self.strip_channel = state, state == self.THINKING
                    if _rstrip(before):
                        out.append(("content", _rstrip(before)))
                    return True
            if not done:
                n = max(overlap(buf, _G_THINK_OPEN), overlap(buf, _G_CALL_OPEN))
                if n:
                    before = buf[:len(buf) - n]
                    start = len(before) - trailing_ws(before)
                    self.buf = buf[start:]
                    if start:
                        out.append(("content", buf[:start]))
                    return False
            self.buf = ""
            out.append(("content", buf))
            return False
        if self.state == self.THINKING:
            if self.strip_channel:
                if buf.startswith("thought\n"):
                    buf = self.buf = buf[len("thought\n"):]
                    self.strip_channel = False
                elif not done and "thought\n".startswith(buf):
                    return False
                else:
                    self.strip_channel = False
            if _G_THINK_CLOSE in buf:
                thinking, remaining = buf.split(_G_THINK_CLOSE, 1)
                self.buf, self.state = _lstrip(remaining), self.CONTENT
                if _rstrip(thinking):
                    out.append(("thinking", _rstrip(thinking)))
                return True
            if not done and (n := overlap(buf, _G_THINK_CLOSE)):
                before = buf[:len(buf) - n]
                start = len(before) - trailing_ws(before)
                self.buf = buf[start:]
                if start:
                    out.append(("thinking", buf[:start]))
                return False
            start = len(buf) - trailing_ws(buf) if not done else len(buf)
            self.buf = buf[start:]
            if start:
                out.append(("thinking", buf[:start]))
            return False
        if self.state == self.TOOL_CALL:
            if _G_CALL_CLOSE in buf:
                raw, remaining = buf.split(_G_CALL_CLOSE, 1)
                self.buf, self.state = _lstrip(remaining), self.POST_CALL
                out.append(("call", parse_gemma4_tool_call(raw)))
                return True
            if done:
                self.buf, self.state = "", self.CONTENT
                out.append(("call", parse_gemma4_tool_call(buf)))
            return False
        # after a call: drop stray <tool_call|> and <|tool_response> (gemma4.go:335-388)
        buf = _lstrip(buf)
        while True:
            if buf.startswith(_G_CALL_CLOSE):
                buf = _lstrip(buf[len(_G_CALL_CLOSE):])
            elif buf.startswith(_G_RESPONSE):
                buf = _lstrip(buf[len(_G_RESPONSE):])
            else:
                break
        self.buf = buf
        if buf == "":
            return False
        if _G_CALL_CLOSE.startswith(buf) or _G_RESPONSE.startswith(buf):
            if done:
                self.buf, self.state = "", self.CONTENT
            return False
        self.state = self.CONTENT
        return True


def parse_gemma4_tool_call(content: str) -> Call:
    """gemma4.go:393-428: call:NAME{key:value,...}, strings between <|"|> delimiters.

    Raises:
        ValueError: what Ollama would try to repair (not reimplemented) or refuses.
    """
    if not content.startswith("call:"):
        raise ValueError("expected 'call:' prefix")
    content = content[len("call:"):]
    brace = content.find("{")
    if brace == -1:
        raise ValueError("expected '{' in tool call")
    args = json.loads(gemma4_args_to_json(content[brace:]))
    if not isinstance(args, dict):
        raise ValueError("arguments are not an object")
    return {"name": _strip(content[:brace]), "arguments": args}


def gemma4_args_to_json(s: str) -> str:
    """gemma4.go:430-446: the <|"|> strings set aside, bare keys quoted, the strings put back as JSON."""
    quoted: list[str] = []

    def hold(m: re.Match[str]) -> str:
        quoted.append(m[1])
        return "\x00" + chr(len(quoted) - 1) + "\x00"

    text = _quote_bare_keys(_G_QUOTED.sub(hold, s))
    for i, value in enumerate(quoted):
        # json.Marshal: HTML-escaped, non-ASCII kept
        enc = json.dumps(value, ensure_ascii=False).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
        text = text.replace("\x00" + chr(i) + "\x00", enc)
    return text


def _quote_bare_keys(s: str) -> str:  # quoteGemma4BareKeys, gemma4.go:448-486
    out, i = [], 0
    while i < len(s):
        if s[i] == '"':
            end = _json_quoted_end(s, i)
            if end != -1:
                out.append(s[i:end])
                i = end
                continue
        if s[i] not in "{,":
            out.append(s[i])
            i += 1
            continue
        out.append(s[i])
        i += 1
        space_start = i
        while i < len(s) and s[i] in _GO_SPACE:
            i += 1
        out.append(s[space_start:i])
        key_end = i
        while key_end < len(s) and (s[key_end] == "_" or s[key_end].isalpha() or s[key_end].isdigit()):
            key_end += 1
        if i < key_end < len(s) and s[key_end] == ":":
            out.append('"' + s[i:key_end] + '":')
            i = key_end + 1
    return "".join(out)


def _json_quoted_end(s: str, start: int) -> int:  # gemma4JSONQuotedStringEnd, gemma4.go:799-813
    escaped = False
    for i in range(start + 1, len(s)):
        if s[i] == '"' and not escaped:
            return i + 1
        escaped = s[i] == "\\" and not escaped
    return -1


# ---------------------------------------------------------------- tools/ (a TEMPLATE model's tool calls, no PARSER)


class TemplateToolsParser:
    """tools/tools.go:20-404: Ollama's tool-call parsing for a model without PARSER. The tag is what the TEMPLATE
    prints first inside its `if .ToolCalls` block, up to any '{' ("{" when none: tools/template.go:12-38; modelmint's
    Go analysis reports it, pipelines.chat.gotemplate.analyze). `add` returns (calls, content)."""

    def __init__(self, tools: list[dict[str, Any]] | None, tag: str) -> None:
        self.tools, self.tag, self.buf, self.state, self.n = tools or [], tag, "", "looking", 0

    def add(self, s: str) -> tuple[list[Call], str]:  # tools.go:56-104
        if self.state == "done":
            return [], s
        self.buf += s
        content = ""
        if self.state == "looking":
            i, found = self._find_tag()
            if i == -1:
                content, self.buf = self.buf, ""
            else:
                content, self.buf = self.buf[:i], self.buf[i:]
            if self.tag in ("{", "[") and _strip(content) != "":
                self.state = "done"
                return [], content + self.buf
            if not found:
                return [], content
            self.state = "calling"
        calls = []
        while (call := self._parse_tool_call()) is not None:
            calls.append(call)
        if self._done():
            self.state, content, self.buf = "done", self.buf, ""
        return calls, content

    def _find_tag(self) -> tuple[int, bool]:  # tools.go:106-119
        if (i := self.buf.find(self.tag)) > -1:
            return i, True
        n = overlap(self.buf, self.tag)
        return (len(self.buf) - n, False) if n else (-1, False)

    def _parse_tool_call(self) -> Call | None:  # tools.go:121-157
        tool, end = self._find_tool()
        if tool is None:
            return None
        args, i = _find_arguments(tool, self.buf)
        if args is None:
            return None
        end = max(end, i)
        self.n += 1
        self.buf = self.buf[end:]
        return {"name": tool, "arguments": args}

    def _find_tool(self) -> tuple[str | None, int]:  # tools.go:159-212
        if not self.buf:
            return None, 0
        names = [t["function"]["name"] for t in self.tools]
        longest = max(map(len, names), default=0)
        for i in range(1, min(len(self.buf), longest) + 1):
            tail = self.buf[-i:]
            if any(len(tail) < len(n) and n.startswith(tail) for n in names):
                return None, 0  # a name may be arriving
        found, start, end = None, -1, -1
        for n in names:
            pos = self.buf.find(n)
            if pos == -1 or (start != -1 and (pos > start or (pos == start and found is not None and len(n) <= len(found)))):
                continue
            found, start, end = n, pos, pos + len(n)
        return (found, end) if found is not None else (None, 0)

    def _done(self) -> bool:  # tools.go:338-375
        pairs = {"{": ("{", "}"), "[": ("[", "]")}
        if self.tag not in pairs:
            return False
        op, cl = pairs[self.tag]
        count, in_string, escaped = 0, False, False
        for c in self.buf:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = not in_string
            elif in_string:
                continue
            elif c == op:
                count += 1
            elif c == cl:
                count -= 1
                if count == 0:
                    return True
        return False


def _find_arguments(tool: str, buf: str) -> tuple[dict[str, Any] | None, int]:  # tools.go:214-336
    start, braces, in_string, escaped = -1, 0, False, False
    for i, c in enumerate(buf):
        if escaped:
            escaped = False
            continue
        if c == "\\":
            escaped = True
            continue
        if c == '"':
            in_string = not in_string
            continue
        if in_string:
            continue
        if c == "{":
            if braces == 0:
                start = i
            braces += 1
        elif c == "}":
            braces -= 1
            if braces == 0 and start != -1:
                data = _json_or_none(buf[start:i + 1])
                if not isinstance(data, dict):
                    start = -1
                    continue
                args, found = _find_object(tool, data)
                return (args if found else data), i
            braces = max(braces, 0)
    return None, 0


def _find_object(tool: str, obj: dict[str, Any]) -> tuple[Any, bool]:  # the closure of tools.go:259-315
    def find_map(name: str) -> tuple[dict[str, Any] | None, bool]:
        v = obj.get(name)
        if isinstance(v, dict):
            return v, True
        if isinstance(v, str):
            parsed = _json_or_none(v)
            if isinstance(parsed, dict):
                return parsed, True
        return None, False

    if "name" in obj:
        for key in ("arguments", "parameters"):
            args, ok = find_map(key)
            if ok:
                return args, True
        return None, True
    args, ok = find_map(tool)
    if ok:
        return args, True
    for v in obj.values():  # Go ranges over a map: any order; the suite's objects hold one candidate at most
        for child in (v if isinstance(v, list) else [v]):
            if isinstance(child, dict):
                result, found = _find_object(tool, child)
                if found:
                    return result, True
    return None, False


# ---------------------------------------------------------------- glimmer (model/parsers/glimmer.go)

_G_START, _G_MESSAGE, _G_EOM, _G_EOT = "<|start|>", "<|message|>", "<|eom|>", "<|eot|>"
_G_HEADER = _G_START + "assistant"
_G_CALLS_OPEN, _G_CALLS_CLOSE = "<atem:function_calls>", "</atem:function_calls>"
_G_INVOKE_OPEN, _G_INVOKE_CLOSE = '<atem:invoke name="', "</atem:invoke>"
_G_PARAM_OPEN, _G_PARAM_CLOSE = '<atem:parameter name="', "</atem:parameter>"
_G_INVALID, _G_PENDING, _G_VALID = 0, 1, 2
_G_SPACE = " \t\r\n"


def _glimmer_tools(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:  # glimmer.go:462-476
    return {_strip(t["function"]["name"]): t for t in tools or () if _strip(t["function"]["name"])}


def _glimmer_resolve(tools: dict[str, dict[str, Any]], name: str) -> tuple[str, bool]:  # glimmer.go:447-460
    if name in tools:
        return name, True
    if "." in name:
        ns, fn = name.split(".", 1)
        if fn in tools and ns == fn.split(".", 1)[0]:
            return fn, True
    return name, False


def _glimmer_cut_invoke_name(s: str) -> tuple[str, str, bool]:  # glimmer.go:386-418
    out, rest = "", s
    while True:
        term, tag = rest.find('">'), rest.find(_G_MESSAGE)
        if tag >= 0 and (term < 0 or tag < term):
            out += rest[:tag]
            rest = rest[tag + len(_G_MESSAGE):]
            if rest.startswith(_G_PARAM_OPEN):
                break
            continue
        if term < 0:
            return "", "", False
        out += rest[:term]
        rest = rest[term + 2:]
        break
    return out, rest, True


def _glimmer_atem(body: str, tool: dict[str, Any]) -> tuple[str, dict[str, Any]]:  # glimmer.go:478-533
    body = _strip(body)
    if not body.startswith(_G_CALLS_OPEN) or not body.endswith(_G_CALLS_CLOSE):
        raise ValueError("missing ATEM function_calls wrapper")
    invoke = _strip(body[len(_G_CALLS_OPEN):len(body) - len(_G_CALLS_CLOSE)])
    if not invoke.startswith(_G_INVOKE_OPEN) or not invoke.endswith(_G_INVOKE_CLOSE):
        raise ValueError("missing ATEM invoke wrapper")
    name, rest, ok = _glimmer_cut_invoke_name(invoke[len(_G_INVOKE_OPEN):])
    if not ok or len(rest) < len(_G_INVOKE_CLOSE):
        raise ValueError("malformed ATEM invoke name")
    params = rest[:len(rest) - len(_G_INVOKE_CLOSE)].removeprefix("\n").removesuffix("\n")
    props = (tool["function"].get("parameters") or {}).get("properties")
    args: dict[str, Any] = {}
    while params:
        if not params.startswith(_G_PARAM_OPEN):
            raise ValueError("malformed ATEM parameter")
        params = params[len(_G_PARAM_OPEN):]
        end = params.find('">')
        if end < 0:
            raise ValueError("malformed ATEM parameter name")
        pname, params = params[:end], params[end + 2:]
        vend = params.find(_G_PARAM_CLOSE)
        if vend < 0:
            raise ValueError(f"unterminated ATEM parameter {pname!r}")
        value, params = params[:vend], params[vend + len(_G_PARAM_CLOSE):].removeprefix("\n")
        types: list[str] = []
        if props is not None and pname in props:
            prop = props[pname]
            if prop.get("anyOf"):
                for option in prop["anyOf"]:
                    types += _type_list(option.get("type"))
            else:
                types = _type_list(prop.get("type"))
        args[pname] = parse_typed_tool_value(value, types)
    return name, args


class GlimmerParser:
    """glimmer.go:36-543: <|message|> headers (to=self: thinking, to=<tool>: an ATEM call, else content) ended by
    <|eom|> or <|eot|>, or by the next assistant header."""

    def __init__(self, tools: list[dict[str, Any]] | None, last: dict[str, Any] | None = None,
                 think: bool | None = None) -> None:  # glimmer.go:58-67 Init
        self.state, self.buf, self.recipient = "header", "", ""
        self.tools = _glimmer_tools(tools)
        self.emit_thinking = think is None or think
        self.streamed = False

    def add(self, s: str, done: bool) -> Out:  # glimmer.go:69-117
        self.buf += s
        content, thinking, calls = "", "", []
        while True:
            if self.state == "header":
                progress, fallback = self._header(done)
                content += fallback
                if not progress:
                    break
                continue
            progress, body, complete = self._body(done)
            if self.state == "content":
                call = self._content_call(body, complete)
                if call is not None:
                    calls.append(call)
                elif body:
                    content += body
                    self.streamed = True
            elif self.state == "thinking":
                if self.emit_thinking:
                    thinking += body
            elif complete:  # tool
                calls.append(self._tool_call(body))
            if complete:
                self.state, self.recipient, self.streamed = "header", "", False
            if not progress:
                break
        return content, thinking, calls

    def _header(self, done: bool) -> tuple[bool, str]:  # glimmer.go:119-152 consumeHeader
        acc = self.buf
        if acc.startswith(_G_HEADER):
            acc = self.buf = acc[len(_G_HEADER):]
        elif _G_HEADER.startswith(acc) and acc.startswith("<") and not done:
            return False, ""
        idx = acc.find(_G_MESSAGE)
        if idx < 0:
            if not done:
                return False, ""
            self.buf = ""
            return acc != "", acc
        header = _strip(acc[:idx])
        self.buf = acc[idx + len(_G_MESSAGE):]
        self.recipient = _strip(header.removeprefix("to="))
        _name, is_tool = _glimmer_resolve(self.tools, self.recipient)  # glimmer.go:154-164
        self.state = "thinking" if self.recipient == "self" else "tool" if is_tool else "content"
        return True, ""

    def _body(self, done: bool) -> tuple[bool, str, bool]:  # glimmer.go:166-225 consumeBody
        acc = self.buf
        hold = self.state == "tool" or self._hold_content(acc)
        control = 0
        if hold:
            close = acc.find(_G_CALLS_CLOSE)
            control = close + len(_G_CALLS_CLOSE) if close >= 0 else len(acc)
        idx, mlen = _glimmer_terminator(acc[control:])
        if idx >= 0:
            idx += control
        implicit, wait = self._implicit_header(acc, control, done)
        if implicit >= 0 and not wait and (idx < 0 or implicit < idx):
            self.buf = acc[implicit:]
            return True, acc[:implicit], True
        if idx >= 0:
            self.buf = acc[idx + mlen:]
            return True, acc[:idx], True
        if done:
            self.buf = ""
            return acc != "" or self.state == "tool", acc, True
        if hold:
            return False, "", False
        if wait:
            self.buf = acc[implicit:]
            return acc[:implicit] != "", acc[:implicit], False
        keep = max(overlap(acc, _G_EOM), overlap(acc, _G_EOT))
        if len(acc) == keep:
            return False, "", False
        self.buf = acc[len(acc) - keep:]
        body = acc[:len(acc) - keep]
        return body != "", body, False

    def _implicit_header(self, s: str, search: int, done: bool) -> tuple[int, bool]:  # glimmer.go:227-253
        while True:
            i = s.find(_G_START, search)
            if i < 0:
                break
            status = self._header_status(s[i:], done)
            if status == _G_VALID:
                return i, False
            if status == _G_PENDING:
                return i, True
            search = i + len(_G_START)
        if done:
            return -1, False
        keep = overlap(s[search:], _G_HEADER)
        return (len(s) - keep, True) if keep > 0 else (-1, False)

    def _header_status(self, s: str, done: bool) -> int:  # glimmer.go:263-324 assistantHeaderStatus
        if len(s) < len(_G_HEADER):
            return _G_PENDING if not done and _G_HEADER.startswith(s) else _G_INVALID
        if not s.startswith(_G_HEADER):
            return _G_INVALID
        rest = s[len(_G_HEADER):]
        if rest.startswith(_G_MESSAGE):
            return _G_VALID
        if not done and _G_MESSAGE.startswith(rest):
            return _G_PENDING
        if rest == "":
            return _G_INVALID if done else _G_PENDING
        prefix = " to="
        if len(rest) < len(prefix):
            return _G_PENDING if not done and prefix.startswith(rest) else _G_INVALID
        if not rest.startswith(prefix):
            return _G_INVALID
        after = rest[len(prefix):]
        m = after.find(_G_MESSAGE)
        if m >= 0:
            r = after[:m]
            valid = r in ("self", "user") or r in self.tools  # glimmer.go:326-328 validAssistantRecipient
            return _G_VALID if valid else _G_INVALID
        if done:
            return _G_INVALID
        if after == "":
            return _G_PENDING
        if any(c in after for c in _G_SPACE):
            return _G_INVALID
        lt = after.find("<")
        if lt >= 0:
            return _G_PENDING if _G_MESSAGE.startswith(after[lt:]) else _G_INVALID
        return _G_PENDING

    def _hold_content(self, acc: str) -> bool:  # glimmer.go:341-347
        if self.state != "content" or self.streamed or not self.tools:
            return False
        trimmed = acc.lstrip(_G_SPACE)
        return _G_CALLS_OPEN.startswith(trimmed) or trimmed.startswith(_G_CALLS_OPEN)

    def _content_call(self, body: str, complete: bool) -> Call | None:  # glimmer.go:349-367
        if not complete or self.streamed or not self.tools:
            return None
        trimmed = _strip(body)
        if not trimmed.startswith(_G_CALLS_OPEN) or not trimmed.endswith(_G_CALLS_CLOSE):
            return None
        inner = _strip(trimmed[len(_G_CALLS_OPEN):len(trimmed) - len(_G_CALLS_CLOSE)])  # glimmer.go:369-379
        name = ""
        if inner.startswith(_G_INVOKE_OPEN):
            cut, _rest, ok = _glimmer_cut_invoke_name(inner[len(_G_INVOKE_OPEN):])
            name = cut if ok else ""
        resolved, ok = _glimmer_resolve(self.tools, name)
        if not ok:
            return None
        try:
            _name, args = _glimmer_atem(trimmed, self.tools[resolved])
        except ValueError:
            return None
        return {"name": resolved, "arguments": args}

    def _tool_call(self, body: str) -> Call:  # glimmer.go:420-439 parseToolCall
        if not self.recipient:
            raise ValueError("empty Glimmer function name")
        recipient, ok = _glimmer_resolve(self.tools, self.recipient)
        if not ok:
            raise ValueError(f"undeclared Glimmer function {self.recipient!r}")
        name, args = _glimmer_atem(body, self.tools[recipient])
        resolved, ok = _glimmer_resolve(self.tools, name)
        if not ok or resolved != recipient:
            raise ValueError(f"Glimmer recipient {self.recipient!r} does not match ATEM invoke {name!r}")
        return {"name": recipient, "arguments": args}


def _glimmer_terminator(s: str) -> tuple[int, int]:  # glimmer.go:330-339
    idx, mlen = -1, 0
    for marker in (_G_EOM, _G_EOT):
        i = s.find(marker)
        if i >= 0 and (idx < 0 or i < idx):
            idx, mlen = i, len(marker)
    return idx, mlen


# ---------------------------------------------------------------- harmony (harmony/harmonyparser.go)
#
# Ollama's PARSER harmony (parsers.go:69-70 harmony.NewHarmonyMessageHandler), which Ollama also switches on by
# itself for a gpt-oss model whose TEMPLATE holds <|start|> and <|end|> (server/routes.go:77-87, 2662-2671).


def _harmony_header(raw: str) -> dict[str, str]:
    """harmonyparser.go:186-241 parseHeader: role, channel and recipient of `<|start|>HEADER<|message|>`."""
    header = {"role": "", "channel": "", "recipient": ""}
    if "<|constrain|>" in raw:  # :189-194
        raw = _strip(raw.replace("<|constrain|>", " <|constrain|>", 1))
    at = raw.find("<|channel|>")  # :196-214
    if at != -1:
        before, after = raw[:at], raw[at + len("<|channel|>"):]
        end = next((i for i, ch in enumerate(after) if ch in _GO_SPACE), len(after))
        header["channel"] = after[:end]
        raw = _strip(before + after[end:])
    tokens = [t for t in re.split("[" + re.escape("".join(sorted(_GO_SPACE))) + "]+", raw) if t]  # :217 strings.Fields
    if not tokens:  # :220-223
        return header
    role, rest = tokens[0], tokens[1:]
    if role.startswith("to="):  # :227-232
        header["recipient"], header["role"] = role[3:], "tool"
    else:
        header["role"] = role
    if not header["recipient"] and rest and rest[0].startswith("to="):  # :236-238
        header["recipient"] = rest[0][3:]
    return header


class HarmonyEvents:
    """harmonyparser.go:36-43 HarmonyParser (tags :274-281): the message stream as start / header / content / end
    events. Events are ("start",), ("header", {role, channel, recipient}), ("content", text), ("end",)."""

    START, END, HEADER_END = "<|start|>", "<|end|>", "<|message|>"

    def __init__(self) -> None:
        self.state = "start"  # :16-20 LookingForMessageStart, ParsingHeader, ParsingContent
        self.acc = ""

    def add_implicit_start(self) -> None:  # :75-77
        self.acc += "<|start|>assistant"

    def add_implicit_start_or_prefill(self, last: dict[str, Any] | None) -> None:  # :79-91
        if last is not None and last.get("role") == "assistant":
            if last.get("content"):
                self.acc += "<|start|>assistant<|channel|>final<|message|>"
                return
            if last.get("thinking"):
                self.acc += "<|start|>assistant<|channel|>analysis<|message|>"
                return
        self.add_implicit_start()

    def add(self, content: str) -> list[tuple[Any, ...]]:  # :93-110
        self.acc += content
        events: list[tuple[Any, ...]] = []
        more = True
        while more:
            got, more = self._eat()
            events += got
        return events

    def _eat(self) -> tuple[list[tuple[Any, ...]], bool]:  # :113-183 eat
        if self.state == "start":  # :115-131
            if self.START in self.acc:
                self.acc = self.acc.split(self.START, 1)[1]
                self.state = "header"
                return [("start",)], True
            return [], False
        if self.state == "header":  # :133-142
            if self.HEADER_END in self.acc:
                header, self.acc = self.acc.split(self.HEADER_END, 1)
                self.state = "content"
                return [("header", _harmony_header(header))], True
            return [], False
        if self.END in self.acc:  # :145-158
            text, self.acc = self.acc.split(self.END, 1)
            self.state = "start"
            return ([("content", text)] if text else []) + [("end",)], True
        keep = overlap(self.acc, self.END)  # :159-172 (overlap :243-252, as parsers.go's)
        if keep:
            text, self.acc = self.acc[:-keep], self.acc[-keep:]
            return ([("content", text)] if text else []), False
        text, self.acc = self.acc, ""  # :173-180
        return ([("content", text)] if text else []), False


def harmony_valid_chars(name: str) -> str:
    """harmonyparser.go:509-537 convertToValidChars: ' ', '-', '.' to '_', letters, digits, '_' and '$' kept
    (unicode.IsLetter / IsDigit), the rest dropped; 'unnamed' when nothing is left, '_' before a leading digit
    (Go looks at the first byte)."""
    out = "".join("_" if ch in " -." else ch if (ch.isalpha() or unicodedata.category(ch) == "Nd" or ch in "_$")
                  else "" for ch in name)
    if not out:
        return "unnamed"
    return "_" + out if out[0] in "0123456789" else out


class HarmonyNames:
    """harmonyparser.go:377-391, 476-561 FunctionNameMap: user tool names to harmony identifiers and back."""

    def __init__(self) -> None:
        self.to_harmony: dict[str, str] = {}
        self.to_user: dict[str, str] = {}

    def convert_and_add(self, user: str) -> str:  # :476-488
        base = harmony_valid_chars(user)
        candidate, count = base, 2  # :539-561 deriveName
        while candidate in self.to_user:
            candidate, count = f"{base}_{count}", count + 1
        if user in ("browser.open", "browser.search", "browser.find", "python"):  # :478-481
            candidate = user
        self.to_harmony[user] = candidate
        self.to_user[candidate] = user
        return candidate

    def original(self, harmony: str) -> str:  # :490-498
        return self.to_user.get(harmony, harmony)


class HarmonyParser:
    """harmonyparser.go:262-453 HarmonyMessageHandler: Init (:393-427) then Add (:430-453)."""

    def __init__(self, tools: list[dict[str, Any]] | None, last: dict[str, Any] | None, think: bool | None) -> None:
        self.events = HarmonyEvents()
        self.events.add_implicit_start_or_prefill(last)  # :399-404
        self.state = "normal"  # :256-260
        self.names = HarmonyNames()
        for tool in tools or ():  # :413-424
            if tool["function"].get("name"):
                self.names.convert_and_add(tool["function"]["name"])
        self.tool_name: str | None = None  # :343-354 HarmonyToolCallAccumulator
        self.tool_acc = ""

    def add(self, s: str, done: bool) -> Out:
        content, thinking, tool = [], [], []
        for event in self.events.add(s):  # :289-334 AddContent
            if event[0] == "header":
                h = event[1]
                if h["channel"] in ("analysis", "commentary") and h["recipient"]:  # :300-316
                    self.state, self.tool_name = "tool", h["recipient"]
                elif h["channel"] == "analysis":
                    self.state = "thinking"
                elif h["channel"] in ("commentary", "final"):
                    self.state = "normal"
            elif event[0] == "content":  # :320-328
                {"normal": content, "thinking": thinking, "tool": tool}[self.state].append(event[1])
            elif event[0] == "end":  # :329-330
                self.state = "normal"
        self.tool_acc += "".join(tool)  # :432-435
        calls: list[Call] = []
        if done:  # :437-450: one call, at the end of the output
            name, raw = self.tool_name, self.tool_acc
            self.tool_acc = ""
            if name is not None:
                name = self.names.original(name.removeprefix("functions."))
                try:
                    args = json.loads(raw)
                except ValueError as e:
                    raise ValueError(f"error parsing tool call: raw='{raw}', err={e}") from None
                calls.append({"name": name, "arguments": args})
        return "".join(content), "".join(thinking), calls


AnyParser = (Qwen35Parser | Qwen3CoderParser | MinistralParser | LFM2Parser | Gemma4Parser | GlimmerParser
             | HarmonyParser)


def new_parser(name: str, tools: list[dict[str, Any]] | None, last: dict[str, Any] | None = None,
               think: bool | None = None) -> AnyParser:
    """ParserForName (parsers.go:43-101) then Init, for the names reimplemented here."""
    if name == "qwen3.5":
        return Qwen35Parser(tools, last, think)
    if name == "qwen3-coder":
        return Qwen3CoderParser(tools, last, think)
    if name == "ministral":
        return MinistralParser(tools, last, think, thinking_support=False)
    if name == "gemma4":
        return Gemma4Parser(tools, last, think)
    if name == "glimmer":
        return GlimmerParser(tools, last, think)
    if name == "harmony":
        return HarmonyParser(tools, last, think)
    if name in ("lfm2", "lfm2-thinking"):
        return LFM2Parser(tools, last, think, thinking_support=name == "lfm2-thinking")
    raise KeyError(name)


PARSERS = ("qwen3.5", "qwen3-coder", "ministral", "lfm2", "lfm2-thinking", "gemma4", "glimmer", "harmony")


def parse(name: str, output: str, tools: list[dict[str, Any]] | None, *, last: dict[str, Any] | None = None,
          think: bool | None = None) -> Out:
    """The whole output in one Add(output, done=true), as at the end of a non-streamed /api/chat."""
    return new_parser(name, tools, last, think).add(output, True)
