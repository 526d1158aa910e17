"""Families Ollama renders in Go code with a built-in RENDERER and PARSER (no proven TEMPLATE stands in for them); each
is recognised by markers of its template and refused when a forbidden text shows up.
"""

from __future__ import annotations

from pipelines.chat.families.core import ChatFamily, register
from pipelines.chat.families.helpers import _has_all, _has_none

# ---------------------------------------------------------------- families Ollama renders in Go code
#
# Ollama sets the RENDERER itself for their GGUF architecture (gemma4, laguna, nemotron_h: a TEMPLATE would not be
# used). Where the RENDERER renders other bytes
# than the Jinja on the suite, the family is refused with the conversations. They are recognised by markers taken
# from the template itself; every marker must be present and no forbidden text, so a neighbour (an older or newer
# version of the same model line) is refused with what it lacks instead of being published with the wrong renderer.
# (Families whose RENDERER differed and whose Jinja a TEMPLATE can follow now have a proven TEMPLATE instead: Qwen3-
# Coder, Qwen3.5, GLM-4.7, LFM2, DeepSeek V3.1, Muse Glimmer and Cohere2 MoE.)


def _renderer_family(name: str, title: str, *, renderer: str, parser: str, markers: tuple[str, ...],
                     forbidden: tuple[str, ...], stop: tuple[str, ...], notes: tuple[str, ...] = (),
                     thinking: bool = False, differs: tuple[str, ...] | None = None,
                     reasoning_key: str | None = None, think_variable: str = "enable_thinking",
                     think_values: tuple[str, str] | None = None, why: str = "") -> ChatFamily:
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
        reasoning_key=reasoning_key,
        think_variable=think_variable,
        think_values=think_values,
        notes=("rendered by Ollama's built-in RENDERER " + renderer + (
            "; not yet checked against the Jinja on modelmint's suite" if differs is None else
            "; byte-identical to the Jinja on modelmint's suite" if not differs else
            "; refused: it renders differently from the Jinja") + " (no Go TEMPLATE can follow this Jinja)", *notes),
        markers=markers,
        renderer=renderer,
        parser=parser,
        tool_calls=f"PARSER {parser} returns structured tool_calls",
        renderer_differs=differs,
        renderer_why=why,
    ))


_IM = ("<|im_end|>", "<|im_start|>")

_renderer_family(
    "nemotron-3-nano", "NVIDIA Nemotron 3 Nano (ChatML, <think> with history truncation, XML tool calls)",
    renderer="nemotron-3-nano", parser="nemotron-3-nano", stop=_IM, thinking=True, reasoning_key="reasoning_content",
    why=("Ollama's renderer closes a final assistant message and opens a new turn (model/renderers/nemotron3nano.go:"
         "61-120) where the Jinja continues it, as Ollama's own PARSER takes such a message for a prefill to continue "
         "(model/parsers/nemotron3nano.go:52-55); Ollama sets this RENDERER itself for nemotron_h GGUFs "
         "(server/create.go:813-815), so no TEMPLATE can stand in"),
    differs=("continue-assistant",),
    markers=("<|im_start|>", "<think>", "<function=", "<parameter=", "truncate_history_thinking",
             "render_extra_keys"),
    forbidden=("<|vision_start|>",),
)
_G4_MARKERS = ("<|turn>", "<turn|>", '<|"|>', "<|tool_call>", "<|channel>", "'<|channel>thought\\n<channel|>'")
_G4_CONTINUE = ("Ollama's renderer closes a final assistant message and opens a new model turn "
                "(model/renderers/gemma4.go:127-133, 138-143) where the Jinja continues it")
_G4_FORCED = ("; Ollama sets RENDERER gemma4 itself for gemma4 GGUFs (server/create.go:800-807), so no TEMPLATE can "
              "stand in")
_renderer_family(
    "gemma4", "Gemma 4 26B/31B (<|turn>, <|\"|> strings, <|tool_call>, empty thought channel when not thinking)",
    renderer="gemma4-large", parser="gemma4", stop=("<turn|>",), thinking=True, reasoning_key="reasoning_content",
    why=(_G4_CONTINUE + ", and after a tool result with thinking on it opens a thought channel "
         "(gemma4.go:144-146) the Jinja does not write" + _G4_FORCED),
    differs=("continue-assistant", "reasoning-in-tool-loop"),
    markers=(*_G4_MARKERS, "format_tool_response_block"),
    forbidden=(),
    notes=("Ollama's gemma4-large renderer follows Google's 31B template; the E2B/E4B templates (no empty "
           "thought channel) would need RENDERER gemma4-small",),
)
_renderer_family(
    "gemma4-interleaved", "Gemma 4 31B, interleaved-thinking variant (tool results as <|turn>tool turns)",
    renderer="gemma4-large", parser="gemma4", stop=("<turn|>",), thinking=True, reasoning_key="reasoning_content",
    why=("this Jinja writes each tool result as its own <|turn>tool turn where Ollama's renderer folds it into the "
         "model turn as a <|tool_response> block (gemma4.go:103-111), and " + _G4_CONTINUE + _G4_FORCED),
    differs=("continue-assistant", "tool-call-and-result", "tool-round-trip", "parallel-tool-calls",
             "tool-call-nested-arguments", "reasoning-in-tool-loop"),
    markers=(*_G4_MARKERS, "last_user_message", "tool_responses"),
    forbidden=("format_tool_response_block",),
)
_renderer_family(
    "laguna", "Poolside Laguna XS.2 (〈|EOS|〉 prefix, default system prompt, <think> off by default)",
    renderer="laguna", parser="laguna", stop=("〈|EOS|〉",), thinking=True,
    why=("Ollama's renderer prints tool JSON with Go's HTML escaping ('&' as \\u0026, '<' as \\u003c) and ends "
         'a continued assistant message with a line break the Jinja does not write'),
    differs=("continue-assistant", "tools-offered", "tools-offered-no-system", "tool-call-and-result",
             "tool-round-trip", "parallel-tool-calls", "tool-call-nested-arguments", "reasoning-in-tool-loop"),
    markers=("〈|EOS|〉", "render_assistant_messages_raw", "enable_thinking | default(false)",
             "You are a helpful, conversationally-fluent assistant made by Poolside.", "<think>", "<tool_call>",
             "reasoning_content"),
    forbidden=("preserve_thinking",),
)
