"""Ollama's built-in renderers and parsers: the names a Modelfile may give, and the Ollama release that knows each."""

from __future__ import annotations

from pipelines.core.errors import ConfigError

SOURCE = (
    "github.com/ollama/ollama v0.33.0-rc2 (commit fb30760996871fa9460115c753afd2c60d4ab0f7, the Ollama source the "
    "tests pin in tests/data/ollama_pin.json): model/renderers/renderer.go:55-125 (rendererForName), "
    "model/parsers/parsers.go:44-105 (ParserForName) and parser/parser.go (the Modelfile commands); each name's "
    "version is the first release tag (v0.x.y, release candidates left out) whose source knows that name"
)
SOURCE_TAG = "v0.33.0-rc2"

# RENDERER name → first Ollama release that renders with it.
RENDERERS: dict[str, str] = {
    "qwen3-coder": "0.12.0",
    "qwen3-vl-instruct": "0.12.6",
    "qwen3-vl-thinking": "0.12.7",
    "cogito": "0.13.0",
    "olmo3": "0.13.3",
    "olmo3-think": "0.13.3",
    "olmo3.1": "0.13.4",
    "olmo3-32b-think": "0.13.4",
    "nemotron-3-nano": "0.13.4",
    "deepseek3.1": "0.13.5",
    "functiongemma": "0.13.5",
    "glm-4.7": "0.14.3",
    "lfm2": "0.14.3",
    "lfm2-thinking": "0.14.3",
    "glm-ocr": "0.15.5",
    "qwen3.5": "0.17.1",
    "gemma4": "0.20.0",
    "gemma4-small": "0.21.0",
    "gemma4-large": "0.21.0",
    "laguna": "0.22.0",
    "cohere": "0.30.10",
    "ornith": "0.30.11",
    "poolside-v1": "0.32.3",
    "glimmer": "0.32.7",
    "nemotron-3.5-nano": "0.32.9",
    "qwen3.8": "0.32.12",
}

# PARSER name → first Ollama release that parses with it (thinking and structured tool_calls out of the
# model's text).
PARSERS: dict[str, str] = {
    "passthrough": "0.12.0",
    "qwen3-coder": "0.12.0",
    "harmony": "0.12.1",
    "qwen3-vl-instruct": "0.12.6",
    "qwen3-vl-thinking": "0.12.7",
    "cogito": "0.13.1",
    "ministral": "0.13.1",
    "olmo3": "0.13.3",
    "olmo3-think": "0.13.3",
    "nemotron-3-nano": "0.13.4",
    "deepseek3": "0.13.5",
    "functiongemma": "0.13.5",
    "glm-4.7": "0.14.3",
    "lfm2": "0.14.3",
    "lfm2-thinking": "0.14.3",
    "glm-ocr": "0.15.5",
    "qwen3": "0.16.3",
    "qwen3-thinking": "0.16.3",
    "qwen3.5": "0.17.1",
    "gemma4": "0.20.0",
    "gemma4-no-thinking": "0.20.0",
    "laguna": "0.22.0",
    "cohere": "0.30.10",
    "ornith": "0.30.11",
    "poolside-v1": "0.32.3",
    "glimmer": "0.32.7",
    "nemotron-3.5-nano": "0.32.9",
}

# The Modelfile commands themselves: Ollama releases before these refuse the whole Modelfile
# ("command must be one of …"), they do not skip an unknown line.
COMMAND_SINCE: dict[str, str] = {"RENDERER": "0.12.0", "PARSER": "0.12.0", "REQUIRES": "0.14.0"}


def version_key(version: str) -> tuple[int, ...]:
    """'0.13.5' (or 'v0.13.5') as a tuple that sorts like releases do.

    Raises:
        ConfigError: not a dotted version of numbers.
    """
    text = version.removeprefix("v")
    try:
        return tuple(int(p) for p in text.split("."))
    except ValueError:
        raise ConfigError(f"{version!r} is not an Ollama version", hint="write it as 0.14.0") from None


def required_version(renderer: str | None, parser: str | None) -> str:
    """The oldest Ollama release that reads a Modelfile with REQUIRES and these RENDERER/PARSER names.

    Raises:
        ConfigError: a name this table does not hold.
    """
    needed = [COMMAND_SINCE["REQUIRES"]]
    for kind, name, table in (("RENDERER", renderer, RENDERERS), ("PARSER", parser, PARSERS)):
        if name is None:
            continue
        if name not in table:
            raise ConfigError(f"Ollama has no built-in {kind} named {name!r} (as of {SOURCE_TAG})",
                              hint=f"known: {', '.join(sorted(table))}")
        needed.append(table[name])
    return max(needed, key=version_key)


def check_ollama_version(renderer: str | None, parser: str | None, target: str) -> str:
    """The REQUIRES value for a Modelfile meant for Ollama `target`.

    Raises:
        ConfigError: `target` is older than the renderer, parser or REQUIRES command needs.
    """
    needed = required_version(renderer, parser)
    if version_key(target) < version_key(needed):
        what = " and ".join(f"{k} {n}" for k, n in (("RENDERER", renderer), ("PARSER", parser)) if n)
        raise ConfigError(
            f"Ollama {target} is older than this Modelfile needs: {what} need Ollama {needed} or newer",
            hint=f"upgrade Ollama to {needed} or newer, or publish a hand-written TEMPLATE with "
                 "`modelmint modelfile <file.gguf> --template FILE`",
        )
    return needed


# GGUF architecture → the (RENDERER, PARSER) Ollama sets itself at `ollama create` for whichever of the two the
# Modelfile leaves out (server/create.go:795-817 at v0.33.0-rc2). A RENDERER, once set, renders every prompt and
# the TEMPLATE is not used (server/prompt.go:135-143); no Modelfile command switches the inferred one off.
# Ollama's "gemma4" is resolved at chat time to gemma4-small or gemma4-large by model name or parameter count
# (server/renderer_resolution.go).
ARCHITECTURE_DEFAULTS: dict[str, tuple[str, str]] = {
    "gemma4": ("gemma4", "gemma4"),
    "laguna": ("laguna", "laguna"),
    "nemotron_h": ("nemotron-3-nano", "nemotron-3-nano"),
    "nemotron_h_moe": ("nemotron-3-nano", "nemotron-3-nano"),
    "nemotron_h_omni": ("nemotron-3-nano", "nemotron-3-nano"),
}
ARCHITECTURE_SOURCE = f"server/create.go:795-817 at {SOURCE_TAG}"


def ollama_fills_in(architecture: str | None, renderer: str | None,
                    parser: str | None) -> tuple[str | None, str | None]:
    """The (RENDERER, PARSER) Ollama adds by itself to a Modelfile naming `renderer`/`parser` for a GGUF of
    `architecture`: (None, None) where it adds neither."""
    defaults = ARCHITECTURE_DEFAULTS.get(architecture or "")
    if defaults is None or (renderer and parser):
        return None, None
    return (None if renderer else defaults[0]), (None if parser else defaults[1])
