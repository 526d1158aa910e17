"""The store: what a registered artifact is and where it is held (names, manifests, formats, the DVC repo, history)."""
