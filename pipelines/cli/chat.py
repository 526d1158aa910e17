"""Chat templates for Ollama: `modelfile` (a GGUF's Modelfile, its TEMPLATE proven) and `template` (a bare one)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pipelines.cli._app import app, err, escape, load_settings
from pipelines.core.errors import ConfigError

if TYPE_CHECKING:
    from pipelines.publish.ollama import TemplateProof


@app.command()
def modelfile(
    gguf: Annotated[Path, typer.Argument(help="the .gguf the Modelfile is for")],
    source: Annotated[
        Path | None,
        typer.Option(
            help="its Hugging Face model directory (chat template, tokenizer, generation_config.json)"
        ),
    ] = None,
    template: Annotated[
        Path | None, typer.Option(help="a hand-written Ollama TEMPLATE file to use as is")
    ] = None,
    family: Annotated[str | None, typer.Option(help="chat family instead of detecting it")] = None,
    system: Annotated[str | None, typer.Option(help="a default SYSTEM prompt")] = None,
    num_ctx: Annotated[
        int | None,
        typer.Option(help="context length for Ollama (default: 8192 or the model's, whichever is smaller)"),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--out", help="write the Modelfile here instead of printing it")
    ] = None,
    verify: Annotated[
        bool, typer.Option(help="prove the TEMPLATE against the chat template (needs Go)")
    ] = True,
    force: Annotated[
        bool,
        typer.Option(
            help="use --family even where the template does not match it; a failed proof becomes a warning"
        ),
    ] = False,
    ollama_version: Annotated[
        str | None,
        typer.Option(
            help="the oldest Ollama release the Modelfile must "
            "work with (refused when its RENDERER needs newer)"
        ),
    ] = None,
    explain: Annotated[
        bool,
        typer.Option(
            help="print on standard error the family, the evidence, the proof per conversation and the notes"
        ),
    ] = False,
) -> None:
    """Write an Ollama Modelfile for a GGUF: FROM it, a TEMPLATE proven against its chat template, stops."""
    from pipelines.core.fsutil import write_text_atomic
    from pipelines.publish.ollama import build_modelfile

    if template is not None and not template.is_file():
        raise ConfigError(
            f"--template {template}: no such file",
            hint="pass an Ollama TEMPLATE file, or leave --template out to derive one: "
            f"modelmint modelfile {gguf}",
        )
    if source is not None and not source.is_dir():
        raise ConfigError(
            f"--source {source}: no such directory",
            hint=f"pass the model's Hugging Face directory (holding tokenizer_config.json): "
            f"modelmint modelfile {gguf} --source DIR",
        )
    built = build_modelfile(
        gguf,
        source,
        settings=load_settings(),
        out_dir=(output.parent if output else Path.cwd()),
        family=family,
        template=template.read_text(encoding="utf-8") if template else None,
        system=system,
        num_ctx=num_ctx,
        verify=None if verify else False,
        force=force,
        ollama_version=ollama_version,
    )
    if explain:
        _explain(built.family, built.evidence, built.proof, built.notes, built.warnings)
    text = built.modelfile.to_text()  # warnings were logged by build_modelfile
    if output is None:
        sys.stdout.write(text)
        return
    try:
        write_text_atomic(output, text)
    except OSError as e:  # a folder of that name, a file where its folder goes (a full disk is DiskFullError)
        raise ConfigError(
            f"--out {output}: cannot write it ({e.strerror or e})",
            hint=f"give --out a file path in a folder you can write: modelmint modelfile {gguf} --out DIR/Modelfile",
        ) from e
    proof = built.proof
    err.print(
        f"wrote {output} (family {built.family or 'hand-written'}"
        + (f", TEMPLATE proven on {len(proof.identical)} conversations" if proof else "")
        + ")"
    )


def _explain(
    family: str | None,
    evidence: tuple[str, ...],
    proof: TemplateProof | None,
    notes: tuple[str, ...],
    warnings: tuple[str, ...],
) -> None:
    from pipelines.chat.families import FAMILIES

    def _say(text: str) -> None:
        err.print(escape(text), highlight=False)

    fam = FAMILIES.get(family or "")
    _say(f"family: {family or 'hand-written TEMPLATE'}" + (f" ({fam.title})" if fam else ""))
    if fam and fam.renderer:
        _say(f"Ollama gets: RENDERER {fam.renderer}, PARSER {fam.parser}")
    if fam:
        _say(f"tool calls: {fam.tool_calls}")
    _say("evidence: " + (", ".join(repr(m) for m in evidence) or "none (family given by hand)"))
    if proof is not None:
        for name in proof.identical:
            _say(f"  proof {name}: byte-identical")
        for name in proof.refused_by_jinja:
            _say(f"  proof {name}: the chat template itself refuses it")
        for name in proof.different:
            _say(f"  proof {name}: DIFFERENT")
    else:
        _say(
            "proof: none ("
            + ("Ollama's RENDERER is not proven here" if fam and fam.renderer else "not run")
            + ")"
        )
    for line in (*(f"note: {n}" for n in notes), *(f"warning: {w}" for w in warnings)):
        _say(line)


@app.command("template")
def template_cmd(
    chat_template: Annotated[Path, typer.Argument(help="a Hugging Face chat template (.jinja)")],
    bos: Annotated[str | None, typer.Option(help="the tokenizer's BOS token text")] = None,
    eos: Annotated[str | None, typer.Option(help="the tokenizer's EOS token text")] = None,
    engine_bos: Annotated[
        bool,
        typer.Option(
            "--engine-bos/--no-engine-bos", help="whether the engine adds BOS itself (GGUF add_bos_token)"
        ),
    ] = True,
    family: Annotated[str | None, typer.Option(help="chat family instead of detecting it")] = None,
    force: Annotated[
        bool, typer.Option(help="use --family even where the template does not match it")
    ] = False,
) -> None:
    """Convert a bare chat template to Ollama's TEMPLATE (or RENDERER/PARSER) lines, proven on the suite."""
    from pipelines.chat.families import TemplateTokens
    from pipelines.publish.ollama import convert_template

    try:
        jinja = chat_template.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(
            f"cannot read {chat_template}: {e.strerror}", hint="pass the path of a .jinja file"
        ) from e
    done = convert_template(
        jinja,
        TemplateTokens(bos, eos, engine_adds_bos=engine_bos),
        load_settings(),
        family=family,
        force=force,
    )
    sys.stdout.write(done.lines)
    fam = done.family
    _explain(fam.name, tuple(fam.evidence(jinja)[0]), done.proof, fam.notes, done.warnings)
