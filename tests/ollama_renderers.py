"""Ollama's built-in RENDERERs as the tests' stand-in: Python written from Ollama's Go source, rule by rule.

Pinned in tests/data/ollama_pin.json: ollama/ollama v0.33.0-rc2, commit fb30760996871fa9460115c753afd2c60d4ab0f7
(read with `git show <commit>:<file>`; no Go code is copied). Each rule cites file:line at that commit. A renderer
takes what Ollama's /api/chat hands it (server/prompt.go:135-143 renderPrompt: the messages, the tools and the think
value, nothing else) and its output is the prompt as is (the runner drops a BOS it would add twice:
llm/llama_server.go:280 completionPrompt with the renderer's LeadingBOS).

Messages are the /api/chat JSON shape (pipelines.chat.proof.ollama_messages): role, content, thinking, tool_calls
[{function: {name, arguments}}], tool_name. Tools are the request's JSON tools.

Go's encoding/json, as the renderers reach it (`go_json`): compact, `<` `>` `&` U+2028 U+2029 escaped as \\u003c …
(encoding/json's HTML escaping, also applied to a Marshaler's output), non-ASCII kept, numbers decoded from the
request as float64 and printed without a fraction when integral. api/types.go:473-479 ToolFunctionParameters
marshals its fields in the order type, $defs, items, required, properties; :418-426 ToolProperty in the order anyOf,
type, items, description, enum, properties, required; :333-339 a one-element type prints as a string; the property
and argument maps are ordered maps (:298-303, :406-411) and keep the request's order.
"""

from __future__ import annotations

import json
from typing import Any

PIN = "ollama/ollama v0.33.0-rc2 (fb30760)"

_HTML = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def _numbers(value: Any) -> Any:
    """JSON numbers as Go holds them after decoding into `any` (float64): integral ones print without '.0'."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    return value


def go_json(value: Any) -> str:
    """encoding/json.Marshal of a decoded JSON value (compact, HTML-escaped, map order as given)."""
    text = json.dumps(_numbers(value), ensure_ascii=False, separators=(",", ":"))
    for raw, escaped in _HTML.items():
        text = text.replace(raw, escaped)
    return text


def _prop(p: dict[str, Any]) -> dict[str, Any]:
    """api.ToolProperty's fields in struct order (api/types.go:418-426), empty ones omitted (omitempty)."""
    out: dict[str, Any] = {}
    if p.get("anyOf"):
        out["anyOf"] = [_prop(a) for a in p["anyOf"]]
    kind = p.get("type")
    if kind:
        out["type"] = kind[0] if isinstance(kind, list) and len(kind) == 1 else kind  # types.go:333-339
    for key in ("items", "description", "enum"):
        if p.get(key):
            out[key] = p[key]
    if p.get("properties"):
        out["properties"] = {k: _prop(v) for k, v in p["properties"].items()}
    if p.get("required"):
        out["required"] = p["required"]
    return out


def go_parameters(params: dict[str, Any]) -> dict[str, Any]:
    """api.ToolFunctionParameters' fields in struct order (api/types.go:473-479)."""
    out: dict[str, Any] = {"type": params.get("type", "")}
    for key in ("$defs", "items", "required"):
        if params.get(key):
            out[key] = params[key]
    props = params.get("properties")
    out["properties"] = None if props is None else {k: _prop(v) for k, v in props.items()}
    return out


def _go_v(value: Any) -> str:
    """fmt.Sprintf("%v", value) for a decoded JSON scalar (bool, float64 as %g with shortest precision)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        f = float(value)
        if f.is_integer() and abs(f) < 1e6:  # strconv 'g', shortest: %e from exponent 6 on (strconv/ftoa.go)
            return str(int(f))
        if 1e-4 <= abs(f) < 1e6:
            return repr(f)
        raise NotImplementedError(f"%v of {value!r}: exponent form not reproduced here")
    return str(value)


# ---------------------------------------------------------------- deepseek3.1 (model/renderers/deepseek3.go)

DS_BOS, DS_EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"


def render_deepseek31(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, think: bool | None) -> str:
    """RENDERER deepseek3.1: renderer.go:78-80 DeepSeek3Renderer{IsThinking: true, Variant: Deepseek31}."""
    out: list[str] = []
    thinking = think is True  # deepseek3.go:28-29: IsThinking and a think value that is true
    # deepseek3.go:31-45: every system message's content, the first as is, the others after "\n\n"
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    out.append(DS_BOS + system)  # :47-48
    if tools:  # :51-70
        out.append("\n\n## Tools\nYou have access to the following tools:\n")
        for tool in tools:
            fn = tool["function"]
            out.append("\n### " + fn["name"])
            out.append("\nDescription: " + fn.get("description", ""))
            out.append("\n\nParameters: " + go_json(go_parameters(fn.get("parameters", {}))) + "\n")  # :61-65
        out.append("\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n")
        out.append("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments"
                   "<｜tool▁call▁end｜>{{additional_tool_calls}}<｜tool▁calls▁end｜>\n\n")
        out.append("Where:\n\n")
        out.append("- `tool_call_name` must be an exact match to one of the available tools\n")
        out.append("- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n")
        out.append("- For multiple tool calls, chain them directly without separators or spaces\n")
    is_tool = is_last_user = False  # :73-75
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)  # :78-85
    for i, m in enumerate(messages):
        content = m.get("content") or ""
        if m["role"] == "user":  # :88-91
            is_tool, is_last_user = False, True
            out.append("<｜User｜>" + content)
        elif m["role"] == "assistant" and m.get("tool_calls"):  # :94-113
            if is_last_user:
                out.append("<｜Assistant｜></think>")
            is_last_user = is_tool = False
            out.append(content)
            out.append("<｜tool▁calls▁begin｜>")
            for call in m["tool_calls"]:
                out.append("<｜tool▁call▁begin｜>" + call["function"]["name"] + "<｜tool▁sep｜>")
                out.append(go_json(call["function"].get("arguments") or {}) + "<｜tool▁call▁end｜>")
            out.append("<｜tool▁calls▁end｜>" + DS_EOS)
        elif m["role"] == "assistant":  # :114-142
            if is_last_user:
                out.append("<｜Assistant｜>")
                # :117-125 <think> only for a turn after the last user message that has thinking, when thinking
                out.append("<think>" if m.get("thinking") and thinking and i > last_user else "</think>")
            is_last_user = False
            if is_tool:  # :130-132
                out.append(content + DS_EOS)
                is_tool = False
            else:  # :133-140 the text after the first </think>
                if "</think>" in content:
                    content = content.split("</think>", 1)[1]
                out.append(content + DS_EOS)
        elif m["role"] == "tool":  # :144-147
            is_last_user, is_tool = False, True
            out.append("<｜tool▁output▁begin｜>" + content + "<｜tool▁output▁end｜>")
    if is_last_user and not is_tool:  # :151-158
        out.append("<｜Assistant｜>" + ("<think>" if thinking else "</think>"))
    return "".join(out)


# ---------------------------------------------------------------- qwen3-coder (model/renderers/qwen3coder.go)

_QC_DEFAULT_SYSTEM = "You are Qwen, a helpful AI assistant that can interact with a computer to solve tasks."
_QC_INSTRUCTIONS = (
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n"
    "<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified "
    "format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in "
    "natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer "
    "the question like normal with your current knowledge and do not tell the user about function calls\n"
    "</IMPORTANT>"
)


def _additional_keys(obj: dict[str, Any], handled: set[str]) -> str:
    """qwen3coder.go:23-58 renderAdditionalKeys: the marshalled object's other keys as <key>value</key>.

    Go ranges over a map here, so with two or more such keys their order is random: refused rather than guessed.
    """
    extra = [(k, v) for k, v in obj.items() if k not in handled and v is not None]
    if len(extra) > 1:
        raise NotImplementedError(f"keys {[k for k, _ in extra]} come in Go's random map order")
    out = []
    for key, value in extra:
        text = go_json(value) if isinstance(value, (dict, list)) else _go_v(value)  # :41-55
        out.append(f"\n<{key}>{text}</{key}>")
    return "".join(out)


def _qc_argument(value: Any) -> str:
    """qwen3coder.go:201-223 formatToolCallArgument."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        return go_json(value)
    return _go_v(value)


def _qc_type(kind: Any) -> str:
    """qwen3coder.go:225-242 formatToolDefinitionType."""
    kinds = kind if isinstance(kind, list) else [kind]
    if not kinds:
        return "[]"
    return kinds[0] if len(kinds) == 1 else go_json(kinds)


def render_qwen3_coder(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                       think: bool | None) -> str:
    """RENDERER qwen3-coder: renderer.go:60-62 Qwen3CoderRenderer (the think value is ignored, qwen3coder.go:64)."""
    del think
    out: list[str] = []
    # qwen3coder.go:67-79: system messages are taken out; the first non-empty one wins
    system = next((m["content"] for m in messages if m["role"] == "system" and m["content"]), "")
    rest = [m for m in messages if m["role"] != "system"]
    if system or tools:  # :80-134
        out.append("<|im_start|>system\n" + (system or _QC_DEFAULT_SYSTEM))
        if tools:
            out.append("\n\n# Tools\n\nYou have access to the following functions:\n\n<tools>")
            for tool in tools:
                fn = tool["function"]
                out.append("\n<function>\n<name>" + fn["name"] + "</name>")
                if fn.get("description"):
                    out.append("\n<description>" + fn["description"] + "</description>")
                out.append("\n<parameters>")
                params = go_parameters(fn.get("parameters", {}))
                for name, prop in (params["properties"] or {}).items():  # :101-123
                    out.append("\n<parameter>\n<name>" + name + "</name>")
                    if prop.get("type"):
                        out.append("\n<type>" + _qc_type(prop["type"]) + "</type>")
                    if prop.get("description"):
                        out.append("\n<description>" + prop["description"] + "</description>")
                    out.append(_additional_keys(prop, {"type", "description"}))
                    out.append("\n</parameter>")
                out.append(_additional_keys(params, {"type", "properties"}))  # :125-130
                out.append("\n</parameters>\n</function>")
            out.append("\n</tools>" + _QC_INSTRUCTIONS)
        out.append("<|im_end|>\n")
    for i, m in enumerate(rest):
        last = i == len(rest) - 1
        prefill = last and m["role"] == "assistant"  # :142-144
        content = m.get("content") or ""
        if m["role"] == "assistant" and m.get("tool_calls"):  # :146-159
            out.append("<|im_start|>assistant\n" + (content + "\n" if content else ""))
            for call in m["tool_calls"]:
                out.append("\n<tool_call>\n<function=" + call["function"]["name"] + ">")
                for name, value in (call["function"].get("arguments") or {}).items():
                    out.append(f"\n<parameter={name}>\n{_qc_argument(value)}\n</parameter>")
                out.append("\n</function>\n</tool_call>")
            out.append("<|im_end|>\n")
        elif m["role"] == "assistant":  # :160-165
            out.append("<|im_start|>assistant\n" + content + ("" if prefill else "<|im_end|>\n"))
        elif m["role"] == "tool":  # :167-182 consecutive tool results share one user turn
            if i == 0 or rest[i - 1]["role"] != "tool":
                out.append("<|im_start|>user")
            out.append("\n<tool_response>\n" + content + "\n</tool_response>")
            if last or rest[i + 1]["role"] != "tool":
                out.append("<|im_end|>\n")
        else:  # :183-187
            out.append("<|im_start|>" + m["role"] + "\n" + content + "<|im_end|>\n")
        if last and not prefill:  # :190-192
            out.append("<|im_start|>assistant\n")
    return "".join(out)


RENDERERS = {"deepseek3.1": render_deepseek31, "qwen3-coder": render_qwen3_coder}
"""The RENDERER names reimplemented here, by Ollama's name (model/renderers/renderer.go rendererForName)."""


def _spaced(compact: str, *, before_space_ok: bool = False) -> str:
    """A space after each ':' and ',' outside JSON strings (glm47.go:138-174 formatGLM47ToolJSON; lfm2.go:74-105
    does the same but not before whitespace, `before_space_ok`: Go's compact JSON never has any there)."""
    del before_space_ok
    out, in_string, escaped = [], False, False
    for ch in compact:
        out.append(ch)
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in ":,":
            out.append(" ")
    return "".join(out)


def go_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """api.Tool's fields in struct order (api/types.go:305-309: type, items, function; :486-490 ToolFunction: name,
    description, parameters)."""
    fn = tool["function"]
    function: dict[str, Any] = {"name": fn["name"]}
    if fn.get("description"):
        function["description"] = fn["description"]
    function["parameters"] = go_parameters(fn.get("parameters", {}))
    out: dict[str, Any] = {"type": tool.get("type", "")}
    if tool.get("items"):
        out["items"] = tool["items"]
    out["function"] = function
    return out


# ---------------------------------------------------------------- glm-4.7 (model/renderers/glm47.go)

def render_glm47(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, think: bool | None) -> str:
    """RENDERER glm-4.7: renderer.go:105-106 GLM47Renderer."""
    out = ["[gMASK]<sop>"]  # glm47.go:48
    if tools:  # :50-64 each tool as json.Marshal(api.Tool) with a space after ':' and ','
        out.append("<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                   "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n")
        for tool in tools:
            out.append(_spaced(go_json(go_tool(tool))) + "\n")
        out.append("</tools>\n\nFor each function call, output the function name and arguments within the following "
                   "XML format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}"
                   "</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>")
    thinking = think is not False  # :66-69 thinking unless the think value is false
    for i, m in enumerate(messages):  # :71-104
        content = m.get("content") or ""
        if m["role"] == "user":
            out.append("<|user|>" + content)
        elif m["role"] == "assistant":  # :76-92 the message's thinking always kept
            out.append("<|assistant|>" + (f"<think>{m['thinking']}</think>" if m.get("thinking") else "</think>"))
            out.append(content)
            for call in m.get("tool_calls") or ():
                out.append("<tool_call>" + call["function"]["name"])
                for key, value in (call["function"].get("arguments") or {}).items():  # :116-136
                    text = value if isinstance(value, str) else go_json(value)
                    out.append(f"<arg_key>{key}</arg_key><arg_value>{text}</arg_value>")
                out.append("</tool_call>")
        elif m["role"] == "tool":  # :93-99 consecutive results share one <|observation|>
            if i == 0 or messages[i - 1]["role"] != "tool":
                out.append("<|observation|>")
            out.append("<tool_response>" + content + "</tool_response>")
        elif m["role"] == "system":
            out.append("<|system|>" + content)
    out.append("<|assistant|>" + ("<think>" if thinking else "</think>"))  # :106-111, also after an assistant
    return "".join(out)


# ---------------------------------------------------------------- lfm2 (model/renderers/lfm2.go)

def _lfm2_json(value: Any) -> str:
    """lfm2.go:58-108 lfm2JSON: encoding/json without HTML escaping, a space after ':' and ','."""
    text = json.dumps(_numbers(value), ensure_ascii=False, separators=(",", ":"))
    return _spaced(text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def render_lfm2(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, think: bool | None,
                *, is_thinking: bool = False) -> str:
    """RENDERER lfm2 (renderer.go:109-110 LFM2Renderer{IsThinking: false}); lfm2-thinking sets is_thinking."""
    out = ["<|startoftext|>"]  # lfm2.go:228
    system, start = "", 0
    if messages and messages[0]["role"] == "system":  # :231-236 only a first system message
        system, start = messages[0]["content"], 1
    if tools:  # :239-254 the functions (api.ToolFunction), not the tools
        schemas = []
        for tool in tools:
            fn = go_tool(tool)["function"] if tool["function"].get("name") else go_tool(tool)
            schemas.append(_lfm2_json(fn))
        system = (system + "\n" if system else "") + "List of tools: <|tool_list_start|>[" + ", ".join(schemas) + \
            "]<|tool_list_end|>"
    if system:  # :257-261
        out.append("<|im_start|>system\n" + system + "<|im_end|>\n")
    keep_past_thinking = is_thinking and think is True  # :263
    last_assistant = max((i for i in range(start, len(messages)) if messages[i]["role"] == "assistant"), default=-1)
    for i in range(start, len(messages)):  # :279-322
        m = messages[i]
        prefill = i == len(messages) - 1 and m["role"] == "assistant"
        out.append("<|im_start|>" + m["role"] + "\n")
        content = m.get("content") or ""
        if m["role"] == "assistant" and m.get("tool_calls") and "<|tool_call_start|>" not in content:  # :290-296
            calls = []
            for call in m["tool_calls"]:  # :164-199 Pythonic calls, arguments in sorted key order
                args = call["function"].get("arguments") or {}
                calls.append(call["function"]["name"] + "(" +
                             ",".join(f"{k}={_lfm2_json(args[k])}" for k in sorted(args)) + ")")
            rendered = "<|tool_call_start|>[" + ",".join(calls) + "]<|tool_call_end|>"
            content = rendered + content if not content.strip() else rendered + "\n" + content
        if is_thinking and m["role"] == "assistant" and m.get("thinking") and "</think>" not in content:  # :303-305
            content = "<think>" + m["thinking"] + "</think>" + content
        if m["role"] == "assistant" and not keep_past_thinking and i != last_assistant:  # :309-313
            idx = content.rfind("</think>")
            if idx >= 0:
                content = content[idx + len("</think>"):].strip()
        if m["role"] == "tool" and "<|tool_response_start|>" not in content:  # :314-316
            content = "<|tool_response_start|>" + content + "<|tool_response_end|>"
        out.append(content + ("" if prefill else "<|im_end|>\n"))
    if not (messages and messages[-1]["role"] == "assistant"):  # :324-333
        out.append("<|im_start|>assistant\n")
    return "".join(out)


RENDERERS.update({"glm-4.7": render_glm47, "lfm2": render_lfm2})


def render_lfm2_thinking(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                         think: bool | None) -> str:
    """RENDERER lfm2-thinking: renderer.go:111-112 LFM2Renderer{IsThinking: true}."""
    return render_lfm2(messages, tools, think, is_thinking=True)


RENDERERS["lfm2-thinking"] = render_lfm2_thinking


# ---------------------------------------------------------------- laguna (model/renderers/laguna.go)

_LAGUNA_SYSTEM = ("You are a helpful, conversationally-fluent assistant made by Poolside. You are here to be helpful "
                  "to users through natural language conversations.")


def _laguna_argument(value: Any) -> str:
    """laguna.go:269-282 formatLagunaToolCallArgument: a string as is, anything else json.go:8-14 marshalWithSpaces."""
    return value if isinstance(value, str) else _spaced(go_json(value))


def _laguna_assistant(content: str, reasoning: str) -> tuple[str, str]:
    """laguna.go:151-167 lagunaV2AssistantContent: reasoning cut out of a content that holds </think>."""
    parts = content.split("</think>")
    if len(parts) == 1:
        return content, reasoning
    if not reasoning:
        before = parts[0].rstrip("\n")
        i = before.rfind("<think>")
        if i >= 0:
            before = before[i + len("<think>"):]
        reasoning = before.lstrip("\n")
    return parts[-1].lstrip("\n"), reasoning


def render_laguna(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, think: bool | None) -> str:
    """RENDERER laguna: renderer.go:113-114 LagunaRenderer."""
    out = ["〈|EOS|〉"]  # laguna.go:28
    thinking = think is True  # :32
    first_system = bool(messages) and messages[0]["role"] == "system"  # :38-42
    system = messages[0]["content"] if first_system else _LAGUNA_SYSTEM
    if system.strip() or tools:  # :44-71
        out.append("<system>\n")
        if system.strip():
            out.append("\n" + system.rstrip())
        if tools:
            out.append("\n\n### Tools\n\nYou may call functions to assist with the user query.\n"
                       "All available function signatures are listed below:\n<available_tools>\n")
            out.extend(_spaced(go_json(go_tool(t))) + "\n" for t in tools)
            out.append("</available_tools>\n\n")
            if thinking:
                out.append("Wrap your thinking in '<think>', '</think>' tags, followed by a function call. For each "
                           "function call, return an unescaped XML-like object with function name and arguments "
                           "within '<tool_call>' and '</tool_call>' tags, like here:\n<think> your thoughts here "
                           "</think>\n")
            else:
                out.append("For each function call, return an unescaped XML-like object with function name and "
                           "arguments within '<tool_call>' and '</tool_call>' tags, like here:\n")
            out.append("<tool_call>function-name\n<arg_key>argument-key</arg_key>\n<arg_value>value-of-argument-key"
                       "</arg_value>\n</tool_call>")
        out.append("\n</system>\n")
    for i, m in enumerate(messages):  # :74-134
        if i == 0 and first_system:
            continue
        if m["role"] == "user":
            out.append("<user>\n" + m["content"] + "\n</user>\n")
        elif m["role"] == "assistant":  # :84-124
            content, reasoning = _laguna_assistant(m.get("content") or "", m.get("thinking") or "")
            calls = m.get("tool_calls") or []
            prefill = i == len(messages) - 1 and bool(content.strip() or reasoning.strip() or calls)
            out.append("<assistant>\n")
            out.append(f"<think>\n{reasoning.strip()}\n</think>\n" if reasoning.strip() else "</think>\n")
            if content.strip():
                out.append(content.strip() + "\n")
            for call in calls:
                out.append("<tool_call>" + call["function"]["name"] + "\n")
                for name, value in (call["function"].get("arguments") or {}).items():
                    out.append(f"<arg_key>{name}</arg_key>\n<arg_value>{_laguna_argument(value)}</arg_value>\n")
                out.append("</tool_call>\n")
            if not prefill:
                out.append("</assistant>\n")
        elif m["role"] == "tool":
            out.append("<tool_response>\n" + m["content"] + "\n</tool_response>\n")
        elif m["role"] == "system":
            out.append("<system>\n" + m["content"] + "\n</system>\n")
    if not messages or messages[-1]["role"] != "assistant":  # :139-146
        out.append("<assistant>\n" + ("<think>" if thinking else "</think>"))
    return "".join(out)


RENDERERS["laguna"] = render_laguna


# ---------------------------------------------------------------- cohere (model/renderers/cohere.go)

def _cohere_tool(tool: dict[str, Any]) -> str:
    """cohere.go:29-51 cohereToolJSON: name and description json.Marshal'ed, parameters with spaces, responses null."""
    fn = tool["function"]
    return (f'{{"name": {go_json(fn["name"])}, "description": {go_json(fn.get("description", ""))}, '
            f'"parameters": {_spaced(go_json(go_parameters(fn.get("parameters", {}))))}, "responses": null}}')


def _cohere_result(call_id: str, content: str) -> str:
    """cohere.go:78-89 writeToolResult."""
    return ('\n    {\n        "tool_call_id": "' + call_id + '",\n        "results": {\n\n            \n            "0": '
            + _spaced(go_json({"content": content})) + '\n\n        },\n        "is_error": null\n    }')


def render_cohere(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, think: bool | None) -> str:
    """RENDERER cohere: renderer.go:117-118 CohereRenderer."""
    out = []
    reasoning = think is not False  # cohere.go:96
    system, rest = "", messages
    if messages and messages[0]["role"].lower() == "system":  # :101-106 the first system message only
        system, rest = messages[0]["content"], messages[1:]
    out.append("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TEXT|>")  # :110-118
    if system:
        out.append(system + "\n\n\n\n")
    out.append("# Available Tools\n```json\n[\n")  # :55-75
    if not tools:
        out.append("\n\n")
    for j, tool in enumerate(tools or ()):
        out.append("\n    " + _cohere_tool(tool) + ("," if j < len(tools or ()) - 1 else "") + "\n\n")
    out.append("\n]\n```<|END_TEXT|><|END_OF_TURN_TOKEN|>")
    ids: dict[str, str] = {}  # :123-141 call ids renumbered 0, 1, … across the conversation
    counter = 0
    prefill = False
    i = 0
    while i < len(rest):  # :144-215
        m = rest[i]
        role = m["role"].lower()
        content = m.get("content") or ""
        if role == "system":
            out.append("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TEXT|>" + content + "<|END_TEXT|><|END_OF_TURN_TOKEN|>")
        elif role == "user":
            out.append("<|START_OF_TURN_TOKEN|><|USER_TOKEN|><|START_TEXT|>" + content + "<|END_TEXT|><|END_OF_TURN_TOKEN|>")
        elif role in ("assistant", "chatbot"):
            out.append("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")
            if m.get("tool_calls"):  # :157-183
                out.append("\n            \n                ")
                if m.get("thinking"):
                    out.append("<|START_THINKING|>" + m["thinking"] + "<|END_THINKING|>")
                out.append("<|START_ACTION|>[")
                for j, call in enumerate(m["tool_calls"]):
                    idx = str(counter)
                    counter += 1
                    if call.get("id"):
                        ids.setdefault(call["id"], idx)
                    out.append('\n\n    {"tool_call_id": "' + idx + '", "tool_name": "' + call["function"]["name"]
                               + '", "parameters": ' + _spaced(go_json(call["function"].get("arguments") or {})) + "}")
                    if j < len(m["tool_calls"]) - 1:
                        out.append(",")
                out.append("\n\n]<|END_ACTION|><|END_OF_TURN_TOKEN|>")
            else:  # :184-199
                if m.get("thinking"):
                    out.append("<|START_THINKING|>" + m["thinking"] + "<|END_THINKING|>")
                out.append("<|START_TEXT|>" + content)
                if i == len(rest) - 1:
                    prefill = True
                else:
                    out.append("<|END_TEXT|><|END_OF_TURN_TOKEN|>")
        elif role == "tool":  # :200-213 consecutive results in one array
            out.append("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TOOL_RESULT|>[")
            out.append(_cohere_result(ids.get(m.get("tool_call_id", ""), m.get("tool_call_id", "")), content))
            while i + 1 < len(rest) and rest[i + 1]["role"].lower() == "tool":
                i += 1
                out.append("," + _cohere_result(ids.get(rest[i].get("tool_call_id", ""),
                                                        rest[i].get("tool_call_id", "")), rest[i].get("content") or ""))
            out.append("\n\n]<|END_TOOL_RESULT|><|END_OF_TURN_TOKEN|>")
        i += 1
    if not prefill:  # :217-224
        out.append("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>" +
                   ("<|START_THINKING|>" if reasoning else "<|START_THINKING|><|END_THINKING|>"))
    return "".join(out)


RENDERERS["cohere"] = render_cohere


# ---------------------------------------------------------------- glimmer (model/renderers/glimmer.go)

_GLIMMER_TOOLS_PREFIX = (
    "In this environment you have access to a set of tools you can use to answer the user's question.\n\n"
    "You can invoke a function by writing a \"<atem:function_calls>\" block like the following:\n"
    "<atem:function_calls>\n<atem:invoke name=\"$FUNCTION_NAME\">\n"
    "<atem:parameter name=\"$PARAMETER_NAME\">$PARAMETER_VALUE</atem:parameter>\n...\n</atem:invoke>\n"
    "</atem:function_calls>\n\nString and scalar parameters should be specified as is, while lists and objects "
    "should use JSON format. Note that spaces for string values are not stripped. The output is not expected to be "
    "valid XML and is parsed with regular expressions.\nHere are the functions available in JSONSchema format:\n"
    "// Tool metadata\n"
)
_GLIMMER_TOOLS_SUFFIX = (
    "\n\nHere's an example of how to call a function in the tool set:\n(If the tool namespace is not specified, "
    "invoke the function directly as `example_function_name` rather than `example_tool_name.example_function_name`)"
    "\n\nto=example_tool_name.example_function_name\n\n<atem:function_calls>\n"
    "<atem:invoke name=\"example_tool_name.example_function_name\">\n"
    "<atem:parameter name=\"example_parameter_1\">value_1</atem:parameter>\n"
    "<atem:parameter name=\"example_parameter_2\">This is the value for the second parameter\nthat can span\n"
    "\"multiple\" lines\n</atem:parameter>\n</atem:invoke>\n</atem:function_calls>"
)


def _glimmer_json(value: Any) -> str:
    """glimmer.go:114-122 glimmerJSON: encoding/json without HTML escaping, json.go:16-48 spaces added."""
    return _lfm2_json(value)


def _glimmer_namespaces(tools: list[dict[str, Any]]) -> list[str]:
    """glimmer.go:93-111: the part of each tool name before the first '.', first seen first."""
    seen: list[str] = []
    for tool in tools:
        ns = tool["function"]["name"].split(".", 1)[0]
        if ns not in seen:
            seen.append(ns)
    return seen


def _glimmer_system(content: str, tools: list[dict[str, Any]] | None, strength: str, date_text: str,
                    default: bool) -> str:
    """glimmer.go:178-208 writeGlimmerSystem."""
    if not default:  # :78-87 "Reasoning effort" spelled "Reasoning strength"
        for a, b in (("Reasoning effort", "Reasoning strength"), ("Reasoning Effort", "Reasoning Strength"),
                     ("reasoning effort", "reasoning strength"), ("REASONING EFFORT", "REASONING STRENGTH")):
            content = content.replace(a, b)
    out = ["<|start|>system<|message|>" + content]
    if default:
        out.append(f"\nKnowledge cutoff: 2026-01-04.\nCurrent date: {date_text}.")
    if default or "reasoning strength" not in content.lower():
        out.append(f"\n\nReasoning strength: {strength}.")
    if tools:  # :124-166
        out.append("\n\n" + _GLIMMER_TOOLS_PREFIX)
        for ns in _glimmer_namespaces(tools):
            out.append(f'{{"name": {_glimmer_json(ns)}, "description": {_glimmer_json("")}}}\n')
        out.append("// Function schemas")
        for tool in tools:
            fn = tool["function"]
            out.append(f'\n{{"name": {_glimmer_json(fn["name"])}, "description": '
                       f'{_glimmer_json(fn.get("description", ""))}, "parameters": '
                       f'{_glimmer_json(go_parameters(fn.get("parameters", {})))}}}')
        out.append(_GLIMMER_TOOLS_SUFFIX)
    out.append('\n\n# Valid recipients: "self"')  # :168-176
    out.extend(f', "{ns}.*"' for ns in _glimmer_namespaces(tools or []))
    out.append(', "user".<|eot|>')
    return "".join(out)


def render_glimmer(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, think: bool | None,
                   *, current_date: str = "2026-11-26") -> str:
    """RENDERER glimmer: renderer.go:119-120 GlimmerRenderer; `current_date` stands for time.Now() (:306-309)."""
    out = ["<|begin_of_text|>"]  # glimmer.go:294
    strength = "high" if think is None else ("high" if think else "none")  # :65-76 (a level string is not sent here)
    if not any(m["role"] == "system" for m in messages):  # :296-313
        out.append(_glimmer_system("You are a helpful AI assistant.", tools, strength, current_date, True))
    for i, m in enumerate(messages):  # :316-363
        content = m.get("content") or ""
        end = "<|eom|>" if i + 1 < len(messages) and messages[i + 1]["role"] == m["role"] else "<|eot|>"
        if m["role"] == "system":
            out.append(_glimmer_system(content, tools, strength, "", False))
        elif m["role"] == "user":
            out.append("<|start|>user<|message|>" + content + "<|eot|>")
        elif m["role"] == "tool":  # :222-239 the tool_name, else the name of the call with that id
            name = m.get("tool_name") or m.get("tool_call_id", "")
            if not m.get("tool_name") and m.get("tool_call_id"):
                for other in messages:
                    for call in other.get("tool_calls") or ():
                        if call.get("id") == m["tool_call_id"]:
                            name = call["function"]["name"]
            out.append(f'<|start|>tool {name}<|message|><tool_output name="{name}">\n{content}\n</tool_output><|eot|>')
        elif m["role"] == "assistant":
            if m.get("thinking"):
                out.append("<|start|>assistant to=self<|message|>" + m["thinking"] + "<|eom|>")
            calls = m.get("tool_calls") or []
            for j, call in enumerate(calls):  # :253-277 one ATEM block per call
                out.append("<|start|>assistant to=" + call["function"]["name"] + "<|message|>"
                           "<atem:function_calls>\n<atem:invoke name=\"" + call["function"]["name"] + "\">\n")
                for name, value in (call["function"].get("arguments") or {}).items():
                    text = "null" if value is None else (
                        _glimmer_json(value) if isinstance(value, (dict, list)) else _go_v(value))
                    out.append(f'<atem:parameter name="{name}">{text}</atem:parameter>\n')
                out.append("</atem:invoke>\n</atem:function_calls>" + (end if j + 1 == len(calls) else "<|eom|>"))
            if not calls and (content or not m.get("thinking")):
                out.append("<|start|>assistant to=user<|message|>" + content + "<|eot|>")
    out.append("<|start|>assistant")  # :365-366
    return "".join(out)


RENDERERS["glimmer"] = render_glimmer


# ---------------------------------------------------------------- nemotron-3-nano (model/renderers/nemotron3nano.go)

def _go_quote(text: str) -> str:
    """strconv.Quote for printable text (what the suite holds): JSON's escapes for quotes, backslashes and controls."""
    if not text.isprintable():
        raise NotImplementedError("strconv.Quote of non-printable text is not reproduced here")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _nemo_py(value: Any) -> str:
    """nemotron3nano.go:392-489 pythonJSON: Python-like JSON, map keys sorted, schema properties in struct order."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return _go_quote(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return go_json(value)
    if isinstance(value, list):
        return "[" + ", ".join(_nemo_py(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_go_quote(k)}: {_nemo_py(value[k])}" for k in sorted(value)) + "}"
    raise NotImplementedError(type(value))


def _nemo_value(value: Any) -> str:
    """nemotron3nano.go:250-272 templateValue: None/True/False as Python prints them, containers as pythonJSON."""
    if value is None:
        return "None"
    if isinstance(value, (dict, list)):
        return _nemo_py(value)
    if isinstance(value, bool):
        return "True" if value else "False"
    return _go_v(value)


def _strip_toggles(text: str) -> str:
    """nemotron3nano.go:350-355 stripThinkToggles."""
    text = text.replace("</think>", "<_end_think>").replace("/think", "").replace("/no_think", "")
    return text.replace("<_end_think>", "</think>")


def render_nemotron3_nano(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                          think: bool | None) -> str:
    """RENDERER nemotron-3-nano: renderer.go:93-94 Nemotron3NanoRenderer{} (not v35)."""
    thinking = think is not False  # nemotron3nano.go:317-336: on unless false; /think and /no_think toggle it
    for m in messages:
        if m["role"] in ("user", "system"):
            if "/think" in m["content"].replace("</think>", ""):
                thinking = True
            elif "/no_think" in m["content"]:
                thinking = False
    system, loop = "", messages
    if messages and messages[0]["role"] == "system":  # :31-38
        system, loop = _strip_toggles(messages[0]["content"]), messages[1:]
    last_user = max((i for i, m in enumerate(loop) if m["role"] == "user"), default=-1)  # :41-46
    out = ["<|im_start|>system\n" + system]  # :48-59
    if tools:
        if system:
            out.append("\n\n")
        out.append("# Tools\n\nYou have access to the following functions:\n\n<tools>")  # :125-181
        for tool in tools:
            fn = tool["function"]
            out.append("\n<function>\n<name>" + fn["name"] + "</name>")
            if fn.get("description"):
                out.append("\n<description>" + fn["description"].strip() + "</description>")
            out.append("\n<parameters>")
            params = go_parameters(fn.get("parameters", {}))
            for name, prop in (params["properties"] or {}).items():
                out.append("\n<parameter>\n<name>" + name + "</name>")
                kind = prop.get("type")
                if kind:  # :357-366
                    kinds = kind if isinstance(kind, list) else [kind]
                    out.append("\n<type>" + (kinds[0] if len(kinds) == 1 else
                                             "[" + ", ".join(f"'{k}'" for k in kinds) + "]") + "</type>")
                if prop.get("description"):
                    out.append("\n<description>" + prop["description"].strip() + "</description>")
                if prop.get("enum"):
                    out.append("\n<enum>" + _nemo_py(prop["enum"]) + "</enum>")
                for key in ("anyOf", "items", "properties", "required"):  # :368-381
                    if prop.get(key):
                        out.append(f"\n<{key}>{_nemo_py(prop[key])}</{key}>")
                out.append("\n</parameter>")
            for key in ("$defs", "items"):  # :383-390
                if params.get(key):
                    out.append(f"\n<{key}>{_nemo_value(params[key])}</{key}>")
            if params.get("required"):
                out.append("\n<required>" + _nemo_py(params["required"]) + "</required>")
            out.append("\n</parameters>\n</function>")
        out.append("\n</tools>" + _QC_INSTRUCTIONS)
    out.append("<|im_end|>\n")
    for i, m in enumerate(loop):  # :61-113
        text = m.get("content") or ""
        if m["role"] == "assistant":
            # :183-195 buildContent
            if m.get("thinking"):
                content = "<think>\n" + m["thinking"] + "\n</think>\n" + text
            elif "<think>" not in text and "</think>" not in text:
                content = "<think></think>" + text
            else:
                content = text
            truncate = i < last_user
            if m.get("tool_calls"):  # :210-230 formatToolCallContent, :232-240 writeToolCalls
                if not content.strip():
                    head = "<think></think>"
                elif not truncate:
                    head = content.strip() + "\n"
                else:
                    c = content
                    if "</think>" in c:
                        c = c.split("</think>")[-1]
                    elif "<think>" in c:
                        c = c.split("<think>")[0]
                    head = ("<think></think>" + c.strip()).strip() + "\n"
                out.append("<|im_start|>assistant\n" + head)
                for call in m["tool_calls"]:
                    out.append("<tool_call>\n<function=" + call["function"]["name"] + ">\n")
                    for name, value in (call["function"].get("arguments") or {}).items():
                        out.append(f"<parameter={name}>\n{_nemo_value(value)}\n</parameter>\n")
                    out.append("</function>\n</tool_call>\n")
                out.append("<|im_end|>\n")
            else:  # :197-208 formatAssistantContent
                c = content
                if truncate and "<think>" in c and "</think>" in c:
                    c = "<think></think>" + c.split("</think>")[-1]
                out.append("<|im_start|>assistant\n" + c.strip() + "<|im_end|>\n")
        elif m["role"] in ("user", "system"):
            out.append("<|im_start|>" + m["role"] + "\n" + _strip_toggles(text).strip() + "<|im_end|>\n")
        elif m["role"] == "tool":  # :91-108 consecutive results share one user turn
            if i > 0 and loop[i - 1]["role"] != "tool":
                out.append("<|im_start|>user\n")
            out.append("<tool_response>\n" + text + "\n</tool_response>\n")
            if not (i + 1 < len(loop) and loop[i + 1]["role"] == "tool"):
                out.append("<|im_end|>\n")
        else:
            out.append("<|im_start|>" + m["role"] + "\n" + text + "<|im_end|>\n")
    out.append("<|im_start|>assistant\n<think>\n" if thinking else "<|im_start|>assistant\n<think></think>")  # :116-120
    return "".join(out)


RENDERERS["nemotron-3-nano"] = render_nemotron3_nano


# ---------------------------------------------------------------- qwen3.5 (model/renderers/qwen35.go)

_Q35_POSTAMBLE = "\n</tools>" + _QC_INSTRUCTIONS


def _q35_split(content: str, thinking: str, render_block: bool) -> tuple[str, str]:
    """qwen35.go:91-111 splitQwen35ReasoningContent (tagged reasoning extracted: the qwen3.5 variant)."""
    if render_block and thinking:
        return thinking.strip(), content
    reasoning = ""
    idx = content.find("</think>")
    if idx != -1:
        before = content[:idx]
        open_at = before.rfind("<think>")
        reasoning = before[open_at + len("<think>"):] if open_at != -1 else before
        content = content[idx + len("</think>"):].lstrip("\n")
    return reasoning.strip(), content


def render_qwen35(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, think: bool | None) -> str:
    """RENDERER qwen3.5: renderer.go:67-69 Qwen35Renderer{isThinking: true, emitEmptyThinkOnNoThink: true}."""
    thinking = True if think is None else think  # qwen35.go:216-219
    out = []
    first_system = bool(messages) and messages[0]["role"] == "system"
    if tools:  # :229-250 the system prompt after the tools
        out.append("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>")
        out.extend("\n" + _spaced(go_json(go_tool(t))) for t in tools)
        out.append(_Q35_POSTAMBLE)
        if first_system and messages[0]["content"].strip():
            out.append("\n\n" + messages[0]["content"].strip())
        out.append("<|im_end|>\n")
    elif first_system:  # :251-263
        out.append("<|im_start|>system\n" + messages[0]["content"].strip() + "<|im_end|>\n")
    last_query = len(messages) - 1  # :268-281 the last user message that is not a tool response
    for i in range(len(messages) - 1, -1, -1):
        text = messages[i]["content"].strip() if messages[i]["role"] == "user" else ""
        if messages[i]["role"] == "user" and not (text.startswith("<tool_response>") and
                                                  text.endswith("</tool_response>")):
            last_query = i
            break
    for i, m in enumerate(messages):  # :284-357
        content = (m.get("content") or "").strip()
        last = i == len(messages) - 1
        prefill = last and m["role"] == "assistant"
        if m["role"] == "user" or (m["role"] == "system" and i != 0):
            out.append("<|im_start|>" + m["role"] + "\n" + content + "<|im_end|>\n")
        elif m["role"] == "assistant":
            block = thinking and i > last_query  # :298
            reasoning, content = _q35_split(content, m.get("thinking") or "", block)
            out.append("<|im_start|>assistant\n" + (f"<think>\n{reasoning}\n</think>\n\n" if block else "") + content)
            for j, call in enumerate(m.get("tool_calls") or ()):  # :312-330
                out.append(("\n\n" if content.strip() else "") if j == 0 else "\n")
                out.append("<tool_call>\n<function=" + call["function"]["name"] + ">\n")
                for name, value in (call["function"].get("arguments") or {}).items():
                    out.append(f"<parameter={name}>\n{_qc_argument(value)}\n</parameter>\n")
                out.append("</function>\n</tool_call>")
            if not prefill:
                out.append("<|im_end|>\n")
        elif m["role"] == "tool":  # :335-342
            if i == 0 or messages[i - 1]["role"] != "tool":
                out.append("<|im_start|>user")
            out.append("\n<tool_response>\n" + content + "\n</tool_response>")
            if last or messages[i + 1]["role"] != "tool":
                out.append("<|im_end|>\n")
        if last and not prefill:  # :349-356
            out.append("<|im_start|>assistant\n" + ("<think>\n" if thinking else "<think>\n\n</think>\n\n"))
    return "".join(out)


RENDERERS["qwen3.5"] = render_qwen35


# ---------------------------------------------------------------- gemma4 (model/renderers/gemma4.go)

_G4Q = '<|"|>'  # gemma4.go:19-21


def _g4_types(value: Any) -> list[str]:
    """gemma4.go:622-645 normalizeTypeNames: a type or list of types, upper-cased."""
    if isinstance(value, str):
        return [value.upper()]
    if isinstance(value, list):
        return [v.upper() for v in value if isinstance(v, str)]
    return []


def _g4_arg(value: Any) -> str:
    """gemma4.go:707-732 formatArgValue (maps with sorted keys, :734-755; arrays :826-837)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _G4Q + value + _G4Q
    if isinstance(value, (int, float)):
        return _go_v(value)
    if isinstance(value, dict):
        return "{" + ",".join(k + ":" + _g4_arg(value[k]) for k in sorted(value)) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_g4_arg(v) for v in value) + "]"
    return str(value)


def _g4_schema_value(value: Any) -> str:
    """gemma4.go:757-788 formatSchemaValue (maps :790-811, arrays :813-824): like formatArgValue but map keys quoted with <|"|>."""
    if isinstance(value, dict):
        return "{" + ",".join(_G4Q + k + _G4Q + ":" + _g4_schema_value(value[k]) for k in sorted(value)) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_g4_schema_value(v) for v in value) + "]"
    return _g4_arg(value)


def _g4_prop_map(prop: dict[str, Any], top: bool) -> dict[str, Any]:
    """gemma4.go:496-527 schemaValueFromToolProperty, :529-561 topLevelTypedSchemaValueFromToolProperty (a
    multi-type top-level union printed as the Jinja stringifies it, :563-578). anyOf unions are not reproduced."""
    if prop.get("anyOf"):
        raise NotImplementedError("anyOf (gemma4.go:580-601) is not reproduced here")
    out: dict[str, Any] = {}
    kind = prop.get("type")
    if kind:
        kinds = [kind] if isinstance(kind, str) else list(kind)
        if top:
            out["type"] = kinds[0] if len(kinds) == 1 else "[" + ", ".join(f"'{k.upper()}'" for k in kinds) + "]"
        else:
            out["type"] = kinds[0] if len(kinds) == 1 else kinds
    for key in ("description", "enum", "items"):
        if prop.get(key):
            out[key] = prop[key]
    if prop.get("properties") is not None:
        props = prop["properties"]
        out["properties"] = {k: _g4_prop_map(v, True) for k, v in props.items()} if top else props
    if prop.get("required"):
        out["required"] = prop["required"]
    return out


def _g4_schema_map(value: Any) -> dict[str, Any] | None:
    """gemma4.go:476-494 asSchemaMap (a property map taken as given; its values as schema maps when they are
    api.ToolProperty values: the request's JSON decodes to the same keys)."""
    return value if isinstance(value, dict) else None


def _g4_items(items: dict[str, Any]) -> str:
    """gemma4.go:287-339 writeSchemaItemsSpec: the keys sorted, null values skipped."""
    parts = []
    for key in sorted(items):
        value = items[key]
        if value is None:
            continue
        if key == "properties":
            sub = _g4_schema_map(value)
            parts.append("properties:{" + (_g4_props(sub) if sub is not None else "") + "}")
        elif key == "required":
            parts.append("required:[" + ",".join(_G4Q + r + _G4Q for r in value if isinstance(r, str)) + "]")
        elif key == "type":
            names = _g4_types(value)
            if len(names) == 1:
                parts.append("type:" + _G4Q + names[0] + _G4Q)
            elif names:
                parts.append("type:[" + ",".join(_G4Q + n + _G4Q for n in names) + "]")
            else:
                parts.append("")  # gemma4.go:321-335: the comma is written, nothing after it
        else:
            parts.append(key + ":" + _g4_schema_value(value))
    return ",".join(parts)


def _g4_props(props: dict[str, Any]) -> str:
    """gemma4.go:341-474 writeSchemaProperties: names sorted, standard keys skipped (:613-620)."""
    parts = []
    for name in sorted(props):
        if name in ("description", "type", "properties", "required", "nullable"):
            continue
        prop = _g4_schema_map(props[name])
        if prop is None:
            continue
        fields = []
        if isinstance(prop.get("description"), str) and prop["description"]:  # :365-369
            fields.append("description:" + _G4Q + prop["description"] + _G4Q)
        names = _g4_types(prop.get("type"))
        first = names[0] if names else ""
        if first == "STRING" and isinstance(prop.get("enum"), list) and prop["enum"]:  # :377-392
            fields.append("enum:[" + ",".join(_G4Q + _go_v(v) + _G4Q for v in prop["enum"]) + "]")
        elif first == "ARRAY":  # :393-404
            items = _g4_schema_map(prop.get("items"))
            if items:
                fields.append("items:{" + _g4_items(items) + "}")
        if prop.get("nullable") is True:  # :406-413
            fields.append("nullable:true")
        if first == "OBJECT":  # :415-452
            nested = _g4_schema_map(prop.get("properties"))
            fields.append("properties:{" + _g4_props(nested if nested is not None else prop) + "}")
            required = [r for r in prop.get("required") or () if isinstance(r, str)]
            if required:
                fields.append("required:[" + ",".join(_G4Q + r + _G4Q for r in required) + "]")
        if len(names) == 1:  # :454-469
            fields.append("type:" + _G4Q + names[0] + _G4Q)
        elif names:
            fields.append("type:[" + ",".join(_G4Q + n + _G4Q for n in names) + "]")
        parts.append(name + ":{" + ",".join(fields) + "}")
    return ",".join(parts)


def _g4_declaration(tool: dict[str, Any]) -> str:
    """gemma4.go:221-267 renderToolDeclaration."""
    fn = tool["function"]
    out = "<|tool>declaration:" + fn["name"] + "{description:" + _G4Q + (fn.get("description") or "") + _G4Q
    params = fn.get("parameters") or {}
    if params.get("properties") is not None or params.get("type"):
        fields = []
        if params.get("properties"):  # :233-238, typedSchemaPropertiesMap :277-283
            fields.append("properties:{" + _g4_props({k: _g4_prop_map(v, True)
                                                      for k, v in params["properties"].items()}) + "}")
        if params.get("required"):  # :240-253
            fields.append("required:[" + ",".join(_G4Q + r + _G4Q for r in params["required"]) + "]")
        if params.get("type"):  # :255-260
            fields.append("type:" + _G4Q + params["type"].upper() + _G4Q)
        out += ",parameters:{" + ",".join(fields) + "}"
    return out + "}<tool|>"


def _g4_strip_thinking(text: str) -> str:
    """gemma4.go:151-169 stripThinking."""
    out = []
    while True:
        start = text.find("<|channel>")
        if start == -1:
            out.append(text)
            break
        out.append(text[:start])
        end = text.find("<channel|>", start)
        if end == -1:
            break
        text = text[end + len("<channel|>"):]
    return "".join(out).strip()


def _go_trim(text: str) -> str:
    """strings.TrimSpace: Unicode white space (Python's str.strip also strips a few separators Go keeps not)."""
    return text.strip(" \t\n\v\f\r\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
                      "\u200a\u2028\u2029\u202f\u205f\u3000")


def render_gemma4(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, think: bool | None,
                  empty_block_on_nothink: bool = False) -> str:
    """RENDERER gemma4 / gemma4-small (renderer.go:100-101); gemma4-large sets emptyBlockOnNothink (:102-103).
    Text only (no images). gemma4.go:27-149 Render."""
    out = ["<bos>"]  # :34
    has_system = bool(messages) and messages[0]["role"] in ("system", "developer")  # :36-44
    system = messages[0]["content"] if has_system else ""
    loop = messages[1:] if has_system else messages
    has_think = think is True  # :47
    if has_system or tools or has_think:  # :48-60
        out.append("<|turn>system\n")
        if has_think:
            out.append("<|think|>\n")
        if system:
            out.append(_go_trim(system))
        out.extend(_g4_declaration(t) for t in tools or ())
        out.append("<turn|>\n")
    last_user = max((i for i, m in enumerate(loop) if m["role"] == "user"), default=-1)  # :62-67
    prev_type = prev_non_tool = ""
    for i, m in enumerate(loop):  # :74-136
        if m["role"] == "tool":
            continue
        prev_type = ""
        role = "model" if m["role"] == "assistant" else m["role"]
        if not (role == "model" and prev_non_tool == "assistant"):  # :85-88
            out.append("<|turn>" + role + "\n")
        if m["role"] == "assistant" and m.get("thinking") and i > last_user:  # :90-94
            out.append("<|channel>thought\n" + m["thinking"] + "\n<channel|>")
        calls = m.get("tool_calls") or []
        for call in calls:  # :96-101 formatToolCall :679-701, arguments sorted by key
            args = call["function"].get("arguments") or {}
            out.append("<|tool_call>call:" + call["function"]["name"] + "{"
                       + ",".join(k + ":" + _g4_arg(args[k]) for k in sorted(args)) + "}<tool_call|>")
            prev_type = "tool_call"
        responses = False
        if calls:  # :103-111
            k = i + 1
            while k < len(loop) and loop[k]["role"] == "tool":
                name = loop[k].get("tool_name") or "unknown"  # :204-219 toolResponseName
                if loop[k].get("tool_call_id"):
                    name = next((c["function"]["name"] for c in calls if c.get("id") == loop[k]["tool_call_id"]),
                                name)
                out.append("<|tool_response>response:" + name + "{value:" + _g4_arg(loop[k].get("content") or "")
                           + "}<tool_response|>")  # :703-705
                responses = True
                prev_type = "tool_response"
                k += 1
        content = m.get("content") or ""
        if role == "model":  # :113-125
            had = False
            if content:
                content = _g4_strip_thinking(content)
                out.append(content)
                had = _go_trim(content) != ""
        else:
            out.append(_go_trim(content))
            had = _go_trim(content) != ""
        nxt = next((x["role"] for x in loop[i + 1:] if x["role"] != "tool"), "")  # :127, :191-198
        continues = role == "model" and nxt == "assistant" and (not calls or responses)
        if prev_type == "tool_call" and not responses:  # :129-133
            out.append("<|tool_response>")
        elif not continues and not (responses and not had and nxt == ""):
            out.append("<turn|>\n")
        prev_non_tool = m["role"]
    if prev_type not in ("tool_response", "tool_call"):  # :138-146 the generation prompt
        out.append("<|turn>model\n")
        if empty_block_on_nothink and not has_think:
            out.append("<|channel>thought\n<channel|>")
    elif prev_type == "tool_response" and has_think:
        out.append("<|channel>thought\n")
    return "".join(out)


RENDERERS["gemma4"] = render_gemma4
RENDERERS["gemma4-large"] = lambda messages, tools, think: render_gemma4(messages, tools, think,
                                                                          empty_block_on_nothink=True)
