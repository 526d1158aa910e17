"""The registry site rebuilt after a run registered variants, and the lines its Prefect artifact links it with."""

from __future__ import annotations

from prefect import get_run_logger

from pipelines.core.errors import ModelmintError
from pipelines.core.settings import Settings
from pipelines.site.build import default_site_dir, refresh_site


def site_lines(settings: Settings, registered: list[str]) -> list[str]:
    """Rebuild the static site (MODELMINT_WORK_DIR/site) when `registered` names any variant and the registry
    changed; the Markdown lines that link it. A site that cannot be written is a warning, never a failed run."""
    if not registered:
        return []
    try:
        index, built = refresh_site(settings, default_site_dir(settings))
    except (ModelmintError, OSError) as err:
        get_run_logger().warning("the registry site was not rebuilt: %s", err)
        return ["", f"The registry site was not rebuilt: {err}"]
    except Exception as err:  # a bug in the site's rendering must not fail a run whose variants are registered
        get_run_logger().exception("the registry site was not rebuilt (a modelmint bug: please report it)")
        return ["", f"The registry site was not rebuilt: {type(err).__name__}: {err}"]
    if built:
        get_run_logger().info("registry site rebuilt: %s", index)
    return [
        "",
        f"Registry site: [{index}]({index.as_uri()}) (`modelmint site serve --dir {index.parent}` shows it "
        "on 127.0.0.1)",
    ]
