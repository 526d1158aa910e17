"""The registry site in a real browser: Debian's chromium, headless, loads every page from file:// URLs.

Checked in the rendered DOM: every variant row, every chart drawn with each of its data points on screen, no console
error, and no request but the page's own file. Screenshots are kept in build/test-artifacts/site/ (one PNG per page).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from browser import CHROMIUM, Chromium
from site_registry import SiteRegistry
from test_site import early_passes

from pipelines.core.settings import project_root
from pipelines.site.build import build_site
from pipelines.site.render import ModelPage, model_page, page_name
from pipelines.store.history import history
from pipelines.store.manifest import list_manifests

SHOTS = project_root() / "build" / "test-artifacts" / "site"

# What each page looks like once drawn: its variant rows, and per chart every point with its data and whether the
# browser laid it out inside its chart (a point at NaN or off the chart has no box there).
PROBE = """(() => {
  const inside = (el, svg) => { const r = el.getBoundingClientRect(), s = svg.getBoundingClientRect();
    return r.width > 0 && r.left >= s.left - 1 && r.right <= s.right + 1 && r.top >= s.top - 1
      && r.bottom <= s.bottom + 1; };
  return {
    title: document.title,
    rows: [...document.querySelectorAll('table.variants tbody tr')].map(r => r.dataset.ref),
    charts: Object.fromEntries([...document.querySelectorAll('svg.chart')].map(svg => [svg.id, {
      width: svg.getBoundingClientRect().width,
      labelled: (svg.getAttribute('aria-labelledby') || '').split(' ').every(id => document.getElementById(id)),
      points: [...svg.querySelectorAll('circle.point')].map(c => ({ref: c.dataset.ref, kl: Number(c.dataset.kl),
        pareto: c.classList.contains('pareto'), drawn: inside(c, svg)}))}])),
    bars: document.querySelectorAll('svg.bar rect.mem').length,
    tables: document.querySelectorAll('table').length,
    links: [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href')),
  };
})()"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Chromium:
    if shutil.which(CHROMIUM) is None:
        pytest.fail(
            f"{CHROMIUM} is not installed: run `bash toolchains/setup-chromium.sh` (scripts/test.sh does)"
        )
    with Chromium(tmp_path_factory.mktemp("chromium")) as c:
        yield c


def test_every_page_renders_offline_with_every_row_and_point(
    site_registry: SiteRegistry, browser: Chromium, tmp_path: Path
) -> None:
    s = site_registry.settings
    out = tmp_path / "site"
    built = build_site(s, out)
    manifests = list_manifests(s).manifests
    SHOTS.mkdir(parents=True, exist_ok=True)
    seen = {}
    for page in built.pages:
        rel = page.relative_to(out).as_posix()
        loaded = browser.load(page.as_uri(), probe=PROBE, screenshot=SHOTS / (rel.replace("/", "-") + ".png"))
        assert loaded.console_errors == [], (rel, loaded.console_errors)
        assert loaded.requests == [page.as_uri()], (rel, loaded.requests)  # nothing but the page itself
        assert loaded.screenshot is not None and loaded.screenshot.stat().st_size > 10_000
        for link in loaded.dom["links"]:  # every link stays inside the site
            assert (
                not link.startswith(("http:", "https:", "//")) and (page.parent / link).resolve().is_file()
            ), link
        seen[rel] = loaded.dom
    assert sorted(seen) == ["charts.html", "index.html", "models/smollm2.html", "models/tiny-qwen2.html"]
    for name in ("smollm2", "tiny-qwen2"):
        dom = seen[f"models/{page_name(name)}"]
        refs = sorted(m.ref for m in manifests if m.name == name)
        assert sorted(dom["rows"]) == refs
        assert set(dom["charts"]) == {"quality", "versions"}
        for chart in dom["charts"].values():
            assert chart["width"] > 300 and chart["labelled"]
            assert all(p["drawn"] for p in chart["points"]), chart["points"]
        quality = dom["charts"]["quality"]["points"]
        by_ref = {m.ref: m for m in manifests}
        assert sorted(p["ref"] for p in quality) == refs
        for p in quality:
            figures = by_ref[p["ref"]].validation.figures
            assert figures is not None and p["kl"] == pytest.approx(figures.mean_kl, rel=1e-5)
        versions = sum(len(history(s, r)) for r in refs)
        assert len(dom["charts"]["versions"]["points"]) == versions
        assert dom["bars"] > 0 and dom["tables"] >= 5  # a table behind each chart, plans, provenance
        # a GGUF's bar is one server's GPU memory as llama.cpp's plan recorded it: its offloaded weights and KV cache
        html = (out / "models" / page_name(name)).read_text()
        gguf = [g for m in manifests if m.name == name and m.serving
                for inv in m.serving.inventories for g in inv.gguf or []]
        assert gguf and all(g.weights_gpu for g in gguf)
        for g in gguf:
            assert f'data-bytes="{g.weights_gpu}"' in html and f'data-bytes="{g.kv_gpu}"' in html, g
    # the top of SmolLM2's page as the README shows it (docs/images/site-smollm2.png is a copy of one looked at)
    browser.load(
        (out / "models" / "smollm2.html").as_uri(),
        probe="1",
        screenshot=SHOTS / "smollm2-top.png",
        height=1500,
    )
    smol = seen["models/smollm2.html"]
    assert sorted(p["ref"] for p in smol["charts"]["quality"]["points"] if p["pareto"]) == [
        "smollm2:awq",
        "smollm2:q6_k",
        "smollm2:q8_0",
    ]
    assert len(smol["charts"]["versions"]["points"]) == 6  # five variants, q4_k_m twice


def test_the_browser_check_sees_a_request_leaving_and_a_console_error(
    browser: Chromium, tmp_path: Path
) -> None:
    """The check can fail: a page that loads an image from the network and logs an error is caught on both."""
    page = tmp_path / "leaky.html"
    page.write_text(
        '<!DOCTYPE html><html><body><img src="http://example.invalid/x.png" alt="x">'
        '<script>console.error("broken chart")</script></body></html>'
    )
    loaded = browser.load(page.as_uri(), probe="document.title")
    assert "http://example.invalid/x.png" in loaded.requests
    assert any("broken chart" in e for e in loaded.console_errors)


# The quality chart as drawn: each noise bar's length and caps in screen pixels and whether it is painted after
# (over) its point; every label's and point's box; the smallest chart text on screen (its font size times the
# chart's scale); how wide the document and each table are against the window.
GEOMETRY = """(() => {
  const box = el => { const r = el.getBoundingClientRect();
    return {left: r.left, top: r.top, right: r.right, bottom: r.bottom, width: r.width, height: r.height}; };
  const svg = document.getElementById('quality');
  const points = [...svg.querySelectorAll('circle.point')];
  const text = [...document.querySelectorAll('svg.chart text')].map(t =>
    parseFloat(getComputedStyle(t).fontSize) * t.ownerSVGElement.getScreenCTM().a);
  return {
    inner: window.innerWidth,
    scroll: document.documentElement.scrollWidth,
    wide: [...document.querySelectorAll('table, svg.bar, pre, .scroll')].filter(
      el => el.getBoundingClientRect().right > window.innerWidth + 0.5 || el.scrollWidth > el.clientWidth + 1
    ).map(el => el.tagName + ' ' + (el.getAttribute('class') || '') + ' ' + Math.round(el.scrollWidth)),
    smallest_text: Math.min(...text),
    points: points.map(c => ({ref: c.dataset.ref, box: box(c), se: c.querySelector('title').textContent})),
    bars: [...svg.querySelectorAll('g.noise')].map(g => ({
      bar: box(g.querySelector('.noise-bar')),
      caps: [...g.querySelectorAll('.noise-cap')].map(box),
      over: points.some(c => (c.compareDocumentPosition(g) & Node.DOCUMENT_POSITION_FOLLOWING)
        && Math.abs(c.getBoundingClientRect().left + c.getBoundingClientRect().width / 2
                    - g.querySelector('.noise-bar').getBoundingClientRect().left) < 1),
    })),
    labels: [...svg.querySelectorAll('text.point-label')].map(t => ({ref: t.dataset.ref, box: box(t)})),
  };
})()"""


def _crowded(page: ModelPage) -> ModelPage:
    """`page` with its variants 3 % apart in size and 10 % apart in mean KL, the larger the better (each ± 3 %): five
    points on a short diagonal, each in the place where a label to the lower right of its neighbour would go."""
    out = []
    for k, m in enumerate(sorted(page.variants, key=lambda m: m.ref)):
        f = m.validation.figures
        assert f is not None
        kl = 0.028 / 1.1**k
        figures = f.model_copy(update={"mean_kl": kl, "mean_kl_stderr": kl * 0.03})
        out.append(
            m.model_copy(
                update={
                    "weights_bytes": int((1 + 0.03 * k) * (1 << 20)),
                    "validation": m.validation.model_copy(update={"figures": figures}),
                }
            )
        )
    page.variants = out
    return page


def _meet(a: dict[str, float], b: dict[str, float]) -> bool:
    return min(a["right"], b["right"]) - max(a["left"], b["left"]) > 0.5 and (
        min(a["bottom"], b["bottom"]) - max(a["top"], b["top"]) > 0.5
    )


@pytest.mark.parametrize("width", [1280, 420])
def test_the_quality_chart_is_readable_at_desktop_and_phone_width(
    site_registry: SiteRegistry, browser: Chromium, tmp_path: Path, width: int
) -> None:
    """Both models' pages, and SmolLM2's with q6_k and q8_0 passed early (longer labels, hollow points), measured
    in chromium: every point with a standard error has a bar with caps over it, longer than a few pixels; no label meets another label or any point; chart text is 10 px or more; at 420 px nothing is wider than
    the window (tables stack, memory bars shrink)."""
    s = site_registry.settings
    out = tmp_path / "site"
    build_site(s, out)
    early = out / "models" / "smollm2-early.html"
    early.write_text(model_page(early_passes(s)), encoding="utf-8")
    crowded = out / "models" / "smollm2-crowded.html"
    crowded.write_text(model_page(_crowded(early_passes(s))), encoding="utf-8")
    SHOTS.mkdir(parents=True, exist_ok=True)
    for page in (out / "models" / "smollm2.html", out / "models" / "tiny-qwen2.html", early, crowded):
        shot = SHOTS / f"{page.stem}-{width}px.png"
        loaded = browser.load(page.as_uri(), probe=GEOMETRY, width=width, screenshot=shot)
        assert loaded.console_errors == []
        g = loaded.dom
        where = f"{page.name} at {width} px"
        assert g["inner"] == width
        assert g["scroll"] <= width, (where, g["scroll"], g["wide"])
        assert g["wide"] == [], where
        assert g["smallest_text"] >= 10, (where, g["smallest_text"])
        assert len(g["bars"]) == len(g["points"]), where  # every point of the fixture has a standard error
        for bar in g["bars"]:
            assert bar["over"], (where, bar)  # painted after its point, at its centre
            assert len(bar["caps"]) == 2 and all(c["width"] >= 8 for c in bar["caps"]), (where, bar)
            # ± one standard error is a few percent of the figure: 6-7 px here at desktop width, 4 px on a phone
            assert bar["bar"]["height"] >= (5 if width >= 1000 else 3.5), (where, bar)
        labels, points = g["labels"], g["points"]
        assert sorted(lab["ref"] for lab in labels) == sorted(p["ref"] for p in points)
        for i, lab in enumerate(labels):
            for other in labels[i + 1 :]:
                assert not _meet(lab["box"], other["box"]), (where, lab, other)
            for p in points:
                assert not _meet(lab["box"], p["box"]), (where, lab, p)
