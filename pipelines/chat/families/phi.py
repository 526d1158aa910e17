"""Phi-3.5 (<|user|> … <|end|>).
"""

from __future__ import annotations

from pipelines.chat.families.core import ChatFamily, TemplateTokens, register
from pipelines.chat.families.helpers import _LOOP_HEAD, _fill, _has_all, _has_none

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
