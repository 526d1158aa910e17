#!/usr/bin/env bash
# Stop the embedded Prefect stack started by scripts/up.sh: the worker (and the flow runs it started), then
# the server. Its database and logs stay in its Prefect home ($MODELMINT_HOME/prefect/<checkout>-<hash>-<port>).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec .venv/bin/modelmint stack down
