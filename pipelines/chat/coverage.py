"""Which chat templates of the pinned llama.cpp tree modelmint publishes for Ollama, and why it refuses the rest."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from pipelines import PACKAGE
from pipelines.chat.families import FAMILIES, matching_families, nearest_family, refusal_reason
from pipelines.chat.proof import SUITE
from pipelines.chat.renderers import PARSERS, RENDERERS, SOURCE, SOURCE_TAG, required_version
from pipelines.core.settings import Settings

DOC = PACKAGE.parent / "docs" / "ollama-families.md"

_TEMPLATE_PROOF = "Go TEMPLATE run by Go's text/template against the Jinja on the suite (tests/test_ollama_templates.py)"
_RENDERER_PROOF = (f"RENDERER reimplemented from Ollama {SOURCE_TAG}'s source, checked on Ollama's own test vectors, "
                   "against the Jinja on the suite (tests/test_ollama_renderers.py)")


@dataclass(frozen=True)
class Coverage:
    """One template: the family that claims it, how Ollama gets it right, or why modelmint refuses it."""

    template: str
    family: str | None
    kind: str
    """'proven' (Go TEMPLATE proven on the suite), 'renderer' (Ollama's built-in RENDERER) or 'refused'."""
    reason: str
    """The evidence for a recognised template; the cause and the nearest family for a refusal."""
    proof: str = "—"
    """How the rendering Ollama gets was checked against the Jinja."""
    differs: tuple[str, ...] = ()
    """The suite's conversations on which Ollama's rendering differs from the Jinja (a refused RENDERER mapping)."""

    @property
    def covered(self) -> bool:
        return self.kind != "refused"


def classify(name: str, jinja: str) -> Coverage:
    """How modelmint treats one Jinja chat template."""
    hits = matching_families(jinja)
    escape = "publish with `modelmint modelfile MODEL.gguf --template FILE` (a hand-written TEMPLATE)"
    if len(hits) == 1:
        fam = hits[0]
        found, _missing = fam.evidence(jinja)
        evidence = ", ".join(repr(m) for m in found) or "its detector"
        if fam.renderer_mismatch:
            return Coverage(name, fam.name, "refused", f"{fam.renderer_mismatch}; {escape}",
                            proof=_RENDERER_PROOF, differs=fam.renderer_differs or ())
        if fam.renderer:
            evidence += f"; RENDERER {fam.renderer}, PARSER {fam.parser}, REQUIRES {required_version(fam.renderer, fam.parser)}"
            proof = (f"{_RENDERER_PROOF}: byte-identical on all {len(SUITE)} conversations"
                     if fam.renderer_differs == () else "not proven: Ollama's RENDERER is not reimplemented yet")
            return Coverage(name, fam.name, fam.kind, evidence, proof=proof)
        return Coverage(name, fam.name, fam.kind, evidence,
                        proof=_TEMPLATE_PROOF + (f"; {fam.proof_note}" if fam.proof_note else ""))
    near = nearest_family(jinja)
    return Coverage(name, near[0].name if near else None, "refused", f"{refusal_reason(jinja)}; {escape}")


def survey(templates_dir: Path) -> list[Coverage]:
    """Every `*.jinja` in `templates_dir`, classified, in file-name order."""
    return [classify(p.name, p.read_text(encoding="utf-8")) for p in sorted(templates_dir.glob("*.jinja"))]


def _cell(text: str) -> str:
    """Text for a Markdown table cell: pipes and angle brackets escaped (<tool_call> would read as HTML)."""
    return text.replace("|", "\\|").replace("<", "\\<").replace("\n", " ")


def _families_table() -> list[str]:
    lines = ["| family | Ollama gets | tool calls | title |", "| --- | --- | --- | --- |"]
    for fam in FAMILIES.values():
        how = (f"RENDERER {fam.renderer} + PARSER {fam.parser} (REQUIRES {required_version(fam.renderer, fam.parser)})"
               if fam.renderer else "proven TEMPLATE")
        if fam.renderer_mismatch:
            n = len(fam.renderer_differs or ())
            how = f"refused: RENDERER {fam.renderer} differs from the Jinja on {n} conversation{'s' if n != 1 else ''}"
        lines.append(f"| {fam.name} | {how} | {_cell(fam.tool_calls)} | {_cell(fam.title)} |")
    return lines


def _names_table() -> list[str]:
    lines = ["| name | RENDERER since | PARSER since |", "| --- | --- | --- |"]
    for name in sorted(set(RENDERERS) | set(PARSERS)):
        lines.append(f"| {name} | {RENDERERS.get(name, '—')} | {PARSERS.get(name, '—')} |")
    return lines


def render_doc(rows: list[Coverage], tree: str) -> str:
    """docs/ollama-families.md: the families, Ollama's built-in names and the per-template survey."""
    covered = sum(r.covered for r in rows)
    proven = sum(r.kind == "proven" for r in rows)
    rendered = covered - proven
    rendered_proven = sum(r.kind == "renderer" and "byte-identical" in r.proof for r in rows)
    suite = f"proven byte-identical on its conversation suite ({len(SUITE)} conversations)"
    if rendered == 0:
        how = f"every one with a Go TEMPLATE {suite}; none relies on Ollama's built-in RENDERER and PARSER"
    else:
        how = (f"{proven} with a Go TEMPLATE {suite}, {rendered} with Ollama's built-in RENDERER and PARSER "
               f"({rendered_proven} of them proven)")
    out = [
        "# Ollama chat families and template coverage",
        "",
        "Generated by `python -m pipelines.chat.coverage --write`; tests/test_ollama_coverage.py fails when it "
        "is out of date.",
        "",
        f"Of the {len(rows)} chat templates in {tree}, modelmint publishes {covered}: {how}. A RENDERER mapping "
        "that renders other bytes than the template's Jinja is refused, with the conversations that differ (the Jinja is given the tools in the key order Ollama's API holds them in, which "
        "no client can change). Every other template is refused with the nearest family and what differs from it.",
        "",
        "## Families",
        "",
        "The tool calls column says how Ollama returns a model's tool calls, checked end to end: what the "
        "template's Jinja writes for an assistant message holding tool calls (the model's own format) is parsed "
        "by a reimplementation of the family's PARSER, or of Ollama's tool parsing for a TEMPLATE (the tag it "
        "derives from the TEMPLATE), from the pinned Ollama source, and must give back the calls the conversation "
        "held (tests/test_ollama_parsers.py). A family whose Jinja writes nothing for tool calls, so that no call "
        "is recovered, is marked `refused for tool use` with the reason; `none structured` means the format is "
        "known but Ollama returns no tool_calls for it.",
        "",
        *_families_table(),
        "",
        "## Ollama's built-in renderers and parsers",
        "",
        f"Source: {SOURCE}.",
        "",
        "A Modelfile that names a RENDERER or PARSER carries `REQUIRES` with the oldest release that knows both. "
        "Ollama before 0.12.0 refuses such a Modelfile at `ollama create` (RENDERER and PARSER are unknown "
        "commands), and before 0.14.0 it refuses REQUIRES the same way; nothing is silently ignored. A release "
        "that knows the commands but not the name accepts the Modelfile and fails at chat time with "
        "`unknown renderer`, while an unknown PARSER name is ignored (no structured parsing); REQUIRES is "
        "recorded and shown by `ollama show`, not enforced (as of v0.32.15). `modelmint modelfile "
        "--ollama-version X` refuses a target older than the names need. Ollama v0.33.0-rc2 sets a RENDERER and "
        "PARSER itself, for whichever of the two a Modelfile leaves out, for GGUF architectures gemma4, laguna "
        "and nemotron_h/nemotron_h_moe/nemotron_h_omni (server/create.go:795-817; for gemma4 it then chooses "
        "gemma4-small or gemma4-large by model name and parameter count, server/renderer_resolution.go), and a "
        "RENDERER replaces the TEMPLATE (server/prompt.go:135-143); no Modelfile command switches it off. So a "
        "TEMPLATE, proven or hand-written, is refused for a GGUF of those architectures (`--force` publishes it "
        "with a warning: Ollama will not run it), and a PARSER Ollama adds is named in the Modelfile's header.",
        "",
        *_names_table(),
        "",
        "## Templates",
        "",
        "| template | family | Ollama gets | proven how | conversations that differ | evidence or reason |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        out.append(f"| {r.template} | {r.family or '—'} | {r.kind} | {_cell(r.proof)} | "
                   f"{', '.join(r.differs) or '—'} | {_cell(r.reason)} |")
    return "\n".join(out) + "\n"


def templates_tree(settings: Settings) -> tuple[Path, str]:
    """The pinned llama.cpp tree's chat templates folder, and how the survey names it.

    Raises:
        ToolchainMissing: the llama.cpp toolchain is not built.
    """
    from pipelines.core.toolchains import llama_cpp

    tc = llama_cpp(settings)
    return tc.source / "models" / "templates", f"llama.cpp {tc.commit} (models/templates)"


def main(argv: list[str] | None = None, *, settings: Settings) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="write docs/ollama-families.md instead of printing it")
    args = parser.parse_args(argv)
    folder, label = templates_tree(settings)
    text = render_doc(survey(folder), label)
    if args.write:
        DOC.write_text(text, encoding="utf-8")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(settings=Settings.from_env()))
