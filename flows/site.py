"""The registry site's lines in a run's Prefect artifact: the run rebuilt it as its last step
(pipelines.compose.site_step); here only how the artifact links it."""

from __future__ import annotations

from pipelines.compose import SiteRefresh


def site_lines(site: SiteRefresh | None) -> list[str]:
    """The Markdown lines that link the site the run rebuilt, or say why it was not (none: nothing registered)."""
    if site is None:
        return []
    if site.index is None:
        return ["", f"The registry site was not rebuilt: {site.error}"]
    return [
        "",
        f"Registry site: [{site.index}]({site.index.as_uri()}) (`modelmint site serve --dir {site.index.parent}` "
        "shows it on 127.0.0.1)",
    ]
