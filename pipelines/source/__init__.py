"""Where a model comes from: the catalog, the hub (or a model rebuilt from a pinned wheel), generated tiny models."""
