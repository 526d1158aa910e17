"""Render Hugging Face chat templates (Jinja) the way transformers does, without importing transformers."""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, ClassVar

from pipelines.core.errors import UnsupportedModel


def _raise(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def generation_extension() -> Any:
    """The `{% generation %}…{% endgeneration %}` tag transformers' chat templates may use: it marks the
    assistant's tokens for training masks and renders its body unchanged (transformers' AssistantTracker)."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        # jinja2 annotates it as an instance attribute and reads it from the class
        tags: ClassVar[set[str]] = {"generation"}  # type: ignore[misc]

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    return Generation


def environment() -> Any:
    """The Jinja environment transformers builds in utils/chat_template_utils.py: sandboxed, trim/lstrip blocks,
    loop controls and the generation tag."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    return ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                         extensions=[loopcontrols, generation_extension()])


@lru_cache(maxsize=32)
def _compile(source: str) -> Any:
    # A JSON filter that keeps non-ASCII, raise_exception and strftime_now, as transformers adds them.
    env = environment()
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


class InvalidJinja(UnsupportedModel):
    """A chat template that does not compile as Jinja in transformers' environment."""


def check_syntax(source: str) -> None:
    """Compile a chat template as transformers does, before anything reads meaning into its text.

    Raises:
        InvalidJinja: it does not compile; the message names the line, the text on it and Jinja's reason.
    """
    from jinja2 import TemplateSyntaxError

    try:
        _compile(source)
    except TemplateSyntaxError as err:  # TemplateAssertionError (an unknown filter or test) is one too
        lines = source.splitlines()
        text = lines[err.lineno - 1].strip() if 0 < err.lineno <= len(lines) else ""
        shown = f" ({text[:80]!r})" if text else ""
        raise InvalidJinja(
            f"the chat template is not valid Jinja: line {err.lineno}{shown}: {err.message}",
            hint="fix that line of the template: transformers compiles it the same way, so the model could not "
            "chat with it either; `modelmint template FILE` checks a corrected copy") from err


_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def render(
    template: str,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
    continue_final_message: bool = False,
    now: datetime | None = None,
    **special_tokens: Any,
) -> str:
    """Render `messages` through a Hugging Face chat template, as `apply_chat_template(tokenize=False)` does.

    `special_tokens` (bos_token, eos_token, …) and any other template variables (enable_thinking, …) are
    passed to the template like transformers passes them. `continue_final_message` leaves the last
    message open for the model to continue, cut the way transformers cuts it. `now` pins the time
    `strftime_now` reports (transformers always uses the current time).

    Raises:
        UnsupportedModel: the template does not compile or raises for these messages.
    """
    from jinja2.exceptions import TemplateError

    if continue_final_message:
        messages = [*messages[:-1], {**messages[-1], "content": messages[-1]["content"] + _CONTINUE_TAG}]
    variables: dict[str, Any] = {"documents": None, **special_tokens}
    if now is not None:
        variables["strftime_now"] = lambda fmt: now.strftime(fmt)
    try:
        rendered = _compile(template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, tools=tools, **variables
        )
    except TemplateError as err:
        raise UnsupportedModel(
            f"the chat template failed to render: {err}",
            hint="check tokenizer_config.json's chat_template (or chat_template.jinja) in the source",
        ) from err
    if continue_final_message:
        final = messages[-1]["content"][: -len(_CONTINUE_TAG)]
        if final.strip() not in rendered or _CONTINUE_TAG.strip() not in rendered:
            raise UnsupportedModel(
                "the chat template drops part of the final message, so it cannot be continued",
                hint="end the conversation with a user message instead",
            )
        at = rendered.rindex(_CONTINUE_TAG.strip())
        rendered = rendered[:at] if rendered[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else rendered[:at].rstrip()
    return rendered
