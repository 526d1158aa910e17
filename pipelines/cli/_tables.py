"""Cells more than one command shows the same way: a variant's figures, a publication."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipelines.core.report import Figures


def figure_cells(f: Figures | None) -> tuple[str, str, str]:
    """Mean KL, same top % and ΔPPL % as every table of figures shows them ("-" where nothing was measured)."""
    if f is None:
        return "-", "-", "-"
    return f"{f.mean_kl:.5f}", f"{f.same_top_pct:.2f}", f"{f.dppl_pct:+.2f}"


def publication(entry: dict[str, Any]) -> str:
    """One place an artifact is published: its image, the pinned tag beside it and the image's digest."""
    tags = [t for t in entry.get("tags") or [] if t != entry["image"].rpartition(":")[2]]
    digest = str(entry.get("digest", "")).removeprefix("sha256:")[:12]
    return entry["image"] + "".join(f" +:{t}" for t in tags) + (f" ({digest})" if digest else "")
