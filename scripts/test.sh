#!/usr/bin/env bash
# Install what the tests need (idempotent), lint, and run the whole test suite against the real tools.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
.venv/bin/ruff check --no-cache pipelines flows tests benchmarks
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit $rc
