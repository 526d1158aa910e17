"""Render one conversation suite through a Hugging Face chat template and through an Ollama TEMPLATE, to compare."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from pipelines.chat import jinja as chat_template
from pipelines.chat.families import ChatFamily, TemplateTokens
from pipelines.chat.gotemplate import OllamaRequest, TemplateRenderError, render_batch
from pipelines.core.errors import UnsupportedModel
from pipelines.core.settings import Settings

# Tool schemas as transformers' get_json_schema writes them (property keys: type, items, enum,
# description), with property names in sorted order (Ollama holds them in a Go map).
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "search",
        "description": 'Search the web & return at most 5 results (use "quotes" for phrases, <= 100 chars)',
        "parameters": {
            "type": "object",
            "properties": {
                "max_results": {"type": "integer", "description": "How many results, 1 to 5"},
                "query": {"type": "string", "description": "What to search for"},
                "tags": {"type": "array", "items": {"type": "string"}, "description": "Topics to filter on"},
            },
            "required": ["query"],
        },
    },
}
TOOLS = (WEATHER_TOOL, SEARCH_TOOL)

SYSTEM = "You are a careful assistant. Answer in one sentence."
ODD_SYSTEM = 'Réponds en français. Keep "quotes", back\\slashes, {{ .System }} and {% raw %} as they are; 日本語 🚀'


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _calls(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


def _tool(call_id: str, name: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def _u(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _a(text: str, reasoning: str | None = None) -> dict[str, Any]:
    m: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning is not None:
        m["reasoning"] = reasoning
    return m


def _s(text: str) -> dict[str, Any]:
    return {"role": "system", "content": text}


PARIS = _call("call00001", "get_weather", {"city": "Paris", "unit": "celsius"})
LYON = _call("call00002", "get_weather", {"city": "Lyon", "unit": "celsius"})
SEARCH = _call("call00003", "search", {"max_results": 3, "query": 'llama.cpp "GGUF"', "tags": ["ml", "quantization"]})
WEATHER_JSON = '{"temperature": 22, "sky": "sunny"}'


@dataclass(frozen=True)
class Conversation:
    """One chat request: messages in transformers' form (plus `reasoning` for a thinking model's history)."""

    name: str
    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] | None = None
    think: bool | None = None

    @property
    def continues_assistant(self) -> bool:
        return self.messages[-1]["role"] == "assistant"


SUITE: tuple[Conversation, ...] = (
    Conversation("user", (_u("What is the capital of France?"),)),
    Conversation("system-user", (_s(SYSTEM), _u("What is the capital of France?"))),
    Conversation("multi-turn", (_u("Hi!"), _a("Hello! How can I help?"), _u("Name a prime number."))),
    Conversation("system-multi-turn", (
        _s(SYSTEM), _u("Hi!"), _a("Hello! How can I help?"), _u("Name a prime number."),
    )),
    Conversation("continue-assistant", (_u("Finish the sentence: the sky is"), _a("The sky is"))),
    Conversation("special-characters", (
        _s(ODD_SYSTEM),
        _u('Print "{{ .Prompt }}", a backslash \\, a tab\tand 10 < 20 & 30 > 25.'),
        _a('Done: "{{ .Prompt }}" \\ \t 10 < 20 & 30 > 25.'),
        _u("Encore, en 日本語 ?"),
    )),
    Conversation("tools-offered", (_s(SYSTEM), _u("What's the weather in Paris?")), TOOLS),
    Conversation("tools-offered-no-system", (_u("What's the weather in Paris?"),), TOOLS),
    Conversation("tool-call-and-result", (
        _u("What's the weather in Paris?"), _calls(PARIS), _tool("call00001", "get_weather", WEATHER_JSON),
    ), TOOLS),
    Conversation("tool-round-trip", (
        _s(SYSTEM), _u("What's the weather in Paris?"), _calls(PARIS),
        _tool("call00001", "get_weather", WEATHER_JSON), _a("It is 22 °C and sunny in Paris."), _u("And in Lyon?"),
    ), TOOLS),
    Conversation("parallel-tool-calls", (
        _u("Weather in Paris and in Lyon?"), _calls(PARIS, LYON),
        _tool("call00001", "get_weather", WEATHER_JSON), _tool("call00002", "get_weather", '{"temperature": 19}'),
    ), TOOLS),
    Conversation("tool-call-nested-arguments", (
        _u("Find pages about GGUF."), _calls(SEARCH), _tool("call00003", "search", "1. GGUF spec\n2. llama.cpp"),
    ), TOOLS),
    Conversation("reasoning-in-history", (
        _u("What is 2+2?"), _a("4", reasoning="2 plus 2 makes 4."), _u("And 3+3?"),
    )),
    Conversation("think-on", (_u("Think carefully: what is 17*23?"),), think=True),
    Conversation("think-off", (_u("Quick: what is 2+2?"),), think=False),
    Conversation("reasoning-in-tool-loop", (
        _u("What's the weather in Paris?"), {**_calls(PARIS), "reasoning": "I need the weather tool."},
        _tool("call00001", "get_weather", WEATHER_JSON),
    ), TOOLS, think=True),
)


def hf_messages(conv: Conversation, family: ChatFamily, jinja: str) -> list[dict[str, Any]]:
    """The conversation as a transformers user passes it to apply_chat_template."""
    string_arguments = family.string_arguments(jinja)
    out = []
    for m in conv.messages:
        m = dict(m)
        reasoning = m.pop("reasoning", None)
        if m.get("content") is None and not family.content_none_ok:
            m["content"] = ""
        if reasoning is not None and family.thinking and family.reasoning_key:
            m[family.reasoning_key] = reasoning
        elif reasoning is not None and family.thinking:
            m["content"] = f"<think>\n{reasoning}\n</think>{m['content'] or ''}"
        if "tool_calls" in m and string_arguments:
            m["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"],
                                                                            ensure_ascii=False)}}
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


def ollama_messages(conv: Conversation) -> list[dict[str, Any]]:
    """The conversation as an Ollama /api/chat client sends it (reasoning in `thinking`, names as tool_name)."""
    out = []
    for m in conv.messages:
        msg: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
        if m.get("reasoning"):
            msg["thinking"] = m["reasoning"]
        if m.get("tool_calls"):
            msg["tool_calls"] = [
                {"id": c["id"], "function": {"index": i, "name": c["function"]["name"],
                                             "arguments": c["function"]["arguments"]}}
                for i, c in enumerate(m["tool_calls"])
            ]
        if m["role"] == "tool":
            msg["tool_name"] = m.get("name", "")
            msg["tool_call_id"] = m.get("tool_call_id", "")
        out.append(msg)
    return out


@dataclass(frozen=True)
class Rendering:
    conversation: str
    hf: str | None
    """The Jinja rendering as transformers produces it, after the family's documented normalisation."""
    hf_error: str | None
    ollama: str | None
    """The Go rendering, with the BOS text prefixed when the engine adds the BOS token itself."""
    ollama_error: str | None

    @property
    def equal(self) -> bool:
        return self.hf is not None and self.hf == self.ollama


def render_hf(jinja: str, conv: Conversation, family: ChatFamily, tokens: TemplateTokens, *,
              now: date) -> str:
    """Raises: UnsupportedModel: the Jinja refuses this conversation."""
    special: dict[str, Any] = {k: v for k, v in (("bos_token", tokens.bos), ("eos_token", tokens.eos)) if v is not None}
    if conv.think is not None:
        special[family.think_variable] = family.think_values[conv.think] if family.think_values else conv.think
    try:
        text = chat_template.render(
            jinja, hf_messages(conv, family, jinja),
            add_generation_prompt=not conv.continues_assistant,
            continue_final_message=conv.continues_assistant,
            tools=list(conv.tools) if conv.tools else None,
            now=datetime(now.year, now.month, now.day, 12, 0),
            **special,
        )
    except (TypeError, ValueError) as err:  # a Jinja that concatenates a None, …
        raise UnsupportedModel(f"the chat template failed to render: {err}") from err
    if family.jinja_date and "strftime_now" in jinja:
        # Documented (ChatFamily.jinja_date): Ollama's currentDate has no format; the same date prints as YYYY-MM-DD.
        text = text.replace(now.strftime(family.jinja_date), f"{now:%Y-%m-%d}", 1)
    return text


def render_both(
    jinja: str,
    go_template: str,
    family: ChatFamily,
    tokens: TemplateTokens,
    settings: Settings,
    *,
    conversations: tuple[Conversation, ...] = SUITE,
    now: date | None = None,
) -> list[Rendering]:
    """Render every conversation through the Jinja (as transformers) and the TEMPLATE (as Ollama).

    Raises:
        GoMissing, ToolError: the Go renderer cannot be built or run.
    """
    today = now or date.today()
    requests = [
        OllamaRequest(go_template, tuple(ollama_messages(c)), c.tools, c.think, today.isoformat())
        for c in conversations
    ]
    go_out = render_batch(requests, settings)
    bos = tokens.bos if family.bos_in_template and tokens.engine_adds_bos and tokens.bos else ""
    out = []
    for conv, go in zip(conversations, go_out, strict=True):
        try:
            hf, hf_error = render_hf(jinja, conv, family, tokens, now=today), None
        except UnsupportedModel as err:
            hf, hf_error = None, err.message
        if isinstance(go, TemplateRenderError):
            out.append(Rendering(conv.name, hf, hf_error, None, go.message))
        else:
            out.append(Rendering(conv.name, hf, hf_error, bos + go, None))
    return out
