#!/usr/bin/env bash
# Start the embedded Prefect stack: a local server (SQLite, 127.0.0.1, analytics off), the `modelmint-local`
# process work pool and concurrency limits, the deployments in prefect.yaml, and a worker. Idempotent: what
# runs already is reused. MODELMINT_PREFECT_PORT (default 4200) chooses the port; stop it with scripts/down.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export DO_NOT_TRACK=1 DVC_NO_ANALYTICS=1
exec .venv/bin/modelmint stack up
