#!/usr/bin/env bash
# Stop the embedded Prefect stack started by scripts/up.sh: the worker (and the flow runs it started), then
# the server. Its database and logs stay in $MODELMINT_HOME/prefect.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec .venv/bin/modelmint stack down
