"""Render Ollama TEMPLATEs with Go's text/template through the bundled program in pipelines/gorender/."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines import PACKAGE
from pipelines.core.errors import ModelmintError, ToolError
from pipelines.core.gobuild import GoProgram
from pipelines.core.runner import run
from pipelines.core.settings import Settings

GORENDER = GoProgram("gorender", PACKAGE / "gorender", "the template renderer")


class TemplateRenderError(ModelmintError):
    """An Ollama TEMPLATE that Go's text/template rejects or fails to execute."""


def gorender_binary(settings: Settings) -> Path:
    """The renderer built from the bundled source (pipelines/gorender/), compiled once per source hash.

    Raises:
        GoMissing: it is not built yet and there is no Go compiler.
        ToolError: `go build` failed.
    """
    return GORENDER.binary(settings)


@dataclass(frozen=True)
class OllamaRequest:
    """One rendering: an Ollama TEMPLATE and the /api/chat-shaped data Ollama renders it with."""

    template: str
    messages: tuple[dict[str, Any], ...] = ()
    tools: tuple[dict[str, Any], ...] | None = None
    think: bool | str | None = None
    now: str | None = None
    """YYYY-MM-DD for currentDate/yesterdayDate (default: today)."""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"messages": list(self.messages)}
        if self.tools is not None:
            data["tools"] = list(self.tools)
        if self.think is not None:
            data["think"] = self.think
        if self.now is not None:
            data["now"] = self.now
        return {"template": self.template, "data": data}


def render_batch(requests: Sequence[OllamaRequest], settings: Settings) -> list[str | TemplateRenderError]:
    """Render every request in one run of the Go renderer; a failing request yields its error.

    Raises:
        GoMissing, ToolError: the renderer cannot be built or run.
    """
    if not requests:
        return []
    binary = gorender_binary(settings)
    with tempfile.NamedTemporaryFile("w", suffix=".json", encoding="utf-8", delete=False) as fh:
        json.dump({"batch": [r.to_json() for r in requests]}, fh, ensure_ascii=False)
        path = Path(fh.name)
    try:
        result = run([binary, path], timeout=120)
    finally:
        path.unlink(missing_ok=True)
    try:
        answers = json.loads(result.stdout)
    except ValueError as err:
        raise ToolError([str(binary), str(path)], 0, result.stdout[-2000:],
                        hint="the renderer printed something that is not JSON") from err
    out: list[str | TemplateRenderError] = []
    for answer in answers:
        if "error" in answer:
            out.append(TemplateRenderError(f"the TEMPLATE failed in Go's text/template: {answer['error']}"))
        else:
            out.append(answer["output"])
    return out


def render(request: OllamaRequest, settings: Settings) -> str:
    """Render one request as Ollama would.

    Raises:
        TemplateRenderError: the template does not parse or fails on this data.
        GoMissing, ToolError: the renderer cannot be built or run.
    """
    (answer,) = render_batch([request], settings)
    if isinstance(answer, TemplateRenderError):
        raise answer
    return answer


@dataclass(frozen=True)
class TemplateAnalysis:
    """What Ollama reads out of a TEMPLATE itself, beyond rendering it."""

    vars: tuple[str, ...]
    """Lower-cased fields and variables it mentions ("tools" makes Ollama offer tool calling)."""
    tool_tag: str
    """The text Ollama's tool-call parser waits for in the model's output ("{" means bare JSON)."""
    thinking_tags: tuple[str, ...]
    """(opening, closing) tags Ollama's thinking parser uses; empty when the template declares none."""


def analyze(template: str, settings: Settings) -> TemplateAnalysis:
    """Ollama's reading of a TEMPLATE: its variables, its tool-call tag and its thinking tags.

    Raises:
        TemplateRenderError: the template does not parse.
        GoMissing, ToolError: the renderer cannot be built or run.
    """
    binary = gorender_binary(settings)
    with tempfile.NamedTemporaryFile("w", suffix=".json", encoding="utf-8", delete=False) as fh:
        json.dump({"template": template, "analyze": True}, fh, ensure_ascii=False)
        path = Path(fh.name)
    try:
        result = run([binary, path], timeout=60, check=False)
    finally:
        path.unlink(missing_ok=True)
    if result.returncode != 0:
        raise TemplateRenderError(f"the TEMPLATE does not parse in Go's text/template: {result.stderr.strip()}")
    data = json.loads(result.stdout)
    return TemplateAnalysis(tuple(data["vars"]), data["tool_tag"], tuple(data["thinking_tags"]))
