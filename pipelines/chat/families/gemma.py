"""Gemma 2 (<start_of_turn>, no system role).
"""

from __future__ import annotations

from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import _LOOP_HEAD, _fill, _has_all, _has_none, golit

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
