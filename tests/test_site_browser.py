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

from pipelines.core.settings import project_root
from pipelines.registry.history import history
from pipelines.registry.manifest import list_manifests
from pipelines.registry.site import build_site, page_name

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
