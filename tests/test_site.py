"""The static registry site, read back as HTML: pages, tables, SVG points, escaping, and the bad-input cases."""

from __future__ import annotations

import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from registry_env import Repo
from site_registry import EVIL, SMOLLM2, SiteRegistry

from pipelines.core.errors import ConfigError
from pipelines.core.settings import Settings
from pipelines.site.build import build_site, collect
from pipelines.site.render import ModelPage, _kl_axis, model_page, page_name, pareto
from pipelines.store.manifest import Manifest, list_manifests


class _Elements(HTMLParser):
    """Every start tag with its attributes, and the text, of one page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def find(self, tag: str, cls: str | None = None, **attrs: str) -> list[dict[str, str | None]]:
        """The `tag` elements with class `cls` among their classes and these attribute values."""
        return [
            a
            for t, a in self.tags
            if t == tag
            and (cls is None or cls in (a.get("class") or "").split())
            and all(a.get(k) == v for k, v in attrs.items())
        ]


def _read(path: Path) -> tuple[str, _Elements]:
    text = path.read_text(encoding="utf-8")
    parsed = _Elements()
    parsed.feed(text)
    return text, parsed


@pytest.fixture(scope="module")
def site(site_registry: SiteRegistry, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    build_site(site_registry.settings, out)
    return out


# SmolLM2's q6_k and q8_0 as the gate's early pass scores them: the running figures after 4 and 8 of the 16 chunks
# (63 positions each, ctx 128), with the same top they measured there (docs/quality.md); q4_k_m over all 16
EARLY = {"q6_k": (252, 94.84), "q8_0": (504, 94.05)}


def early_passes(settings: Settings, name: str = "smollm2") -> ModelPage:
    """`name`'s page as build_site collects it, with the variants of EARLY scored on their first chunks only."""
    page = next(p for p in collect(settings) if p.name == name)

    def scored(m: Manifest) -> Manifest:
        if m.tag not in EARLY or m.validation.figures is None:
            return m
        tokens, top = EARLY[m.tag]
        figures = m.validation.figures.model_copy(update={"tokens": tokens, "same_top_pct": top})
        return m.model_copy(update={"validation": m.validation.model_copy(update={"figures": figures})})

    page.variants = [scored(m) for m in page.variants]
    return page


def _cells(text: str, ref: str) -> str:
    """The text of the variants-table row of `ref`."""
    start = text.index(f'<tr data-ref="{ref}"')
    return text[start : text.index("</tr>", start)]


def test_the_pareto_front_is_what_nothing_beats_on_both() -> None:
    # (MiB, mean KL): awq small and poor, q4_k_m beaten by awq on both, fp8 beaten by q6_k, q8_0 the best
    pts = [(0.9, 0.060), (1.0, 0.0702), (1.6, 0.0255), (1.4, 0.0104), (1.8, 0.0042)]
    assert pareto(pts) == [0, 3, 4]
    assert pareto([(1.0, 0.1), (1.0, 0.1)]) == [0, 1]  # equal points beat neither


def test_a_kl_of_zero_sits_at_the_log_axis_floor() -> None:
    """A lossless variant (or a figure rounded to 0) has no logarithm: it is drawn at the bottom of the KL axis,
    below every positive figure, instead of failing the page (and the flow that rebuilds the site)."""
    axis = _kl_axis([0.0, 0.004, 0.05], top=10.0, bottom=200.0)
    assert axis(0.0) == 200.0
    assert axis(0.05) < axis(0.004) < axis(0.0)


def test_every_model_has_a_page_with_every_variant_row_and_chart_point(
    site: Path, site_registry: SiteRegistry
) -> None:
    manifests = list_manifests(site_registry.settings).manifests
    _, idx = _read(site / "index.html")
    assert [a["href"] for a in idx.find("a") if str(a.get("href", "")).startswith("models/")] == [
        "models/smollm2.html",
        "models/tiny-qwen2.html",
    ]
    for name in ("smollm2", "tiny-qwen2"):
        _, page = _read(site / "models" / page_name(name))
        refs = sorted(m.ref for m in manifests if m.name == name)
        assert sorted(str(r["data-ref"]) for r in page.find("tr") if r.get("data-ref")) == refs
        quality = [c for c in page.find("circle", cls="point") if c.get("data-size")]
        assert sorted(str(c["data-ref"]) for c in quality) == refs
        assert page.find("svg", id="quality") and page.find("svg", id="versions")
        assert all(s.get("role") == "img" and s.get("aria-labelledby") for s in page.find("svg", cls="chart"))
    _, smol = _read(site / "models" / "smollm2.html")
    front = sorted(str(c["data-ref"]) for c in smol.find("circle", cls="pareto"))
    assert front == ["smollm2:awq", "smollm2:q6_k", "smollm2:q8_0"]
    # q4_k_m was registered twice: both versions on the history chart, the older better
    q4 = [
        c
        for c in smol.find("circle", cls="point")
        if c.get("data-version") and c["data-ref"] == "smollm2:q4_k_m"
    ]
    assert sorted(float(str(c["data-kl"])) for c in q4) == [SMOLLM2["q4_k_m"][0], 0.0702]


def test_serving_plans_commands_provenance_and_cards(site: Path, site_registry: SiteRegistry) -> None:
    text, page = _read(site / "models" / "smollm2.html")
    for inventory in ("1x1xL4-24G", "1x4xRTX4090-24G"):  # as the manifests record them, in full
        assert f"<h3>{inventory}</h3>" in text
    bars = page.find("rect", cls="mem")
    assert bars and {str(b["class"]).split()[1] for b in bars} == {
        "weights",
        "activations",
        "kv_pool",
        "other",
        "headroom",
    }
    assert "Best measured variant that fits: <strong>smollm2:q8_0</strong>" in text
    for cmd in (
        "modelmint pull smollm2:q8_0",
        "ollama run smollm2:q8_0",
        "modelmint pull smollm2:fp8",
        "vllm serve artifacts/smollm2/fp8 --config artifacts/smollm2/fp8/serve/1x1xl4-24g/vllm.yaml",
    ):
        assert f'<code class="cmd">{cmd}</code>' in text
    assert page.find("table", cls="provenance")
    assert "gguf@smollm2-q8_0" in text and "0c1e570" in text
    assert "<summary>smollm2:q8_0: README.md</summary>" in text  # the card, from the checkout


def test_html_special_characters_are_escaped_everywhere(site: Path, site_registry: SiteRegistry) -> None:
    """A card, a catalog description and an invalid manifest's folder name carry markup; none of it is markup on a
    page, and no page has a script element at all."""
    for path in sorted(site.rglob("*.html")):
        text, parsed = _read(path)
        assert not parsed.find("script"), path
        assert EVIL not in text, path
    text, _ = _read(site / "models" / "tiny-qwen2.html")
    assert (
        "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in text
    )  # the card and the description, as text
    assert "&amp; more" in text


def test_an_invalid_manifest_shows_its_error_and_fix_and_the_rest_builds(
    site_registry: SiteRegistry, tmp_path: Path
) -> None:
    s = site_registry.settings
    broken = s.manifests_dir / "smollm2" / "q5_k_m.json"
    odd = s.manifests_dir / '<img src=x onerror="alert(1)">' / "q4_k_m.json"
    odd.parent.mkdir()
    try:
        broken.write_text('{"name": "smollm2", "tag": "q5_k_m"')  # cut short
        odd.write_text(json.dumps({"name": EVIL}))
        built = build_site(s, tmp_path / "site")
        assert len(built.invalid) == 2
        text, page = _read(tmp_path / "site" / "models" / "smollm2.html")
        alert = page.find("div", role="alert")
        assert len(alert) == 1
        assert "q5_k_m.json is invalid: not JSON" in text
        assert "fix:</strong> manifests are written by modelmint only: restore it with" in text
        assert len([r for r in page.find("tr") if r.get("data-ref")]) == 5  # the valid variants are all there
        odd_page = tmp_path / "site" / "models" / page_name(odd.parent.name)
        assert odd_page.is_file() and odd_page.name.startswith("x-")
        odd_text, odd_parsed = _read(odd_page)
        assert not odd_parsed.find("img") and not odd_parsed.find("script")
        assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in odd_text
        index, _ = _read(tmp_path / "site" / "index.html")
        assert "manifest(s) do not validate" in index
    finally:
        broken.unlink(missing_ok=True)
        shutil.rmtree(odd.parent)


def test_an_empty_registry_says_so_and_how_to_register_the_first_model(repo: Repo, tmp_path: Path) -> None:
    built = build_site(repo.settings(), tmp_path / "site")
    text, _ = _read(tmp_path / "site" / "index.html")
    assert "No model is registered yet." in text
    assert '<code class="cmd">modelmint convert tiny-qwen2 --register</code>' in text
    assert [p.name for p in built.pages] == ["index.html", "charts.html"]
    assert list((tmp_path / "site" / "models").iterdir()) == []


def test_a_rebuild_replaces_the_site_and_a_file_in_the_way_is_refused(repo: Repo, tmp_path: Path) -> None:
    out = tmp_path / "out" / "site"
    build_site(repo.settings(), out)
    (out / "models" / "stale.html").write_text("from an earlier build")
    dead = subprocess.Popen(["true"])
    dead.wait()
    killed = out.with_name(f"site.partial-{dead.pid}")  # what a build killed mid-way leaves
    (killed / "models").mkdir(parents=True)
    build_site(repo.settings(), out)
    assert not (out / "models" / "stale.html").exists()
    assert sorted(p.name for p in out.parent.iterdir()) == ["site"]  # no partial or old copy left beside it
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file") as err:
        build_site(repo.settings(), tmp_path / "file")
    assert "--out" in (err.value.hint or "")


def test_refresh_rebuilds_only_when_the_registry_changed(
    site_registry: SiteRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the flow calls after each registration: a rerun that registered nothing new starts no process (git)."""
    import subprocess

    from pipelines.site.build import refresh_site

    s = site_registry.settings
    out = tmp_path / "site"
    index, built = refresh_site(s, out)
    assert built and index == out / "index.html" and index.is_file()
    started: list[object] = []
    real = subprocess.Popen

    def counting(*a: object, **kw: object) -> object:
        started.append(a[0])
        return real(*a, **kw)  # type: ignore[call-overload]

    monkeypatch.setattr(subprocess, "Popen", counting)
    assert refresh_site(s, out) == (index, False)
    assert started == []
    monkeypatch.undo()
    manifest = s.manifests_dir / "tiny-qwen2" / "q8_0.json"
    before = manifest.read_text()
    try:
        manifest.write_text(before.replace('"q8_0"', '"q8_0" ', 1))  # the same record, other bytes
        assert refresh_site(s, out) == (index, True)
    finally:
        manifest.write_text(before)


def test_serve_answers_on_localhost_and_refuses_a_folder_without_a_site(repo: Repo, tmp_path: Path) -> None:
    import threading
    import urllib.error
    import urllib.request

    from pipelines.site.server import site_server

    with pytest.raises(ConfigError, match="holds no registry site") as err:
        site_server(tmp_path / "nothing")
    assert "modelmint site build --out" in (err.value.hint or "")
    build_site(repo.settings(), tmp_path / "site")
    (tmp_path / "secret.txt").write_text("outside the site")
    server = site_server(tmp_path / "site", port=0)
    assert server.server_address[0] == "127.0.0.1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        with urllib.request.urlopen(f"{base}/index.html", timeout=10) as r:
            assert r.status == 200 and "No model is registered yet." in r.read().decode()
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"{base}/../secret.txt", timeout=10)
        assert missing.value.code == 404
        with pytest.raises(ConfigError, match=r"cannot serve on 127\.0\.0\.1"):
            site_server(tmp_path / "site", port=server.server_address[1])  # taken
    finally:
        server.shutdown()
        server.server_close()


def test_a_model_whose_every_build_failed_is_shown_with_none_recommended(repo: Repo, tmp_path: Path) -> None:
    from site_registry import report

    settings = repo.settings()
    out = settings.work_dir / "qwen2.5" / "7ae557604adf"
    out.mkdir(parents=True)
    (out / "qwen2.5-q4_k_m.report.json").write_text(
        json.dumps(report("q4_k_m", (0.2, 0.01, 70.0, 1.0, 30.0, 1.0), passed=False))
    )
    build_site(settings, tmp_path / "site")
    text, page = _read(tmp_path / "site" / "models" / "qwen2.5.html")
    assert [r["data-ref"] for r in page.find("tr") if r.get("data-ref")] == ["qwen2.5:q4_k_m"]
    assert "none of its builds passed its gate: nothing is recommended" in text
    assert "gate failed, not registered" in text and "mean KL 0.2 &gt; 0.0001" in text
    index, _ = _read(tmp_path / "site" / "index.html")
    assert "1 build(s) failed their gate" in index


def test_a_published_gguf_offers_its_ollama_pull(site_registry: SiteRegistry, tmp_path: Path) -> None:
    from pipelines.store.manifest import find_manifest
    from pipelines.store.published import publications_path

    s = site_registry.settings
    m = find_manifest(s, "smollm2:q8_0")
    record = publications_path(s, "smollm2", "q8_0")
    record.parent.mkdir(parents=True, exist_ok=True)
    image = "registry.internal/modelmint/smollm2:q8_0"
    record.write_text(json.dumps([{"image": image, "key": m.key, "sha256": m.sha256, "published_at": "x"}]))
    try:
        build_site(s, tmp_path / "site")
        text, _ = _read(tmp_path / "site" / "models" / "smollm2.html")
        assert f'<code class="cmd">ollama pull {image}</code>' in text
    finally:
        shutil.rmtree(record.parent.parent)


def test_each_figure_says_what_it_was_scored_on_and_early_passes_are_not_ranked_with_the_rest(
    site_registry: SiteRegistry, tmp_path: Path
) -> None:
    """q6_k scored on 4 of 16 chunks shows a higher same top than q8_0 on 8 and q4_k_m on 16: each figure carries
    its chunks and tokens, the page says they differ and are not comparable, the whole-text variants come first in
    the table, the early ones are hollow in the chart and off its Pareto front, and the serving section ranks the
    whole-text variants and calls the early ones not comparable."""
    s = site_registry.settings
    text = model_page(early_passes(s))
    page = _Elements()
    page.feed(text)
    assert "94.84 %" in _cells(text, "smollm2:q6_k")
    assert "(4/16 chunks, 252 tokens)" in _cells(text, "smollm2:q6_k")
    assert "(8/16 chunks, 504 tokens)" in _cells(text, "smollm2:q8_0")
    assert "(16/16 chunks, 1,008 tokens)" in _cells(text, "smollm2:q4_k_m")
    assert "Scored on different tokens" in text and "q6_k, q8_0 passed their gate early" in text
    assert "not comparable" in _cells(text, "smollm2:q8_0")
    rows = [r["data-ref"] for r in page.find("tr") if r.get("data-ref")]
    assert rows == ["smollm2:awq", "smollm2:q4_k_m", "smollm2:fp8", "smollm2:q6_k", "smollm2:q8_0"]
    points = {str(c["data-ref"]): c for c in page.find("circle", cls="point") if c.get("data-size")}
    assert {r for r, c in points.items() if "partial" in str(c["class"])} == {"smollm2:q6_k", "smollm2:q8_0"}
    assert sorted(r for r, c in points.items() if "pareto" in str(c["class"])) == [
        "smollm2:awq",
        "smollm2:fp8",
    ]
    # the serving section: the best of the whole-text variants; the early ones named, not ranked against it
    assert (
        "Best measured variant that fits, of those scored on the whole text: <strong>smollm2:fp8</strong>"
        in text
    )
    assert (
        "smollm2:q8_0 was scored on 8/16 chunks, 504 tokens against 16/16 chunks, 1,008 tokens: not comparable"
        in text
    )


def test_pages_are_rendered_from_their_data_alone(site_registry: SiteRegistry) -> None:
    """The renderer reads no file and no setting: a page's cards and published images come in its ModelPage (what
    collect read), and the empty index names the manifests folder it is given."""
    import ast

    import pipelines.site.render as render
    from pipelines.site.render import index_page

    tree = ast.parse(Path(render.__file__).read_text())
    imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not imported & {"os", "shutil", "http.server", "socket", "pipelines.core.settings", "pipelines.core.fsutil"}
    called = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert not called & {"read_text", "read_bytes", "open", "is_file", "exists", "iterdir", "glob"}

    page = next(p for p in collect(site_registry.settings) if p.name == "smollm2")
    page.cards = {"smollm2:q8_0": "a card <b>as given</b>"}
    page.published = {"smollm2:q8_0": ["registry.internal/modelmint/smollm2:q8_0"]}
    text = model_page(page)
    assert "<pre>a card &lt;b&gt;as given&lt;/b&gt;</pre>" in text
    assert '<code class="cmd">ollama pull registry.internal/modelmint/smollm2:q8_0</code>' in text
    assert "The card of smollm2:q6_k is not in this checkout" in text  # no card given: not read from anywhere
    assert "<code>/nowhere/manifests</code>" in index_page([], Path("/nowhere/manifests"))


def test_measurably_worse_only_where_both_have_errors_and_differ_by_more_than_both() -> None:
    from pipelines.advice.recommend import Basis, Choice, versus
    from pipelines.core.report import Figures

    def c(kl: float, se: float | None) -> Choice:
        f = Figures.of(
            mean_kl=kl, same_top_pct=90.0, ppl_reference=10.0, ppl=10.1, tokens=1008, mean_kl_stderr=se
        )
        return Choice(f"m:{kl}", "t", "gguf", 1, f)

    whole, early = Basis(16, 16, 1008), Basis(4, 16, 252)
    assert versus(c(0.010, 0.001), c(0.015, 0.001), whole, whole).startswith("is measurably worse")
    assert versus(c(0.010, 0.001), c(0.0115, 0.001), whole, whole).startswith("ties within")
    assert "measurably" in versus(c(0.010, 0.001), c(0.050, None), whole, whole)  # "not known to differ …"
    assert not versus(c(0.010, 0.001), c(0.050, None), whole, whole).startswith("is measurably")
    assert not versus(c(0.010, None), c(0.050, 0.001), whole, whole).startswith("is measurably")
    assert versus(c(0.010, 0.001), c(0.050, 0.001), whole, early).endswith("(mean KL 0.05 against 0.01)")
    assert "not comparable" in versus(c(0.010, 0.001), c(0.050, 0.001), whole, early)


def test_sizes_of_a_gib_or_more_are_shown_in_gib(site_registry: SiteRegistry) -> None:
    s = site_registry.settings
    page = next(p for p in collect(s) if p.name == "tiny-qwen2")
    page.variants = [
        m.model_copy(update={"weights_bytes": int(gib * (1 << 30))})
        for m, gib in zip(sorted(page.variants, key=lambda m: m.weights_bytes), (4.68, 8.1), strict=True)
    ]
    text = model_page(page)
    assert ">4.68 GiB<" in text and ">8.10 GiB<" in text
    assert "weights (GiB)" in text and "MiB" not in text.split('<svg id="quality"')[1].split("</svg>")[0]


def test_a_failed_build_row_shows_no_local_path(repo: Repo, tmp_path: Path) -> None:
    """The report lies in the builder's work directory: its folder is nobody else's business, and it is no sha256."""
    from site_registry import report

    settings = repo.settings()
    out = settings.work_dir / "qwen2.5" / "7ae557604adf"
    out.mkdir(parents=True)
    (out / "qwen2.5-q4_k_m.report.json").write_text(
        json.dumps(report("q4_k_m", (0.2, 0.01, 70.0, 1.0, 30.0, 1.0), passed=False))
    )
    build_site(settings, tmp_path / "site")
    text, _ = _read(tmp_path / "site" / "models" / "qwen2.5.html")
    assert str(settings.work_dir) not in text
    row = text[text.index('<tr data-ref="qwen2.5:q4_k_m"') :]
    row = row[: row.index("</tr>")]
    assert row.endswith('<td data-label="sha256">-</td>')
    assert "qwen2.5-q4_k_m.report.json" in row
