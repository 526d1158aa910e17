"""Proof that each family's Ollama TEMPLATE renders what the model's Hugging Face chat template renders.

Every conversation of pipelines.chat.proof.SUITE goes through the real .jinja files of the pinned
llama.cpp tree (jinja2, the way transformers renders them) and through the family's TEMPLATE (Go's
text/template, the way Ollama renders it: pipelines/gorender). The prompts must be byte-identical, but
for the BOS token, which Ollama's engine adds as a token where the Jinja prints it as text.

Where they cannot be identical, the difference is written down here (DOCUMENTED and the tests of the
last section) and asserted, so that a fix or a regression changes a test instead of going unnoticed:
- the Jinja refuses the conversation (DOCUMENTED: Gemma 2 has no system role and no tools, Phi-3.5 has
  no tools, Llama 3.x takes one tool call per message);
- Ollama merges consecutive messages of the same role; the Jinja renders them as separate turns;
- Go templates cannot trim or split strings: Llama 3 and Gemma trim message contents, DeepSeek-R1 cuts
  a '<think>' block out of the assistant history (Ollama passes reasoning in .Thinking instead);
- Ollama's currentDate is always YYYY-MM-DD: Llama 3.2/3.3 write the same date as '%d %b %Y';
- tool schemas and tool-call arguments reach the template as Go maps: keys come sorted, and a
  property's keys in a fixed order (type, items, enum, description — transformers' get_json_schema
  order); the suite writes its tools in that order.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Iterator
from datetime import date, datetime
from pathlib import Path
from typing import Any

import pytest

from pipelines.chat import jinja as chat_template
from pipelines.chat.families import FAMILIES, TemplateTokens, UnsupportedChatTemplate, detect_family
from pipelines.chat.gotemplate import OllamaRequest, analyze, gorender_binary, render, render_batch
from pipelines.chat.proof import SUITE, Conversation, Rendering, render_both
from pipelines.core.settings import Settings
from pipelines.core.toolchains import llama_cpp
from pipelines.publish.ollama import read_gguf_chat

TODAY = date(2026, 11, 26)

LLAMA3 = TemplateTokens("<|begin_of_text|>", "<|eot_id|>")
R1 = TemplateTokens("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>")
# The llama.cpp templates modelmint claims, the family each must be detected as, and the tokenizer's
# special tokens the Jinja prints.
CLAIMED: dict[str, tuple[str, TemplateTokens]] = {
    "Qwen-Qwen2.5-7B-Instruct.jinja": ("chatml", TemplateTokens(None, "<|im_end|>", engine_adds_bos=False)),
    "MiMo-VL.jinja": ("chatml", TemplateTokens(None, "<|im_end|>", engine_adds_bos=False)),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("llama3", LLAMA3),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": ("llama3", LLAMA3),
    "meta-llama-Llama-3.3-70B-Instruct.jinja": ("llama3", LLAMA3),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": ("deepseek-r1", R1),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": ("deepseek-r1", R1),
    "llama-cpp-deepseek-r1.jinja": ("deepseek-r1-llama.cpp", R1),
    "deepseek-ai-DeepSeek-V3.1.jinja": ("deepseek3.1", R1),
    "google-gemma-2-2b-it.jinja": ("gemma", TemplateTokens("<bos>", "<eos>")),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("mistral", TemplateTokens("<s>", "</s>")),
    "microsoft-Phi-3.5-mini-instruct.jinja": ("phi3", TemplateTokens("<s>", "<|endoftext|>")),
    # Plain ChatML as embedded in llama.cpp's Qwen2 vocab GGUF (Qwen2-Instruct's template).
    "ggml-vocab-qwen2.gguf": ("chatml", TemplateTokens(None, "<|im_end|>", engine_adds_bos=False)),
    "Qwen-Qwen3-0.6B.jinja": ("qwen3", TemplateTokens(None, "<|im_end|>", engine_adds_bos=False)),
    "Qwen-QwQ-32B.jinja": ("qwen3", TemplateTokens(None, "<|im_end|>", engine_adds_bos=False)),
    "ibm-granite-granite-4.0.jinja": ("granite4", TemplateTokens(None, "<|end_of_text|>", engine_adds_bos=False)),
    "ibm-granite-granite-4.1.jinja": ("granite4", TemplateTokens(None, "<|end_of_text|>", engine_adds_bos=False)),
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": ("mistral3", TemplateTokens("<s>", "</s>")),
    "unsloth-mistral-Devstral-Small-2507.jinja": ("mistral3", TemplateTokens("<s>", "</s>")),
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": ("ministral3", TemplateTokens("<s>", "</s>")),
    "ibm-granite-granite-3.3-2B-Instruct.jinja": ("granite3.3",
                                                  TemplateTokens(None, "<|end_of_text|>", engine_adds_bos=False)),
    "moonshotai-Kimi-K2.jinja": ("kimi-k2", TemplateTokens(None, "<|im_end|>", engine_adds_bos=False)),
    "Spark2.5.jinja": ("spark2.5", TemplateTokens(None, "<｜end▁of▁sentence｜>", engine_adds_bos=False)),
    "inclusionai-ling-3.0-flash.jinja": ("ling3", TemplateTokens(None, "<|role_end|>", engine_adds_bos=False)),
    "llama-cpp-rwkv-world.jinja": ("rwkv-world", TemplateTokens(None, "\n\n", engine_adds_bos=False)),
    "MiniMax-M1.jinja": ("minimax-m1", TemplateTokens(None, "<end_of_sentence>", engine_adds_bos=False)),
    "meetkai-functionary-medium-v3.1.jinja": ("functionary-v3.1", LLAMA3),
    "poolside-Laguna-XS-2.1.jinja": ("laguna-xs-2.1", TemplateTokens(None, "〈|EOS|〉", engine_adds_bos=False)),
    "poolside-Laguna-S-2.1.jinja": ("laguna-s-2.1", TemplateTokens(None, "〈|EOS|〉", engine_adds_bos=False)),
    "LFM2.5-8B-A1B.jinja": ("lfm2.5-moe", TemplateTokens("<|startoftext|>", "<|im_end|>")),
    "upstage-Solar-Open-100B.jinja": ("solar-open", TemplateTokens(None, "<|end|>", engine_adds_bos=False)),
    "GLM-4.6.jinja": ("glm-4.6", TemplateTokens(None, "<|endoftext|>", engine_adds_bos=False)),
    "GLM-4.7-Flash.jinja": ("glm-4.7", TemplateTokens(None, "<|endoftext|>", engine_adds_bos=False)),
    "StepFun3.5-Flash.jinja": ("step3.5", TemplateTokens("<s>", "<|im_end|>")),
    "LFM2.5-Instruct.jinja": ("lfm2.5", TemplateTokens("<|startoftext|>", "<|im_end|>")),
    "Bielik-11B-v3.0-Instruct.jinja": ("bielik", TemplateTokens("<s>", "<|im_end|>")),
    "HuggingFaceTB-SmolLM3-3B.jinja": ("smollm3", TemplateTokens(None, "<|im_end|>", engine_adds_bos=False)),
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": ("hermes", TemplateTokens("<|begin_of_text|>", "<|im_end|>")),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": ("hermes", TemplateTokens("<|begin_of_text|>", "<|im_end|>")),
    "deepseek-ai-DeepSeek-V3.2.jinja": ("deepseek-v3.2", R1),
    "deepseek-ai-DeepSeek-V4.jinja": ("deepseek-v4", R1),
    "deepseek-ai-DeepSeek-V4-Flash-0731.jinja": ("deepseek-v4", R1),
    "Kimi-K2-Instruct.jinja": ("kimi-k2-instruct", TemplateTokens(None, "<|im_end|>", engine_adds_bos=False)),
    "Kimi-K2-Thinking.jinja": ("kimi-k2-thinking", TemplateTokens(None, "<|im_end|>", engine_adds_bos=False)),
    "MiniMax-M2.jinja": ("minimax-m2", TemplateTokens(None, "[e~[", engine_adds_bos=False)),
    "MiniMax-M3.jinja": ("minimax-m3", TemplateTokens(None, "[e~[", engine_adds_bos=False)),
    "ByteDance-Seed-OSS.jinja": ("seed-oss", TemplateTokens(None, "<seed:eos>", engine_adds_bos=False)),
    "unsloth-Apriel-1.5.jinja": ("apriel-1.5", TemplateTokens("<s>", "</s>")),
    "Apriel-1.6-15b-Thinker-fixed.jinja": ("apriel-1.6", TemplateTokens("<s>", "</s>")),
    "Qwen3-Coder.jinja": ("qwen3-coder", TemplateTokens(None, "<|im_end|>", engine_adds_bos=False)),
    "Qwen3.5-4B.jinja": ("qwen3.5", TemplateTokens(None, "<|im_end|>", engine_adds_bos=False)),
    "LFM2-8B-A1B.jinja": ("lfm2", TemplateTokens("<|startoftext|>", "<|im_end|>")),
    "muse-glimmer.jinja": ("glimmer", TemplateTokens("<|begin_of_text|>", "<|eot|>")),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": ("command-r7b",
                                                            TemplateTokens("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>")),
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": ("command-r-plus",
                                                       TemplateTokens("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>")),
    "openai-gpt-oss-120b.jinja": ("gpt-oss", TemplateTokens(None, "<|return|>", engine_adds_bos=False)),
    "Kimi-K3.jinja": ("kimi-k3", TemplateTokens(None, "<|end_of_msg|>", engine_adds_bos=False)),
    "openbmb-MiniCPM5-1B.jinja": ("minicpm5", TemplateTokens("<s>", "<|im_end|>")),
    "Reka-Edge.jinja": ("reka-edge", TemplateTokens(None, "<sep>", engine_adds_bos=False)),
    "Cohere2MoE.jinja": ("cohere2", TemplateTokens("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>")),
    "GigaChat3-10B-A1.8B.jinja": ("gigachat3", TemplateTokens("<s>", "</s>")),
    "GigaChat3.1-10B-A1.8B.jinja": ("gigachat3.1", TemplateTokens("<s>", "</s>")),
    "Apertus-8B-Instruct.jinja": ("apertus", TemplateTokens("<s>", "</s>")),
    "meetkai-functionary-medium-v3.2.jinja": ("functionary-v3.2", LLAMA3),
    "NVIDIA-Nemotron-Nano-v2.jinja": ("nemotron-nano-v2", TemplateTokens(None, "<SPECIAL_12>", engine_adds_bos=False)),
    "tencent-Hy3.jinja": ("hy3", TemplateTokens("<｜hy_begin_of_sentence:opensource｜>", "<｜hy_eos:opensource｜>")),
}

_GEMMA_SYSTEM = "Gemma 2's template raises 'System role not supported' (see test_gemma_system_prompt)"
_GEMMA_TOOLS = "Gemma 2 has no tool role: its template raises on the tool turns"
_PHI_TOOLS = "Phi-3.5 has no tool calling: its template fails on a tool-call message (content None)"
_QWEN2_TOOLS = "Qwen2's plain ChatML has no tool calling: it fails on a tool-call message (content None)"
_HERMES_NO_TOOLS = "Hermes' tool_use template iterates tools unconditionally and fails without them (see test_hermes_without_tools)"
_COMMAND_R_NO_TOOLS = ("Command R+'s tool_use template iterates tools unconditionally and fails without them (see "
                       "test_command_r_plus_without_tools)")
_KIMI_APPEND = ("Kimi K2 Instruct/Thinking append each call id to a list (tool_response_queue.ids.append), which "
                "transformers' immutable sandbox refuses (see test_kimi_tool_calls_match_a_mutable_sandbox)")
_R1_LLAMACPP_TOOLS = ("llama.cpp's DeepSeek-R1 template pipes a generator (tools | map(...)) to tojson, which "
                      "transformers' json.dumps refuses; llama.cpp's own engine renders it (see "
                      "test_deepseek_r1_llamacpp_tools_match_llamacpps_tojson)")
_TOOL_CALL_CONVERSATIONS = ("tool-call-and-result", "tool-round-trip", "parallel-tool-calls",
                            "tool-call-nested-arguments", "reasoning-in-tool-loop")

# (family or source, conversation) → why the Jinja refuses it. Everything not listed must be byte-identical.
DOCUMENTED: dict[tuple[str, str], str] = {
    **{(f, c): _KIMI_APPEND for f in ("kimi-k2-instruct", "kimi-k2-thinking") for c in _TOOL_CALL_CONVERSATIONS},
    **{("hermes", c): _HERMES_NO_TOOLS for c in ("user", "system-user", "multi-turn", "system-multi-turn",
                                                  "continue-assistant", "special-characters", "reasoning-in-history",
                                                  "think-on", "think-off")},
    **{("deepseek-r1-llama.cpp", c): _R1_LLAMACPP_TOOLS for c in ("tools-offered", "tools-offered-no-system",
                                                                  *_TOOL_CALL_CONVERSATIONS)},
    **{("command-r-plus", c): _COMMAND_R_NO_TOOLS for c in ("user", "system-user", "multi-turn", "system-multi-turn",
                                                             "continue-assistant", "special-characters",
                                                             "reasoning-in-history", "think-on", "think-off")},
    ("llama3", "parallel-tool-calls"): "Llama 3.x raises 'This model only supports single tool-calls at once!'",
    ("gemma", "system-user"): _GEMMA_SYSTEM,
    ("gemma", "system-multi-turn"): _GEMMA_SYSTEM,
    ("gemma", "special-characters"): _GEMMA_SYSTEM,
    ("gemma", "tools-offered"): _GEMMA_SYSTEM,
    ("gemma", "tool-round-trip"): _GEMMA_SYSTEM,
    ("gemma", "tool-call-and-result"): _GEMMA_TOOLS,
    ("gemma", "parallel-tool-calls"): _GEMMA_TOOLS,
    ("gemma", "tool-call-nested-arguments"): _GEMMA_TOOLS,
    ("gemma", "reasoning-in-tool-loop"): _GEMMA_TOOLS,
    ("phi3", "tool-call-and-result"): _PHI_TOOLS,
    ("phi3", "tool-round-trip"): _PHI_TOOLS,
    ("phi3", "parallel-tool-calls"): _PHI_TOOLS,
    ("phi3", "tool-call-nested-arguments"): _PHI_TOOLS,
    ("phi3", "reasoning-in-tool-loop"): _PHI_TOOLS,
    ("ggml-vocab-qwen2.gguf", "tool-call-and-result"): _QWEN2_TOOLS,
    ("ggml-vocab-qwen2.gguf", "tool-round-trip"): _QWEN2_TOOLS,
    ("ggml-vocab-qwen2.gguf", "parallel-tool-calls"): _QWEN2_TOOLS,
    ("ggml-vocab-qwen2.gguf", "tool-call-nested-arguments"): _QWEN2_TOOLS,
    ("ggml-vocab-qwen2.gguf", "reasoning-in-tool-loop"): _QWEN2_TOOLS,
}


@pytest.fixture(scope="session")
def settings() -> Settings:
    s = Settings.from_env()
    gorender_binary(s)  # builds it once (needs Go: bash toolchains/setup-go.sh)
    return s


@pytest.fixture(scope="session")
def templates_dir(settings: Settings) -> Path:
    return llama_cpp(settings).source / "models" / "templates"


@functools.cache
def _jinja(templates_dir: Path, name: str) -> str:
    """A template file of the llama.cpp tree, or the chat template embedded in one of its vocab GGUFs."""
    if name.endswith(".gguf"):
        template = read_gguf_chat(templates_dir.parent / name).chat_template
        assert template
        return template
    return (templates_dir / name).read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def proofs(settings: Settings, templates_dir: Path) -> dict[str, dict[str, Rendering]]:
    """Every claimed template rendered over the whole suite, once per session (one Go run per file)."""
    out = {}
    for name, (family_name, tokens) in CLAIMED.items():
        jinja = _jinja(templates_dir, name)
        family = FAMILIES[family_name]
        results = render_both(jinja, family.template(jinja, tokens), family, tokens, settings, now=TODAY)
        out[name] = {r.conversation: r for r in results}
    return out


@pytest.mark.parametrize("name", sorted(CLAIMED))
def test_claimed_templates_are_detected_as_their_family(templates_dir: Path, name: str) -> None:
    assert detect_family(_jinja(templates_dir, name)).name == CLAIMED[name][0]


def test_every_llama_cpp_template_is_claimed_or_refused(templates_dir: Path) -> None:
    claimed = set()
    for path in sorted(templates_dir.glob("*.jinja")):
        try:
            detect_family(path.read_text(encoding="utf-8"))
        except UnsupportedChatTemplate:
            continue
        claimed.add(path.name)
    # A detector that starts accepting another file must come with that file's proof (add it to CLAIMED), or
    # be a family Ollama renders with a built-in RENDERER (tests/test_ollama_coverage.py).
    proven = {n for n in claimed if FAMILIES[detect_family((templates_dir / n).read_text(encoding="utf-8")).name].build}
    assert proven == {n for n in CLAIMED if n.endswith(".jinja")}


def test_every_family_is_proven_on_a_real_template() -> None:
    assert {family for family, _ in CLAIMED.values()} == {f.name for f in FAMILIES.values() if f.build}


@pytest.mark.parametrize("conversation", [c.name for c in SUITE])
@pytest.mark.parametrize("name", sorted(CLAIMED))
def test_template_renders_byte_identical_prompts(proofs: dict[str, dict[str, Rendering]], name: str,
                                                 conversation: str) -> None:
    r = proofs[name][conversation]
    assert r.ollama_error is None, r.ollama_error
    documented = DOCUMENTED.get((name, conversation)) or DOCUMENTED.get((CLAIMED[name][0], conversation))
    if documented:
        assert r.hf is None, f"documented as refused by the Jinja ({documented}) but it rendered: update DOCUMENTED"
        return
    assert r.hf_error is None, r.hf_error
    assert r.ollama == r.hf


@pytest.mark.parametrize("name", ["Kimi-K2-Instruct.jinja", "Kimi-K2-Thinking.jinja"])
def test_kimi_tool_calls_match_a_mutable_sandbox(settings: Settings, templates_dir: Path, name: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Jinja's SandboxedEnvironment allows list.append (as llama.cpp's renderer does); with it the Jinja renders the
    # tool-call conversations transformers refuses, and the TEMPLATE must match those too: tool-call ids numbered
    # across the conversation (functions.NAME:N) and tool results answered from the queue of those ids.
    from jinja2.sandbox import SandboxedEnvironment

    mutable = SandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                   extensions=[type(e) for e in chat_template.environment().extensions.values()])
    monkeypatch.setattr(chat_template, "environment", lambda: mutable)
    chat_template._compile.cache_clear()
    try:
        family_name, tokens = CLAIMED[name]
        family, jinja = FAMILIES[family_name], _jinja(templates_dir, name)
        results = render_both(jinja, family.template(jinja, tokens), family, tokens, settings, now=TODAY)
    finally:
        chat_template._compile.cache_clear()
    by_name = {r.conversation: r for r in results}
    assert all(r.equal for r in results), [r.conversation for r in results if not r.equal]
    parallel = by_name["parallel-tool-calls"].ollama or ""
    assert "<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>" in parallel
    assert "## Return of functions.get_weather:1\n" in parallel


@contextlib.contextmanager
def llamacpp_tojson() -> Iterator[None]:
    """Jinja's tojson as llama.cpp's engine has it: it takes a sequence such as `tools | map(attribute=...)`, which
    transformers' json.dumps refuses (a generator)."""
    strict = chat_template._tojson

    def as_llamacpp(value: Any, *args: Any, **kwargs: Any) -> str:
        return strict(list(value) if isinstance(value, types.GeneratorType) else value, *args, **kwargs)

    chat_template._tojson = as_llamacpp
    chat_template._compile.cache_clear()
    try:
        yield
    finally:
        chat_template._tojson = strict
        chat_template._compile.cache_clear()


def test_deepseek_r1_llamacpp_tools_match_llamacpps_tojson(settings: Settings, templates_dir: Path) -> None:
    # With llama.cpp's tojson the tool conversations render, and the TEMPLATE must match those too, tools printed as
    # json.dumps(indent=2) does.
    family_name, tokens = CLAIMED["llama-cpp-deepseek-r1.jinja"]
    family, jinja = FAMILIES[family_name], _jinja(templates_dir, "llama-cpp-deepseek-r1.jinja")
    with llamacpp_tojson():
        results = render_both(jinja, family.template(jinja, tokens), family, tokens, settings, now=TODAY)
    assert all(r.equal for r in results), [r.conversation for r in results if not r.equal]
    offered = {r.conversation: r for r in results}["tools-offered"].ollama or ""
    assert 'requests: [\n  {\n    "name": "get_weather",\n    "description": ' in offered
    assert '"required": [\n        "city"\n      ]\n    }\n  },\n  {\n    "name": "search"' in offered


# What Ollama reads out of each TEMPLATE: tool calling offered ("tools" used), the text its tool-call parser
# waits for ("{" = bare JSON), and the thinking tags of its thinking parser.
OLLAMA_READING = {
    "Qwen-Qwen2.5-7B-Instruct.jinja": (True, "<tool_call>", ()),
    "ggml-vocab-qwen2.gguf": (False, "{", ()),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": (True, "{", ()),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": (False, "{", ("<think>", "</think>")),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": (False, "{", ("<think>", "</think>")),
    "llama-cpp-deepseek-r1.jinja": (True, "{", ("<think>", "</think>")),
    "deepseek-ai-DeepSeek-V3.1.jinja": (False, "<｜Assistant｜><think></think>", ("<think>", "</think>")),
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": (True, "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", ()),
    "openbmb-MiniCPM5-1B.jinja": (True, "{", ("<think>", "</think>")),
    "Reka-Edge.jinja": (True, "<tool_call>", ("<think>", "</think>")),
    "Kimi-K3.jinja": (True, "<|close|>response<|sep|>", ("<|open|>think<|sep|>", "<|close|>think<|sep|>")),
    "Apriel-1.6-15b-Thinker-fixed.jinja": (True, "<tool_calls>[", ("Here are my reasoning steps:",
                                                                  "[BEGIN FINAL RESPONSE]")),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": (True, "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|>",
                                                            ("<|START_THINKING|>", "<|END_THINKING|>")),
    "Cohere2MoE.jinja": (True, "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", ("<|START_THINKING|>", "<|END_THINKING|>")),
    "GigaChat3-10B-A1.8B.jinja": (True, "{", ()),
    "GigaChat3.1-10B-A1.8B.jinja": (True, "<|function_call|>", ()),
    "Apertus-8B-Instruct.jinja": (True, "<|tools_prefix|>", ()),
    "meetkai-functionary-medium-v3.2.jinja": (True, "{", ()),
    "NVIDIA-Nemotron-Nano-v2.jinja": (True, "<TOOLCALL>[", ()),
    "google-gemma-2-2b-it.jinja": (False, "{", ()),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": (True, "[TOOL_CALLS][", ()),
    "microsoft-Phi-3.5-mini-instruct.jinja": (False, "{", ()),
    "Qwen-Qwen3-0.6B.jinja": (True, "<tool_call>", ("<think>", "</think>")),
    "Qwen-QwQ-32B.jinja": (True, "<tool_call>", ("<think>", "</think>")),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": (True, "<tool_call>", ()),
    "HuggingFaceTB-SmolLM3-3B.jinja": (False, "{", ("<think>", "</think>")),
    "ibm-granite-granite-4.0.jinja": (True, "<tool_call>", ()),
    "Bielik-11B-v3.0-Instruct.jinja": (True, "<tool_call>", ("<think>", "</think>")),
    "LFM2.5-Instruct.jinja": (True, "{", ("<think>", "</think>")),
    "moonshotai-Kimi-K2.jinja": (True, "<|tool_calls_section_begin|>", ()),
    "Spark2.5.jinja": (True, "<tool_call>", ("<think>", "</think>")),
    "inclusionai-ling-3.0-flash.jinja": (True, "{", ("<think>", "</think>")),
    "GLM-4.6.jinja": (True, "<tool_call>", ("<think>", "</think>")),
    "GLM-4.7-Flash.jinja": (True, "<tool_call>", ("<think>", "</think>")),
    "llama-cpp-rwkv-world.jinja": (False, "{", ("<think>", "</think>")),
    "MiniMax-M1.jinja": (True, "<tool_calls>", ()),
    "poolside-Laguna-XS-2.1.jinja": (True, "<tool_call>", ("<think>", "</think>")),
    "poolside-Laguna-S-2.1.jinja": (True, "<tool_call>", ("<think>", "</think>")),
    "LFM2.5-8B-A1B.jinja": (True, "<|tool_call_start|>[", ("<think>", "</think>")),
    "upstage-Solar-Open-100B.jinja": (True, "<|tool_calls|>", ("<|think|>", "<|end|>")),
    "meetkai-functionary-medium-v3.1.jinja": (True, "<function=", ()),
    "StepFun3.5-Flash.jinja": (True, "<tool_call>\n<function=", ("<think>", "</think>")),
    "ibm-granite-granite-3.3-2B-Instruct.jinja": (True, "<|tool_call|>[", ()),
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": (True, "[TOOL_CALLS]", ()),
    "unsloth-mistral-Devstral-Small-2507.jinja": (True, "[TOOL_CALLS]", ()),
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": (True, "[TOOL_CALLS]", ()),
}


@pytest.mark.parametrize("name", sorted(OLLAMA_READING))
def test_ollama_reads_tool_and_thinking_tags(settings: Settings, templates_dir: Path, name: str) -> None:
    family_name, tokens = CLAIMED[name]
    reading = analyze(FAMILIES[family_name].template(_jinja(templates_dir, name), tokens), settings)
    assert ("tools" in reading.vars, reading.tool_tag, reading.thinking_tags) == OLLAMA_READING[name]


def test_suite_covers_what_the_issue_asks_for() -> None:
    names = {c.name for c in SUITE}
    assert {"user", "system-user", "multi-turn", "tool-call-and-result", "tool-round-trip",
            "continue-assistant"} <= names
    assert any(c.tools for c in SUITE) and any(c.think for c in SUITE)


def test_unknown_template_is_a_clear_error(templates_dir: Path) -> None:
    with pytest.raises(UnsupportedChatTemplate) as err:
        detect_family((templates_dir / "fireworks-ai-llama-3-firefunction-v2.jinja").read_text(encoding="utf-8"))
    assert "TEMPLATE by hand" in str(err.value) and "--template" in str(err.value)
    assert "nearest family" in str(err.value)
    # the families modelmint publishes: those whose RENDERER renders their template differently are left out
    assert set(err.value.families) == {n for n, f in FAMILIES.items() if not f.renderer_differs}


def test_a_broken_template_is_caught(settings: Settings, templates_dir: Path) -> None:
    # The proof must be able to fail: drop one newline from the ChatML TEMPLATE.
    jinja = (templates_dir / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text(encoding="utf-8")
    family = FAMILIES["chatml"]
    tokens = CLAIMED["Qwen-Qwen2.5-7B-Instruct.jinja"][1]
    broken = family.template(jinja, tokens).replace('<|im_start|>assistant{{ "\\n" }}{{ end }}',
                                                    "<|im_start|>assistant{{ end }}")
    results = render_both(jinja, broken, family, tokens, settings, now=TODAY)
    assert not any(r.equal for r in results if r.conversation == "user")


# ---------------------------------------------------------------- documented differences, asserted


def _both(settings: Settings, templates_dir: Path, name: str, conv: Conversation) -> Rendering:
    family_name, tokens = CLAIMED[name]
    jinja = _jinja(templates_dir, name)
    family = FAMILIES[family_name]
    (r,) = render_both(jinja, family.template(jinja, tokens), family, tokens, settings, conversations=(conv,),
                       now=TODAY)
    return r


def test_ollama_merges_consecutive_messages_of_one_role(settings: Settings, templates_dir: Path) -> None:
    two = Conversation("two-user-messages", ({"role": "user", "content": "First."}, {"role": "user", "content": "Second."}))
    merged = Conversation("merged", ({"role": "user", "content": "First.\n\nSecond."},))
    r = _both(settings, templates_dir, "Qwen-Qwen2.5-7B-Instruct.jinja", two)
    assert r.hf is not None and r.hf.count("<|im_start|>user") == 2
    assert r.ollama == _both(settings, templates_dir, "Qwen-Qwen2.5-7B-Instruct.jinja", merged).hf


@pytest.mark.parametrize("name", ["meta-llama-Llama-3.1-8B-Instruct.jinja", "google-gemma-2-2b-it.jinja",
                                  "llama-cpp-rwkv-world.jinja", "MiniMax-M1.jinja"])
def test_jinja_trims_contents_go_cannot(settings: Settings, templates_dir: Path, name: str) -> None:
    padded = Conversation("padded", ({"role": "user", "content": "  spaced out \n"},))
    tight = Conversation("tight", ({"role": "user", "content": "spaced out"},))
    r = _both(settings, templates_dir, name, padded)
    assert r.hf != r.ollama and "  spaced out \n" in (r.ollama or "")
    assert r.hf == _both(settings, templates_dir, name, tight).ollama


def test_llama32_date_is_iso_in_ollama(settings: Settings, templates_dir: Path) -> None:
    name = "meta-llama-Llama-3.2-3B-Instruct.jinja"
    jinja = (templates_dir / name).read_text(encoding="utf-8")
    text = chat_template.render(jinja, [{"role": "user", "content": "hi"}], bos_token="<|begin_of_text|>",
                                now=datetime(2026, 11, 26, 12))
    assert "Today Date: 26 Nov 2026\n" in text
    r = _both(settings, templates_dir, name, Conversation("hi", ({"role": "user", "content": "hi"},)))
    assert "Today Date: 2026-11-26\n" in (r.ollama or "")
    assert r.equal  # render_hf writes the Jinja's date line in ISO form before comparing: the one normalisation


def test_deepseek_reasoning_must_come_as_thinking(settings: Settings, templates_dir: Path) -> None:
    # Ollama's thinking parser moves '<think>…</think>' out of the content; a client that leaves it in the
    # content gets it rendered, where the Jinja would have cut it.
    inline = Conversation("inline", (
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd\n</think>4"},
        {"role": "user", "content": "3+3?"},
    ))
    r = _both(settings, templates_dir, "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", inline)
    assert r.hf is not None and "<think>\nadd" not in r.hf
    assert "<think>\nadd" in (r.ollama or "")


def test_gemma_system_prompt(settings: Settings, templates_dir: Path) -> None:
    name = "google-gemma-2-2b-it.jinja"
    conv = Conversation("sys", ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}))
    r = _both(settings, templates_dir, name, conv)
    assert r.hf is None and "System role not supported" in (r.hf_error or "")
    assert r.ollama == "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"


def test_tool_schema_keys_reach_ollama_sorted(settings: Settings, templates_dir: Path) -> None:
    tool = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {
        "type": "object", "properties": {"zeta": {"description": "z", "type": "string"}, "alpha": {"type": "integer"}},
    }}}
    conv = Conversation("unsorted", ({"role": "user", "content": "x"},), tools=(tool,))
    r = _both(settings, templates_dir, "Qwen-Qwen2.5-7B-Instruct.jinja", conv)
    assert r.hf is not None and '"zeta": {"description": "z", "type": "string"}, "alpha"' in r.hf
    assert '"alpha": {"type": "integer"}, "zeta": {"type": "string", "description": "z"}' in (r.ollama or "")


# ---------------------------------------------------------------- the renderer is Ollama's template semantics


def _go(settings: Settings, template: str, messages: list[dict], **kw: object) -> str:
    return render(OllamaRequest(template, tuple(messages), now="2026-03-01", **kw), settings)  # type: ignore[arg-type]


CHAT = [
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "q1"},
    {"role": "assistant", "content": "a1"},
    {"role": "user", "content": "q2"},
]


def test_legacy_template_renders_per_turn_and_cuts_at_response(settings: Settings) -> None:
    legacy = "{{ if .System }}<<SYS>>{{ .System }}<</SYS>>{{ end }}[INST] {{ .Prompt }} [/INST] {{ .Response }}</s>"
    assert _go(settings, legacy, CHAT) == "<<SYS>>sys<</SYS>>[INST] q1 [/INST] a1</s>[INST] q2 [/INST] "


def test_response_is_appended_to_templates_without_messages_or_response(settings: Settings) -> None:
    assert _go(settings, "{{ .System }}|{{ .Prompt }}|", CHAT[:3]) == "sys|q1|a1"
    assert _go(settings, "<{{ .Prompt }}>", [{"role": "user", "content": "hi"}]) == "<hi>"


def test_system_messages_collated_and_same_role_merged(settings: Settings) -> None:
    messages = [
        {"role": "SYSTEM", "content": "s1"}, {"role": "system", "content": "s2"},
        {"role": "User", "content": "a"}, {"role": "user", "content": "b"},
        {"role": "tool", "content": "t1"}, {"role": "tool", "content": "t2"},
    ]
    out = _go(settings, "{{ .System }}|{{ range .Messages }}{{ .Role }}={{ .Content }};{{ end }}", messages)
    assert out == "s1\n\ns2|system=s1\n\ns2;user=a\n\nb;tool=t1;tool=t2;"


def test_template_functions_and_data_types(settings: Settings) -> None:
    from pipelines.chat.proof import PARIS, TOOLS

    calls = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": PARIS["id"], "function": {"index": 0, "name": "get_weather", "arguments": PARIS["function"]["arguments"]}}
    ]}]
    t = ("{{ currentDate }} {{ yesterdayDate }}|{{ range .Messages }}{{ range .ToolCalls }}{{ .Function.Arguments }}"
         "{{ end }}{{ end }}|{{ range .Tools }}{{ range $k, $v := .Function.Parameters.Properties }}"
         "{{ $k }}:{{ toTypeScriptType $v }};{{ end }}{{ end }}|{{ json (index .Tools 1).Function.Description }}"
         "|{{ .Nothing }}")
    out = _go(settings, t, calls, tools=TOOLS)
    assert out == (
        '2026-03-01 2026-02-28|{"city":"Paris","unit":"celsius"}|city:string;unit:string;max_results:number;'
        'query:string;tags:any[];|"Search the web \\u0026 return at most 5 results (use \\"quotes\\" for phrases, '
        '\\u003c= 100 chars)"|<no value>'
    )


@pytest.mark.parametrize(("think", "expected"), [(None, "false||false"), (True, "true|medium|true"),
                                                 (False, "false||true"), ("high", "true|high|true")])
def test_think_values(settings: Settings, think: object, expected: str) -> None:
    t = "{{ .Think }}|{{ .ThinkLevel }}|{{ .IsThinkSet }}{{ range .Messages }}{{ end }}"
    assert _go(settings, t, [{"role": "user", "content": "x"}], think=think) == expected


def test_renderer_reports_template_errors(settings: Settings) -> None:
    (bad,) = render_batch([OllamaRequest("{{ .Messages ")], settings)
    assert not isinstance(bad, str) and "TEMPLATE" in bad.message


QWEN3 = "Qwen-Qwen3-0.6B.jinja"


def test_qwen3_thinking_keeps_surrounding_newlines(settings: Settings, templates_dir: Path) -> None:
    # After the last query the Jinja keeps the reasoning, stripped of line breaks; Ollama prints .Thinking as is.
    conv = Conversation("padded-reasoning", (
        {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", "reasoning": "\nadd\n"},
        {"role": "tool", "content": "checked"},
    ))
    r = _both(settings, templates_dir, QWEN3, conv)
    assert r.hf is not None and "<think>\nadd\n</think>\n\n4<|im_end|>" in r.hf
    assert "<think>\n\nadd\n\n</think>\n\n4<|im_end|>" in (r.ollama or "")


def test_qwen3_wrapped_tool_response_counts_as_a_query_in_ollama(settings: Settings, templates_dir: Path) -> None:
    # The Jinja skips a user message that is wholly '<tool_response>…</tool_response>' when it looks for the last
    # query, so the reasoning of the assistant turn before it survives; the TEMPLATE counts every user message.
    conv = Conversation("wrapped", (
        {"role": "user", "content": "Go."}, {"role": "assistant", "content": "Calling.", "reasoning": "use it"},
        {"role": "user", "content": "<tool_response>\nok\n</tool_response>"},
    ))
    r = _both(settings, templates_dir, QWEN3, conv)
    assert r.hf is not None and "<think>\nuse it\n</think>" in r.hf
    assert "use it" not in (r.ollama or "")


@pytest.mark.parametrize(("think", "tail"), [(None, "assistant\n"), (True, "assistant\n"),
                                             (False, "assistant\n<think>\n\n</think>\n\n")])
def test_qwen3_thinking_switch(settings: Settings, templates_dir: Path, think: bool | None, tail: str) -> None:
    r = _both(settings, templates_dir, QWEN3, Conversation("q", ({"role": "user", "content": "hi"},), think=think))
    assert r.equal and (r.ollama or "").endswith(tail)


def test_qwen3_tool_call_content_none_needs_empty_string(templates_dir: Path) -> None:
    jinja = (templates_dir / QWEN3).read_text(encoding="utf-8")
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {}}}]}]
    with pytest.raises(TypeError, match="NoneType"):
        chat_template.render(jinja, messages)
    assert FAMILIES["qwen3"].content_none_ok is False


HERMES = "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"


def test_gpt_oss_template_is_one_ollama_parses_with_harmony(settings: Settings, templates_dir: Path) -> None:
    # Ollama sets PARSER harmony for a gpt-oss model whose TEMPLATE holds <|start|> and <|end|>
    # (server/routes.go:77-87 shouldUseHarmony at the pinned commit); a think level reaches "Reasoning:" as it is.
    name = "openai-gpt-oss-120b.jinja"
    family_name, tokens = CLAIMED[name]
    template = FAMILIES[family_name].template(_jinja(templates_dir, name), tokens)
    assert "<|start|>" in template and "<|end|>" in template
    hi = render(OllamaRequest(template, ({"role": "user", "content": "hi"},), think="high", now="2026-03-01"), settings)
    assert "Current date: 2026-03-01\n\nReasoning: high\n\n" in hi and hi.endswith("<|end|><|start|>assistant")


@pytest.mark.parametrize("conversation", ["user", "system-multi-turn", "continue-assistant", "special-characters"])
def test_command_r_plus_without_tools(settings: Settings, templates_dir: Path, conversation: str) -> None:
    # The Jinja fails on tools=None; given an empty tool list it renders, and the TEMPLATE without tools equals that.
    from pipelines.chat.proof import hf_messages, ollama_messages

    name = "CohereForAI-c4ai-command-r-plus-tool_use.jinja"
    conv = next(c for c in SUITE if c.name == conversation)
    family, tokens = FAMILIES["command-r-plus"], CLAIMED[name][1]
    jinja = _jinja(templates_dir, name)
    expected = chat_template.render(jinja, hf_messages(conv, family, jinja), tools=[], bos_token=tokens.bos,
                                    add_generation_prompt=not conv.continues_assistant,
                                    continue_final_message=conv.continues_assistant)
    assert "## Available Tools" in expected
    go = render(OllamaRequest(family.template(jinja, tokens), tuple(ollama_messages(conv))), settings)
    assert tokens.bos + go == expected


@pytest.mark.parametrize("conversation", ["multi-turn", "system-multi-turn", "continue-assistant"])
def test_hermes_without_tools(settings: Settings, templates_dir: Path, conversation: str) -> None:
    # The Jinja fails on tools=None; given an empty tool list it renders, and the TEMPLATE without tools equals that.
    from pipelines.chat.proof import hf_messages, ollama_messages

    conv = next(c for c in SUITE if c.name == conversation)
    family, tokens = FAMILIES["hermes"], CLAIMED[HERMES][1]
    jinja = _jinja(templates_dir, HERMES)
    expected = chat_template.render(jinja, hf_messages(conv, family, jinja), tools=[], bos_token=tokens.bos,
                                    add_generation_prompt=not conv.continues_assistant,
                                    continue_final_message=conv.continues_assistant)
    assert "<tools>  </tools>" in expected
    go = render(OllamaRequest(family.template(jinja, tokens), tuple(ollama_messages(conv))), settings)
    assert tokens.bos + go == expected


def test_hermes_trims_parameter_descriptions_go_cannot(settings: Settings, templates_dir: Path) -> None:
    tool = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "description": " padded "}}}}}
    r = _both(settings, templates_dir, HERMES, Conversation("pad", ({"role": "user", "content": "x"},), tools=(tool,)))
    assert r.hf is not None and "x(str): padded\"" in r.hf
    assert "x(str):  padded \"" in (r.ollama or "")


def test_smollm3_system_switch_words_are_not_followed(settings: Settings, templates_dir: Path) -> None:
    conv = Conversation("sys-no-think", ({"role": "system", "content": "Be brief. /no_think"},
                                        {"role": "user", "content": "hi"}))
    r = _both(settings, templates_dir, "HuggingFaceTB-SmolLM3-3B.jinja", conv)
    assert r.hf is not None and "Reasoning Mode: /no_think" in r.hf and "Be brief.\n\n" in r.hf
    assert "Reasoning Mode: /think" in (r.ollama or "") and "Be brief. /no_think\n\n" in (r.ollama or "")
    # Ollama's own switch gives the /no_think rendering.
    off = _both(settings, templates_dir, "HuggingFaceTB-SmolLM3-3B.jinja",
                Conversation("off", ({"role": "user", "content": "hi"},), think=False))
    assert off.equal and "Reasoning Mode: /no_think" in (off.ollama or "")


def test_granite41_has_no_default_system_turn(settings: Settings, templates_dir: Path) -> None:
    conv = Conversation("hi", ({"role": "user", "content": "hi"},))
    r40 = _both(settings, templates_dir, "ibm-granite-granite-4.0.jinja", conv)
    r41 = _both(settings, templates_dir, "ibm-granite-granite-4.1.jinja", conv)
    assert r40.equal and r41.equal
    assert (r40.ollama or "").startswith("<|start_of_role|>system<|end_of_role|>You are a helpful assistant.")
    assert r41.ollama == "<|start_of_role|>user<|end_of_role|>hi<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>"


def test_mistral_small_default_system_prompt_has_todays_date(settings: Settings, templates_dir: Path) -> None:
    r = _both(settings, templates_dir, "Mistral-Small-3.2-24B-Instruct-2506.jinja",
              Conversation("hi", ({"role": "user", "content": "hi"},)))
    assert r.equal and "The current date is 2026-11-26." in (r.ollama or "")


def test_mistral_small_refuses_non_alternating_turns_the_template_renders(settings: Settings,
                                                                          templates_dir: Path) -> None:
    conv = Conversation("a-first", ({"role": "assistant", "content": "Hello."}, {"role": "user", "content": "hi"}))
    r = _both(settings, templates_dir, "Mistral-Small-3.2-24B-Instruct-2506.jinja", conv)
    assert r.hf is None and "alternate" in (r.hf_error or "")
    assert (r.ollama or "").endswith("Hello.</s>[INST]hi[/INST]")


def test_granite33_date_is_iso_in_ollama(settings: Settings, templates_dir: Path) -> None:
    name = "ibm-granite-granite-3.3-2B-Instruct.jinja"
    text = chat_template.render(_jinja(templates_dir, name), [{"role": "user", "content": "hi"}],
                                now=datetime(2026, 11, 26, 12))
    assert "Today's Date: November 26, 2026." in text
    r = _both(settings, templates_dir, name, Conversation("hi", ({"role": "user", "content": "hi"},)))
    assert r.equal and "Today's Date: 2026-11-26." in (r.ollama or "")


def test_step35_prints_arguments_as_python_str(settings: Settings, templates_dir: Path) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"flag": True, "n": 1000000,
                                                                                   "none": None}}}
    conv = Conversation("py", ({"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                               {"role": "tool", "content": "ok"}), tools=None)
    r = _both(settings, templates_dir, "StepFun3.5-Flash.jinja", conv)
    assert r.equal and "<parameter=flag>\nTrue\n" in (r.ollama or "") and "\n1000000\n" in (r.ollama or "")


def test_lfm25_moe_prints_pythonic_arguments(settings: Settings, templates_dir: Path) -> None:
    r = _both(settings, templates_dir, "LFM2.5-8B-A1B.jinja", next(c for c in SUITE if c.name == "tool-call-nested-arguments"))
    assert r.equal and "search(max_results=3, query='llama.cpp \"GGUF\"', tags=['ml', 'quantization'])" in (r.ollama or "")


def test_glm46_nothink_is_added_even_when_present(settings: Settings, templates_dir: Path) -> None:
    conv = Conversation("nt", ({"role": "user", "content": "hi /nothink"},), think=False)
    r = _both(settings, templates_dir, "GLM-4.6.jinja", conv)
    assert r.hf is not None and "hi /nothink<|assistant|>" in r.hf
    assert "hi /nothink/nothink<|assistant|>" in (r.ollama or "")


def test_ling_thinking_line_follows_ollama_not_the_system_prompt(settings: Settings, templates_dir: Path) -> None:
    conv = Conversation("sys", ({"role": "system", "content": "detailed thinking off"}, {"role": "user", "content": "hi"}))
    r = _both(settings, templates_dir, "inclusionai-ling-3.0-flash.jinja", conv)
    assert r.hf is not None and r.hf.startswith("<role>SYSTEM</role>detailed thinking off<|role_end|>")
    assert (r.ollama or "").startswith("<role>SYSTEM</role>detailed thinking off\ndetailed thinking on<|role_end|>")
