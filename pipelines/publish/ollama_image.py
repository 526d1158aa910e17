"""An Ollama image of a GGUF and its Modelfile: the layers and config blob `ollama create` writes, for `ollama pull`.

Read from Ollama's source (ollama/ollama v0.33.0-rc2, commit fb30760; server/create.go, manifest/manifest.go,
types/model/config.go, api/types.go FormatParams, fs/ggml/type.go): a Docker v2 schema 2 manifest whose layers are
the GGUF (`…image.model`), then the TEMPLATE, SYSTEM, each LICENSE and the PARAMETERs as the JSON of their typed
values, and whose config blob is the model's ConfigV2 (format, family, parameter size, quantization level), both
JSON blobs encoded as Go's encoding/json encodes them. tests/data/ollama_image_format.json holds that format.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pipelines.chat.modelfile import PARAMETER_TYPES, Modelfile
from pipelines.core.errors import ArtifactError
from pipelines.publish.oci import DOCKER_MANIFEST, Blob, Image

MODEL = "application/vnd.ollama.image.model"
TEMPLATE = "application/vnd.ollama.image.template"
SYSTEM = "application/vnd.ollama.image.system"
PARAMS = "application/vnd.ollama.image.params"
MESSAGES = "application/vnd.ollama.image.messages"
LICENSE = "application/vnd.ollama.image.license"
CONFIG = "application/vnd.docker.container.image.v1+json"


def ollama_image(gguf: Path, sha256: str, modelfile: Path, *, extra: tuple[Blob, ...] = ()) -> Image:
    """The image of `gguf` (its sha256 as registered) served with `modelfile`; `extra` layers go last (Ollama
    ignores media types it does not know).

    Raises:
        ArtifactError: the Modelfile's FROM is not `gguf`, or `gguf` is not a readable GGUF.
        ModelfileError: the Modelfile does not parse.
    """
    from pipelines.core.ggufheader import inspect_gguf

    mf = Modelfile.parse(modelfile.read_text(encoding="utf-8"))
    if (modelfile.parent / mf.from_).resolve() != gguf.resolve():
        raise ArtifactError(f"{modelfile} says FROM {mf.from_}, which is not the artifact's GGUF {gguf.name}",
                            hint="the Modelfile was edited or belongs to another artifact: register the variant "
                            "again (`modelmint convert NAME --variants TAG --register`) to write it anew")
    info = inspect_gguf(gguf)
    layers = [Blob.of_file(MODEL, gguf, sha256, gguf.stat().st_size)]
    if mf.template:
        layers.append(Blob.of_bytes(TEMPLATE, mf.template.encode()))
    if mf.system:
        layers.append(Blob.of_bytes(SYSTEM, mf.system.encode()))
    layers += [Blob.of_bytes(LICENSE, text.encode()) for text in mf.licenses if text]
    params = params_json(mf)
    if params is not None:
        layers.append(Blob.of_bytes(PARAMS, params))
    if mf.messages:
        layers.append(Blob.of_bytes(MESSAGES, go_json([{"role": m.role, "content": m.content}
                                                       for m in mf.messages]).encode() + b"\n"))
    return Image(DOCKER_MANIFEST, Blob.of_bytes(CONFIG, config_json(info, mf)), (*layers, *extra))


def params_json(mf: Modelfile) -> bytes | None:
    """The params blob: each PARAMETER typed as Ollama's Options field (stop a list, floats float32), keys sorted
    (a Go map), None when there are none."""
    params: dict[str, Any] = {}
    for p in mf.parameters:
        if PARAMETER_TYPES[p.name] is str:  # stop: Ollama's only string option, a []string
            params.setdefault(p.name, []).append(p.value)
        elif PARAMETER_TYPES[p.name] is float:
            params[p.name] = _Float32(float(p.value))
        else:
            params[p.name] = p.value
    return (go_json(dict(sorted(params.items()))) + "\n").encode() if params else None


def config_json(info: Any, mf: Modelfile | None = None) -> bytes:
    """ConfigV2 as `ollama create` writes it for a GGUF: its fields in the struct's order, empty ones left out.

    RENDERER, PARSER and REQUIRES of the Modelfile live here, not in layers (ollama types/model/config.go): an image
    of a family Ollama renders in Go code carries them, or `ollama pull` would give it no chat format at all."""
    config = {
        "model_format": "gguf",
        "model_family": info.architecture,
        "model_families": [info.architecture],
        "model_type": human_number(info.parameter_count),
        "file_type": ollama_file_type(info.file_type),
        **{k: v for k, v in (("renderer", mf and mf.renderer), ("parser", mf and mf.parser),
                             ("requires", mf and mf.requires)) if v},
        "architecture": "amd64",
        "os": "linux",
    }
    return (go_json(config) + "\n").encode()


def ollama_file_type(file_type: str | None) -> str:
    """llama.cpp's file type name as Ollama shows it (Q4_K_M, F16); "unknown" when the GGUF names none, and for
    ALL_F32: Ollama's KV.FileType (fs/ggml/ggml.go) takes only a general.file_type > 0, and F32 is 0."""
    return file_type.removeprefix("ALL_") if file_type and file_type != "ALL_F32" else "unknown"


def human_number(n: int) -> str:
    """A parameter count as Ollama's format.HumanNumber prints it: 494.03M, 1.5B, 7B, 135K."""
    for scale, suffix, decimals in ((1_000_000_000, "B", 1), (1_000_000, "M", 2)):
        if n >= scale:
            x = n / scale
            return f"{x:.0f}{suffix}" if x == math.floor(x) else f"{x:.{decimals}f}{suffix}"
    return f"{n / 1000:.0f}K" if n >= 1000 else str(n)


# ---------------------------------------------------------------- Go's encoding/json


class _Float32(float):
    """A value Go holds as float32 (its JSON has float32's shortest digits: 0.7, not 0.699999988079071)."""


_HTML = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def go_json(value: Any) -> str:
    """`value` as Go's json.Marshal writes it: compact, <, > and & escaped, floats in Go's shortest form."""
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
        for ch, esc in _HTML.items():
            text = text.replace(ch, esc)
        return text
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_float(value, 32 if isinstance(value, _Float32) else 64)
    if isinstance(value, dict):
        return "{" + ",".join(f"{go_json(str(k))}:{go_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(go_json(v) for v in value) + "]"
    raise TypeError(f"no JSON for {type(value).__name__}")


def _go_float(x: float, bits: int) -> str:
    """encoding/json's floatEncoder: shortest digits for the width, exponent form below 1e-6 and from 1e21."""
    import numpy as np  # only a publish writes floats; numpy is ~0.2 s of every CLI start otherwise
    v = np.float32(x) if bits == 32 else np.float64(x)
    if not np.isfinite(v):
        raise ValueError(f"{x} has no JSON form")
    a = abs(float(v))
    if a != 0 and (a < 1e-6 or a >= 1e21):
        text = np.format_float_scientific(v, unique=True, trim="-")
        mantissa, _, exp = text.partition("e")
        sign, digits = exp[0], exp[1:].lstrip("0") or "0"
        return f"{mantissa}e{sign}{digits.zfill(2) if sign == '+' else digits}"
    return np.format_float_positional(v, unique=True, trim="-")
