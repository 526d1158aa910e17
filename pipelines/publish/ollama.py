"""Publish a GGUF for Ollama: a Modelfile whose TEMPLATE is proven against the source's chat template, and a card."""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipelines import __version__
from pipelines.chat.families import (
    FAMILIES,
    ChatFamily,
    TemplateTokens,
    UnsupportedChatTemplate,
    detect_family,
    get_family,
    matching_families,
)
from pipelines.chat.modelfile import Message, Modelfile, Parameter
from pipelines.chat.renderers import (
    ARCHITECTURE_SOURCE,
    check_ollama_version,
    ollama_fills_in,
    required_version,
)
from pipelines.core.errors import ArtifactError, ConfigError, UnsupportedModel
from pipelines.core.fsutil import hash_cache, write_text_atomic
from pipelines.core.report import (
    GGUFReport,
    VariantReport,
    answer_lines,
    card_front,
    card_validation,
    read_report,
)
from pipelines.core.runner import run
from pipelines.core.settings import Settings
from pipelines.core.texts import data_lines
from pipelines.core.vocab import GGUFKey
from pipelines.core.weights import gguf_shards, weights_line
from pipelines.source.catalog import CatalogEntry, HubSource
from pipelines.source.wheelsource import origin_lines

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_NUM_CTX",
    "FAMILIES",
    "OllamaInstall",
    "OllamaModelfile",
    "PublishedFiles",
    "SourceChat",
    "TemplateProof",
    "build_modelfile",
    "detect_family",
    "install_into_ollama",
    "ollama_commands",
    "publish_ollama",
    "read_source_chat",
]

DEFAULT_NUM_CTX = 8192
"""The context Ollama gets unless the model is shorter: Ollama's own default (2048/4096 in most versions)
silently truncates long chats, a model's full window (32k–128k) costs memory most machines lack."""

RUN_CHECK_PROMPT = "Reply with one word: ready"

_SAMPLING = (  # generation_config.json key → Modelfile PARAMETER, type
    ("temperature", "temperature", float),
    ("top_p", "top_p", float),
    ("top_k", "top_k", int),
    ("repetition_penalty", "repeat_penalty", float),
    ("min_p", "min_p", float),
)


# ---------------------------------------------------------------- what the source repository says


@dataclass(frozen=True)
class SourceChat:
    """The chat-relevant files of a Hugging Face model directory."""

    path: Path
    chat_template: str | None
    template_file: str | None
    """Which file the template came from (chat_template.jinja wins over tokenizer_config.json, as in transformers)."""
    bos_token: str | None
    eos_token: str | None
    add_bos_token: bool | None
    token_texts: dict[int, str]
    """Added/special token ids → text (tokenizer.json added_tokens, tokenizer_config added_tokens_decoder)."""
    generation: dict[str, Any]
    context_length: int | None
    license_text: str | None

    @property
    def generation_eos_texts(self) -> list[str]:
        ids = self.generation.get("eos_token_id")
        ids = ids if isinstance(ids, list) else [ids] if isinstance(ids, int) else []
        return [self.token_texts[i] for i in ids if i in self.token_texts]


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except ValueError as err:
        raise UnsupportedModel(f"{path} is not valid JSON: {err}", hint="fix or re-download the source") from err
    return data if isinstance(data, dict) else {}


def read_source_chat(path: Path) -> SourceChat:
    """Read chat template, special tokens, generation defaults and context length from a model directory.

    Raises:
        UnsupportedModel: a JSON file there is malformed.
    """
    path = Path(path)
    tok_cfg = _read_json(path / "tokenizer_config.json")
    template, origin = None, None
    raw = tok_cfg.get("chat_template")
    if isinstance(raw, list):  # named templates: transformers uses "default"
        raw = next((t.get("template") for t in raw if isinstance(t, dict) and t.get("name") == "default"), None)
    if isinstance(raw, str):
        template, origin = raw, "tokenizer_config.json"
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        standalone = jinja.read_text(encoding="utf-8")
        if template is not None and standalone != template:
            log.warning("%s: chat_template.jinja and tokenizer_config.json disagree; using chat_template.jinja "
                        "as transformers does", path)
        template, origin = standalone, "chat_template.jinja"
    elif template is None and (path / "chat_template.json").is_file():
        raw = _read_json(path / "chat_template.json").get("chat_template")
        if isinstance(raw, str):
            template, origin = raw, "chat_template.json"
    texts: dict[int, str] = {}
    for t in _read_json(path / "tokenizer.json").get("added_tokens", []) or []:
        if isinstance(t, dict) and isinstance(t.get("id"), int) and isinstance(t.get("content"), str):
            texts[t["id"]] = t["content"]
    for k, v in (tok_cfg.get("added_tokens_decoder") or {}).items():
        if str(k).isdigit() and _token_text(v):
            texts[int(k)] = _token_text(v)  # type: ignore[assignment]
    config = _read_json(path / "config.json")
    ctx = config.get("max_position_embeddings") or (config.get("text_config") or {}).get("max_position_embeddings")
    license_text = None
    for name in ("LICENSE", "LICENSE.txt", "LICENSE.md"):
        if (path / name).is_file():
            license_text = (path / name).read_text(encoding="utf-8", errors="replace")
            break
    add_bos = tok_cfg.get("add_bos_token")
    return SourceChat(
        path=path,
        chat_template=template,
        template_file=origin,
        bos_token=_token_text(tok_cfg.get("bos_token")),
        eos_token=_token_text(tok_cfg.get("eos_token")),
        add_bos_token=add_bos if isinstance(add_bos, bool) else None,
        token_texts=texts,
        generation=_read_json(path / "generation_config.json"),
        context_length=int(ctx) if isinstance(ctx, int) else None,
        license_text=license_text,
    )


# ---------------------------------------------------------------- what the GGUF says


@dataclass(frozen=True)
class GGUFChat:
    chat_template: str | None
    bos_text: str | None
    eos_text: str | None
    eot_text: str | None
    add_bos: bool | None
    context_length: int | None
    file_type: str | None
    vocab: frozenset[str] = frozenset()
    """Every token text of the GGUF's tokenizer (empty when it has none)."""
    architecture: str | None = None
    """general.architecture (Ollama picks a RENDERER/PARSER by it for a few architectures)."""


def read_gguf_chat(path: Path) -> GGUFChat:
    """Chat template, special-token texts and context length stored in a GGUF.

    Raises:
        ArtifactError: not a readable GGUF.
    """
    from gguf import LlamaFileType

    from pipelines.core.ggufheader import is_context_length, read_gguf_header

    keys = {
        GGUFKey.ARCHITECTURE, GGUFKey.FILE_TYPE, GGUFKey.CHAT_TEMPLATE, GGUFKey.TOKENS,
        GGUFKey.BOS_ID, GGUFKey.EOS_ID, GGUFKey.EOT_ID, GGUFKey.ADD_BOS,
    }
    meta = read_gguf_header(Path(path), lambda key, found: key in keys or is_context_length(key, found)).metadata
    arch = meta.get(GGUFKey.ARCHITECTURE)
    if not arch:
        raise ArtifactError(f"{path} has no general.architecture", hint="reconvert it with `modelmint convert`")
    tokens = meta.get(GGUFKey.TOKENS) or []

    def text(key: str) -> str | None:
        token_id = meta.get(key)
        return tokens[token_id] if isinstance(token_id, int) and 0 <= token_id < len(tokens) else None

    ftype = meta.get(GGUFKey.FILE_TYPE)
    try:
        file_type = LlamaFileType(int(ftype)).name.removeprefix("MOSTLY_") if ftype is not None else None
    except ValueError:
        file_type = str(ftype)
    add_bos = meta.get(GGUFKey.ADD_BOS)
    ctx = meta.get(GGUFKey.context_length(arch))
    return GGUFChat(
        chat_template=meta.get(GGUFKey.CHAT_TEMPLATE),
        bos_text=text(GGUFKey.BOS_ID),
        eos_text=text(GGUFKey.EOS_ID),
        eot_text=text(GGUFKey.EOT_ID),
        add_bos=bool(add_bos) if add_bos is not None else None,
        context_length=int(ctx) if isinstance(ctx, int) else None,
        file_type=file_type,
        vocab=frozenset(t for t in tokens if isinstance(t, str)),
        architecture=str(arch),
    )


# ---------------------------------------------------------------- the proof, when Go is at hand


@dataclass(frozen=True)
class TemplateProof:
    """The TEMPLATE rendered against the Jinja over modelmint's conversation suite."""

    conversations: int
    identical: list[str]
    refused_by_jinja: list[str]
    """Conversations the source template itself rejects (e.g. a system message for Gemma 2)."""
    different: list[str]

    @property
    def holds(self) -> bool:
        return not self.different and bool(self.identical)


def prove_template(jinja: str, go_template: str, family: ChatFamily, tokens: TemplateTokens,
                   settings: Settings) -> TemplateProof:
    """Render the suite both ways (see pipelines.chat.proof).

    Raises:
        GoMissing, ToolError: the Go renderer cannot be built or run.
    """
    from pipelines.chat.proof import SUITE, render_both

    results = render_both(jinja, go_template, family, tokens, settings)
    return TemplateProof(
        conversations=len(SUITE),
        identical=[r.conversation for r in results if r.equal],
        refused_by_jinja=[r.conversation for r in results if r.hf is None],
        different=[r.conversation for r in results if r.hf is not None and not r.equal],
    )


# ---------------------------------------------------------------- the Modelfile


@dataclass(frozen=True)
class OllamaModelfile:
    modelfile: Modelfile
    family: str | None
    template_origin: str
    """'source:<file>', 'gguf' or 'manual'."""
    stops: tuple[str, ...]
    num_ctx: int
    proof: TemplateProof | None
    warnings: tuple[str, ...] = field(default=())
    reading: Any = None
    """What Ollama reads from the TEMPLATE (gotemplate.TemplateAnalysis: tools offered, tool-call tag,
    thinking tags), when it was proven."""
    notes: tuple[str, ...] = field(default=())
    """The family's documented differences from the Jinja (pipelines.chat.families.ChatFamily.notes)."""
    evidence: tuple[str, ...] = field(default=())
    """The family's markers found in the chat template (why this family was chosen)."""


def _stops(family: ChatFamily | None, *texts: str | None) -> tuple[str, ...]:
    seen: list[str] = []
    for s in [*(family.stop if family else ()), *texts]:
        if s and s not in seen:
            seen.append(s)
    return tuple(seen)


def _sampling(generation: dict[str, Any]) -> list[Parameter]:
    if generation.get("do_sample") is False:
        # The publisher asks for greedy decoding; Ollama's equivalent is temperature 0.
        return [Parameter("temperature", 0.0)]
    params = []
    for key, name, kind in _SAMPLING:
        value = generation.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            params.append(Parameter(name, kind(value)))
    return params


def _from_path(gguf: Path, out_dir: Path) -> str:
    import os

    # Relative when the GGUF sits at or below the Modelfile (Ollama resolves FROM against the Modelfile's
    # directory, and a published directory can move); absolute otherwise.
    rel = os.path.relpath(gguf.resolve(), out_dir.resolve())
    return str(gguf.resolve()) if rel.startswith("..") else f"./{rel}"


def build_modelfile(
    gguf: Path,
    source: Path | SourceChat | None = None,
    *,
    settings: Settings,
    out_dir: Path | None = None,
    family: str | None = None,
    template: str | None = None,
    system: str | None = None,
    num_ctx: int | None = None,
    license_text: str | None = None,
    messages: tuple[Message, ...] = (),
    verify: bool | None = None,
    force: bool = False,
    ollama_version: str | None = None,
) -> OllamaModelfile:
    """The Modelfile for `gguf`: FROM it, the TEMPLATE of its chat family, stop tokens, defaults, licence.

    The chat template comes from `source` (a Hugging Face model directory) when given, else from the
    GGUF; when both have one and they differ, the source's is used and a warning says so. `family`
    names a family instead of detecting it; `template` is a hand-written Ollama TEMPLATE used as is.
    `verify` renders the conversation suite through both templates and refuses a mismatch (None: when
    a Go compiler or a built renderer is available). `out_dir` is where the Modelfile will live (FROM is
    relative to it; default: the GGUF's directory). A `family` the template does not match is refused unless
    `force` (then a failed proof is a warning). A RENDERER family gets RENDERER/PARSER/REQUIRES and no
    TEMPLATE; `ollama_version` refuses a target release older than those need.

    Raises:
        UnsupportedChatTemplate: no chat template, or one outside the supported families (the hint says how
            to supply a TEMPLATE by hand), or a TEMPLATE that does not reproduce it.
        UnsupportedModel: no eos token anywhere (generation would never stop).
        ConfigError: num_ctx beyond the model's context length, a `family` the template does not match
            (without `force`), an `ollama_version` older than the RENDERER/PARSER need.
        ArtifactError: `gguf` is not a readable GGUF.
        ModelfileError: SYSTEM or licence text that no Modelfile can hold.
    """
    gguf = Path(gguf)
    out_dir = Path(out_dir) if out_dir is not None else gguf.parent
    g = read_gguf_chat(gguf)
    src = read_source_chat(source) if isinstance(source, Path | str) else source
    warnings: list[str] = []
    jinja, origin = _chat_template_of(gguf, g, src, warnings)
    tokens = _template_tokens(gguf, g, src, warnings)
    fam, go_template, origin, proof = _family_and_template(
        gguf, jinja, origin, tokens, settings, family=family, template=template, verify=verify, force=force,
        vocab=g.vocab, warnings=warnings)

    num_ctx = _num_ctx(g, src, num_ctx)
    stops = _stops(fam, tokens.eos, g.eot_text, *(src.generation_eos_texts if src else []))
    params = [*(Parameter("stop", s) for s in stops), Parameter("num_ctx", num_ctx),
              *_sampling(src.generation if src else {})]

    licence = license_text if license_text is not None else (src.license_text if src else None)
    header = [f"Generated by modelmint {__version__} for {gguf.name}."]
    if fam is not None:
        header.append(f"Chat family: {fam.name} ({fam.title}); template from {origin}.")
    if proof is not None:
        header.append(f"TEMPLATE proven byte-identical to the source chat template on {len(proof.identical)} of "
                      f"{proof.conversations} conversations"
                      + (f" (the source template refuses {', '.join(proof.refused_by_jinja)})."
                         if proof.refused_by_jinja else "."))
    if fam is not None and fam.tool_use_refused:
        # Ollama lists a model whose TEMPLATE reads .Tools as tool-capable (server/images.go:236-249 at fb30760:
        # goTemplateCapabilities); its calls would come back as text, not tool_calls: said, not hidden.
        header.append(f"Tool use: refused: {fam.tool_use_refused}")
        warnings.append(f"{fam.name}: tool use refused: {fam.tool_use_refused}; Ollama will list the model as "
                        "tool-capable but return its tool calls as text")
    renderer, parser, requires = _builtin_names(fam, go_template, origin, ollama_version, header)
    _check_architecture_defaults(gguf, g.architecture, fam, go_template, renderer, parser, force, warnings, header)
    modelfile = Modelfile(
        from_=_from_path(gguf, out_dir), template=go_template, renderer=renderer, parser=parser, requires=requires,
        system=system, parameters=tuple(params), messages=messages,
        licenses=(licence.strip("\n"),) if licence else (), comments=tuple(header),
    )
    modelfile.to_text()  # fail here, not at write time, on text no Modelfile can hold
    for w in warnings:
        log.warning("%s", w)
    reading = None
    if proof is not None and go_template is not None:
        from pipelines.chat.gotemplate import analyze

        reading = analyze(go_template, settings)
    return OllamaModelfile(modelfile, fam.name if fam else None, origin, stops, int(num_ctx), proof,
                           tuple(warnings), reading, fam.notes if fam else (),
                           tuple(fam.evidence(jinja)[0]) if fam and jinja else ())


def _num_ctx(g: GGUFChat, src: SourceChat | None, num_ctx: int | None) -> int:
    """Raises: ConfigError: num_ctx beyond the model's context length."""
    ctx = g.context_length or (src.context_length if src else None)
    if num_ctx is None:
        return min(DEFAULT_NUM_CTX, ctx) if ctx else DEFAULT_NUM_CTX
    if ctx and num_ctx > ctx:
        raise ConfigError(f"num_ctx {num_ctx} is beyond the model's context length {ctx}",
                          hint=f"pass --num-ctx {ctx} or less")
    return int(num_ctx)


def _chat_template_of(gguf: Path, g: GGUFChat, src: SourceChat | None, warnings: list[str]) -> tuple[str | None, str]:
    """The Jinja chat template to follow and where it came from: the source's wins over the GGUF's."""
    jinja, origin = (src.chat_template, f"source:{src.template_file}") if src and src.chat_template else (None, "")
    if g.chat_template and jinja is not None and g.chat_template != jinja:
        warnings.append(
            f"{gguf.name} embeds a chat template that differs from the source's {src.template_file}; "  # type: ignore[union-attr]
            f"the TEMPLATE follows the source's {src.template_file} (the pinned upstream is the reference), "  # type: ignore[union-attr]
            "not the embedded one"
        )
    if jinja is None and g.chat_template:
        jinja, origin = g.chat_template, "gguf"
    return jinja, origin


def _template_tokens(gguf: Path, g: GGUFChat, src: SourceChat | None, warnings: list[str]) -> TemplateTokens:
    """Raises: UnsupportedModel: no eos token anywhere (generation would never stop)."""
    bos = (src.bos_token if src else None) or g.bos_text
    eos = (src.eos_token if src else None) or g.eos_text
    if not eos and not g.eot_text:
        raise UnsupportedModel(
            f"{gguf.name} has no eos token (neither its tokenizer metadata nor the source's tokenizer_config.json "
            "names one): generation would never stop",
            hint="fix the tokenizer's eos_token in the source and reconvert",
        )
    add_bos = g.add_bos if g.add_bos is not None else (src.add_bos_token if src else None)
    if add_bos is None:
        add_bos = True
        warnings.append("neither the GGUF nor the source says whether a BOS token is added; assuming it is")
    return TemplateTokens(bos=bos, eos=eos, engine_adds_bos=add_bos)


def _family_and_template(gguf: Path, jinja: str | None, origin: str, tokens: TemplateTokens, settings: Settings, *,
                         family: str | None, template: str | None, verify: bool | None, force: bool,
                         vocab: frozenset[str], warnings: list[str],
                         ) -> tuple[ChatFamily | None, str | None, str, TemplateProof | None]:
    """(family, Go TEMPLATE or None for a RENDERER family, template origin, proof).

    Raises:
        UnsupportedChatTemplate, ConfigError: as build_modelfile.
    """
    if template is not None:
        warnings.append("hand-written TEMPLATE: not proven against the chat template")
        return (get_family(family) if family else None), template, "manual", None
    if jinja is None:
        raise UnsupportedChatTemplate(f"neither {gguf.name} nor its source has a chat template",
                                      families=sorted(FAMILIES))
    fam = detect_family(jinja) if family is None else _forced_family(family, jinja, force, warnings)
    _check_special_tokens(fam, gguf, vocab, force, warnings)
    if fam.build is None:
        return fam, None, origin, None
    go_template = fam.template(jinja, tokens)
    return fam, go_template, origin, _maybe_prove(jinja, go_template, fam, tokens, settings, verify, warnings,
                                                   force=force)


# Turn markers that are always single special tokens where a template prints them: <|…|>, <｜…｜>, [INST]-style.
_SPECIAL = re.compile(r"^(<[|｜]\S+[|｜]>|\[/?[A-Z_]+\])$")


def _check_special_tokens(fam: ChatFamily, gguf: Path, vocab: frozenset[str], force: bool,
                          warnings: list[str]) -> None:
    """Refuse a family whose turn markers the GGUF's tokenizer lacks: the model would read them as plain text.

    Raises:
        UnsupportedModel: a marker is missing (unless `force`, which makes it a warning).
    """
    missing = [t for t in fam.stop if _SPECIAL.match(t) and t not in vocab]
    if not vocab or not missing:
        return
    message = (f"{gguf.name}'s tokenizer lacks the special tokens {', '.join(missing)} that the {fam.name} chat "
               "template prints; the model would see them as plain text")
    if force:
        warnings.append(message + " (published anyway: --force)")
        return
    raise UnsupportedModel(message, hint="check that the GGUF was converted from the model the chat template belongs "
                                         "to (`modelmint inspect <file.gguf>`), or pass --force")


def _builtin_names(fam: ChatFamily | None, go_template: str | None, origin: str, ollama_version: str | None,
                   header: list[str]) -> tuple[str | None, str | None, str | None]:
    """(RENDERER, PARSER, REQUIRES) for the family, with a header line saying so.

    Raises:
        ConfigError: `ollama_version` is older than they need.
    """
    renderer = fam.renderer if fam is not None and go_template is None else None
    parser = fam.parser if fam is not None and origin != "manual" else None
    if not (renderer or parser):
        return None, None, None
    requires = check_ollama_version(renderer, parser, ollama_version or required_version(renderer, parser))
    header.append((f"Ollama renders this family with its built-in RENDERER {renderer} and parses" if renderer
                   else "Ollama parses its output") + f" with its built-in PARSER {parser} (Ollama {requires} or newer).")
    return renderer, parser, requires


def _check_architecture_defaults(gguf: Path, arch: str | None, fam: ChatFamily | None, go_template: str | None,
                                 renderer: str | None, parser: str | None, force: bool, warnings: list[str],
                                 header: list[str]) -> None:
    """Refuse a TEMPLATE that Ollama would not run: for a few GGUF architectures Ollama sets a RENDERER itself when
    the Modelfile names none, and a RENDERER replaces the TEMPLATE (see ARCHITECTURE_DEFAULTS).

    Raises:
        UnsupportedModel: the Modelfile has a TEMPLATE and Ollama would render with its own RENDERER instead
            (unless `force`, which makes it a warning).
    """
    added_renderer, added_parser = ollama_fills_in(arch, renderer, parser)
    if added_renderer and go_template is not None:
        what = f"the proven {fam.name} TEMPLATE" if fam is not None and fam.build is not None else "the TEMPLATE"
        message = (f"{gguf.name} has GGUF architecture {arch}, for which Ollama sets RENDERER {added_renderer} "
                   f"itself when the Modelfile names none ({ARCHITECTURE_SOURCE}), and a RENDERER replaces the "
                   f"TEMPLATE (server/prompt.go:135-143): Ollama would render prompts with {added_renderer}, not "
                   f"with {what}, and modelmint has not proven {added_renderer} against this chat template")
        if not force:
            raise UnsupportedModel(message, hint="serve this GGUF with llama.cpp (`llama-server --jinja` runs its own "
                                                 "chat template), or pass --force to write the Modelfile anyway")
        warnings.append(message + " (published anyway: --force)")
    added = [f"{kind} {name}" for kind, name in (("RENDERER", added_renderer), ("PARSER", added_parser)) if name]
    if added:
        note = (f"Ollama adds {' and '.join(added)} itself for GGUF architecture {arch} ({ARCHITECTURE_SOURCE}); "
                "modelmint has not checked them against this chat template.")
        header.append(note)
        if not (added_renderer and go_template is not None):
            warnings.append(note)


def _forced_family(name: str, jinja: str, force: bool, warnings: list[str]) -> ChatFamily:
    """The family `name` set by hand, refused when the template is another family's or none's (unless `force`).

    Raises:
        ConfigError: the template does not match `name` and `force` is off.
        UnsupportedChatTemplate: the family's RENDERER renders this template differently and `force` is off.
    """
    fam = get_family(name)
    hits = [f.name for f in matching_families(jinja)]
    if fam.name in hits:
        if fam.renderer_mismatch and not force:  # a RENDERER checked against this Jinja and found to differ
            raise UnsupportedChatTemplate(f"the chat template is refused: {fam.renderer_mismatch}",
                                          families=sorted(FAMILIES))
        if fam.renderer_mismatch:
            warnings.append(f"{fam.renderer_mismatch} (published anyway: --force)")
        return fam
    _found, missing = fam.evidence(jinja)
    why = (f"the chat template is {hits[0]}" if hits else
           f"the chat template is not recognised as {fam.name}"
           + (f" (it lacks {', '.join(repr(m) for m in missing)})" if missing else ""))
    if not force:
        raise ConfigError(f"the chat family is set to {fam.name}, but {why}",
                          hint="leave the family out to detect it (fix chat_family in registry/catalog.yaml), or "
                               "pass --force to use it anyway; the proof result is then printed as a warning")
    warnings.append(f"{why}; using {fam.name} as forced")
    return fam


def _maybe_prove(jinja: str, go_template: str, fam: ChatFamily, tokens: TemplateTokens, settings: Settings,
                 verify: bool | None, warnings: list[str], *, force: bool = False) -> TemplateProof | None:
    from pipelines.chat.gotemplate import GORENDER
    from pipelines.core.gobuild import GoMissing, find_go

    if verify is False:
        warnings.append("TEMPLATE not proven against the chat template (verification was turned off)")
        return None
    if verify is None:
        built = GORENDER.binary_path(settings).is_file()
        try:
            built = built or bool(find_go())
        except GoMissing:
            warnings.append("TEMPLATE not proven here (no Go compiler): run `bash toolchains/setup-go.sh`")
            return None
    proof = prove_template(jinja, go_template, fam, tokens, settings)
    if not proof.holds and force:
        warnings.append(f"the {fam.name} TEMPLATE renders differently from the chat template on: "
                        f"{', '.join(proof.different) or 'every conversation'} (published anyway: --force)")
    elif not proof.holds:
        raise UnsupportedChatTemplate(
            f"the chat template looks like {fam.name}, but the {fam.name} TEMPLATE renders differently on: "
            f"{', '.join(proof.different) or 'every conversation'}",
            families=sorted(FAMILIES),
        )
    return proof


# ---------------------------------------------------------------- publish: Modelfile + model card


@dataclass(frozen=True)
class PublishedFiles:
    modelfile: Path
    model_card: Path
    build: OllamaModelfile

    @property
    def paths(self) -> list[Path]:
        return [self.modelfile, self.model_card]


def _report_of(report: VariantReport | Path | None, gguf: Path) -> GGUFReport:
    """The GGUF's report: the one given, or read from its file (`<gguf>.report.json` when None; a missing default
    file is an empty report)."""
    if isinstance(report, VariantReport):
        return GGUFReport.read_as(report)
    path = Path(report) if report is not None else gguf.with_suffix(".report.json")
    read = read_report(path)
    if read is None:
        if report is not None:
            raise ArtifactError(f"cannot read the validation report {path}")
        return GGUFReport(variant="", validation=None)
    return GGUFReport.read_as(read)


def _source_of(source: Any, report: GGUFReport) -> Path | None:
    if source is None:
        path = (report.source or {}).get("path")
        return Path(path) if path and Path(path).is_dir() else None
    return Path(getattr(source, "path", source))


def publish_ollama(
    gguf_path: Path,
    source: Any,
    report: VariantReport | Path | None,
    entry: CatalogEntry,
    out_dir: Path | None = None,
    *,
    settings: Settings,
    modelfile_name: str = "Modelfile",
    card_name: str = "README.md",
    system: str | None = None,
) -> PublishedFiles:
    """Write the Modelfile and the model card for a validated GGUF into `out_dir` (default: beside it).

    `source` is the model directory or a fetch.SourceSnapshot (None: the one the report names);
    `report` is the variant's validation report (or its JSON path; None: `<gguf>.report.json`);
    `entry` is its catalog entry. Both files are written atomically; FROM is relative to `out_dir`.

    Raises:
        everything build_modelfile raises; ArtifactError: an unreadable report.
    """
    gguf_path = Path(gguf_path)
    out_dir = Path(out_dir) if out_dir is not None else gguf_path.parent
    rep = _report_of(report, gguf_path)
    src_dir = _source_of(source, rep)
    built = build_modelfile(gguf_path, src_dir, settings=settings, out_dir=out_dir, system=system,
                            family=entry.chat_family if _family_known(entry) else None)
    modelfile_path = out_dir / modelfile_name
    card_path = out_dir / card_name
    write_text_atomic(modelfile_path, built.modelfile.to_text())
    write_text_atomic(card_path, model_card(gguf_path, built, rep, entry, settings))
    return PublishedFiles(modelfile_path, card_path, built)


def _family_known(entry: CatalogEntry) -> bool:
    name = entry.chat_family
    return bool(name) and name in FAMILIES


def _fallback_summary(preflight: Mapping[str, Any]) -> dict[str, Any]:
    """The share of weights llama-quantize stored in another type (rows its blocks do not divide): predicted
    before the build, and read back from the output."""
    observed = preflight.get("observed") or {}
    return {"block": preflight.get("block"), "predicted_share": preflight.get("share"),
            "observed_share": observed.get("share"), "fallback_tensors": preflight.get("fallback_tensors")}


def model_card(gguf: Path, built: OllamaModelfile, report: GGUFReport, entry: CatalogEntry, settings: Settings) -> str:
    """README.md with Hugging Face front matter (base_model, quantization, license, validation figures)."""
    import yaml

    source = report.source or {}
    hub = entry.source if isinstance(entry.source, HubSource) else None
    repo = source.get("repo") or (hub.repo if hub else None)
    revision = source.get("revision") or (hub.revision if hub else None)
    qtype = (report.variant or (report.gguf or {}).get("file_type") or "").lower() or None
    name = entry.name or gguf.stem
    licence = entry.license
    sha = report.sha256 or hash_cache(settings).sha256(gguf)
    shards = [(p.name, p.stat().st_size) for p in gguf_shards(gguf)]
    validation = card_validation(report)
    front = card_front(repo, licence, "gguf")
    front.update({
        "pipeline_tag": "text-generation",
        "tags": [t for t in ("gguf", "ollama", "modelmint", qtype) if t],
        "quantization": qtype,
        "model_name": name,
        "validation": validation,
        "modelmint": _card_provenance(gguf, built, report, sha=sha, repo=repo, revision=revision, shards=shards),
    })
    head = yaml.safe_dump(front, sort_keys=False, allow_unicode=True, width=100)
    rows = "\n".join(f"| {k} | {v} |" for k, v in validation.items() if not isinstance(v, dict | list))
    proof_line = _template_line(built)
    return f"""---
{head}---

# {name} {qtype or ''} (GGUF)

{f'Quantized from [{repo}](https://huggingface.co/{repo}) at commit `{revision}` ' if repo else ''}by modelmint {__version__}.
{weights_line(shards, "GGUF")}{f" llama.cpp reads them all from the first, `{gguf.name}`." if len(shards) > 1 else ""}
{origin_lines(source.get("origin"))}
## Use with Ollama

```sh
ollama create {name}:{qtype or 'latest'} -f Modelfile
ollama run {name}:{qtype or 'latest'}
```

The Modelfile sets the chat template of the `{built.family or 'hand-written'}` family, the stop tokens
{', '.join(f'`{s}`' for s in built.stops)} and a context of {built.num_ctx} tokens. {proof_line}

{_notes(built)}## Use with llama.cpp

```sh
llama-server -m {gguf.name} --jinja -c {built.num_ctx}
```

## Validation against the 16-bit model

{data_lines(report)}

| figure | value |
| --- | --- |
{rows}
{answer_lines(report)}"""


def _card_provenance(gguf: Path, built: OllamaModelfile, report: GGUFReport, *, sha: str, repo: str | None,
                     revision: str | None, shards: list[tuple[str, int]]) -> dict[str, Any]:
    """The card's `modelmint` front-matter block: the file (size_bytes: its own; weights_bytes: every shard of
    its split, when it is one), its source and toolchain, the chat template and its proof, how Ollama serves it."""
    source = report.source or {}
    return {
        "version": __version__,
        "file": gguf.name,
        "sha256": sha,
        "size_bytes": gguf.stat().st_size,
        "weights_bytes": sum(size for _, size in shards),
        **({"shards": [name for name, _ in shards]} if len(shards) > 1 else {}),
        "source": {k: v for k, v in (("repo", repo), ("revision", revision), ("kind", source.get("kind")),
                                     ("origin", source.get("origin"))) if v},
        "toolchain": report.toolchain or {},
        "calibration": report.calibration,
        "evaluation": report.evaluation,
        "chat_family": built.family,
        "template_origin": built.template_origin,
        "template_proof": asdict(built.proof) if built.proof else None,
        "ollama": {
            "tools": "tools" in built.reading.vars,
            "tool_call_tag": built.reading.tool_tag,
            "thinking_tags": list(built.reading.thinking_tags),
        } if built.reading else None,
        **({"ollama_builtin": {"renderer": built.modelfile.renderer, "parser": built.modelfile.parser,
                               "requires": built.modelfile.requires}}
           if built.modelfile.renderer or built.modelfile.parser else {}),
        "stop": list(built.stops),
        "num_ctx": built.num_ctx,
        **({"block_fallback": _fallback_summary(report.preflight)} if report.preflight else {}),
    }


def _template_line(built: OllamaModelfile) -> str:
    """The card's sentence on how Ollama renders the prompt: the proof, or the built-in RENDERER/PARSER."""
    proof, mf = built.proof, built.modelfile
    if mf.renderer:
        line = (f"Ollama renders it with its built-in RENDERER `{mf.renderer}` (not proven by modelmint), so the "
                f"Modelfile needs Ollama {mf.requires} or newer.")
    elif proof:
        line = (f"Its TEMPLATE renders byte-identical prompts to the source chat template on {len(proof.identical)} "
                f"of {proof.conversations} conversations"
                + (f" (the source template refuses {', '.join(proof.refused_by_jinja)})" if proof.refused_by_jinja
                   else "") + ".")
    else:
        line = "Its TEMPLATE was not proven on this machine (no Go compiler)."
    if mf.parser:
        line += f" Ollama's built-in PARSER `{mf.parser}` returns its thinking and structured tool calls."
    return line


def _notes(built: OllamaModelfile) -> str:
    if not built.notes:
        return ""
    items = "\n".join(f"- {n}" for n in built.notes)
    return f"Where Ollama's TEMPLATE cannot follow the chat template exactly:\n\n{items}\n\n"


# ---------------------------------------------------------------- Ollama itself

_TAG = re.compile(r"^(?:[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*(?::[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?$")


def ollama_commands(modelfile_path: Path, tag: str) -> list[list[str]]:
    """The commands that create `tag` from the Modelfile and check that it answers (one line).

    Raises:
        TypeError: arguments swapped (the Modelfile path comes first).
        ConfigError: `tag` is not a valid Ollama model name.
    """
    if isinstance(tag, Path) or not isinstance(tag, str):
        raise TypeError("ollama_commands(modelfile_path, tag): the tag must be a str like 'qwen2.5:q4_k_m'")
    if not _TAG.match(tag):
        raise ConfigError(f"{tag!r} is not an Ollama model name",
                          hint="use lower-case name[:tag], e.g. qwen2.5:q4_k_m")
    return [
        ["ollama", "create", tag, "-f", str(modelfile_path)],
        ["ollama", "run", tag, RUN_CHECK_PROMPT],
    ]


@dataclass(frozen=True)
class OllamaInstall:
    commands: list[list[str]]
    ran: bool
    """False when `ollama` is not on PATH: print `commands` for the user instead."""
    reply: str | None = None


def install_into_ollama(modelfile_path: Path, tag: str, *, timeout: float = 900) -> OllamaInstall:
    """Run `ollama create` and a one-line `ollama run` check when `ollama` is on PATH.

    Raises:
        ToolError: a command failed (is `ollama serve` running?).
        ArtifactError: the model answered nothing.
    """
    commands = ollama_commands(modelfile_path, tag)
    if shutil.which("ollama") is None:
        return OllamaInstall(commands, ran=False)
    hint = "is the Ollama server running? (`ollama serve`)"
    run(commands[0], cwd=Path(modelfile_path).parent, timeout=timeout, hint=hint)
    reply = run(commands[1], cwd=Path(modelfile_path).parent, timeout=timeout, hint=hint).stdout.strip()
    if not reply:
        raise ArtifactError(f"`ollama run {tag}` answered nothing", hint="check the Modelfile's TEMPLATE and stop")
    return OllamaInstall(commands, ran=True, reply=reply)


# ---------------------------------------------------------------- a bare chat template, no model


@dataclass(frozen=True)
class TemplateConversion:
    """What `modelmint template` prints: the family, the Modelfile lines, the proof and the notes."""

    family: ChatFamily
    lines: str
    """TEMPLATE (and RENDERER/PARSER/REQUIRES lines where they apply), as Modelfile text."""
    proof: TemplateProof | None
    warnings: tuple[str, ...]


def convert_template(jinja: str, tokens: TemplateTokens, settings: Settings, *, family: str | None = None,
                     force: bool = False) -> TemplateConversion:
    """Convert a bare Jinja chat template to Ollama's Modelfile lines, proving the TEMPLATE on the suite.

    Raises:
        UnsupportedChatTemplate: no family recognises it (the message names the nearest), or its TEMPLATE
            renders differently (without `force`).
        ConfigError: `family` does not match it (without `force`).
        GoMissing, ToolError: the Go renderer cannot be built or run.
    """
    warnings: list[str] = []
    fam = detect_family(jinja) if family is None else _forced_family(family, jinja, force, warnings)
    proof = None
    if fam.build is not None:
        go_template = fam.template(jinja, tokens)
        proof = _maybe_prove(jinja, go_template, fam, tokens, settings, True, warnings, force=force)
        mf = Modelfile(from_="x", template=go_template, parser=fam.parser,
                       requires=required_version(None, fam.parser) if fam.parser else None)
    else:
        mf = Modelfile(from_="x", renderer=fam.renderer, parser=fam.parser,
                       requires=required_version(fam.renderer, fam.parser))
    lines = mf.to_text().split("\n", 1)[1]  # drop the placeholder FROM line
    return TemplateConversion(fam, lines, proof, tuple(warnings))
