#!/usr/bin/env bash
# Install what the tests need (idempotent), lint, and run the whole test suite against the real tools.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
# the registry site's browser test drives Debian's chromium headless (the main job does not need it)
bash toolchains/setup-chromium.sh
# modelmint's own modules byte-compiled once: where PYTHONDONTWRITEBYTECODE is set, Python never writes them, and
# every modelmint process (the suite starts hundreds) would compile them again (~0.5-0.9 s each on 2 cores)
.venv/bin/python -m compileall -q pipelines flows >/dev/null
.venv/bin/ruff check --no-cache pipelines flows tests benchmarks
# types: zero errors in pipelines/ and flows/ ([tool.mypy] in pyproject.toml, the pydantic plugin)
.venv/bin/mypy
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit $rc
