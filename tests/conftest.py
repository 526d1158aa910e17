"""Shared pytest configuration: fixture modules any test file may use (add yours to the list)."""

# registry_env: `isolated` (git/DVC/Prefect/modelmint caches in a temp dir) and `repo` (a git + DVC project).
pytest_plugins = ["registry_env"]
