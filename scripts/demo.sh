#!/usr/bin/env bash
# Set everything up, start the local Prefect stack, and build the bundled tiny model through the whole path:
# fetch → convert → quantize → validate → register (DVC) → publish, as a Prefect deployment run.
# Extra arguments go to `prefect deployment run`, e.g. --param 'variants=["q8_0"]'. Stop with scripts/down.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
# modelmint's own modules byte-compiled once: where PYTHONDONTWRITEBYTECODE is set, Python never writes them, and
# every modelmint process (the suite starts hundreds) would compile them again (~0.5-0.9 s each on 2 cores)
.venv/bin/python -m compileall -q pipelines flows >/dev/null
.venv/bin/modelmint catalog list
bash scripts/up.sh
PREFECT_API_URL="$(.venv/bin/modelmint stack api-url)"
export PREFECT_API_URL DO_NOT_TRACK=1
.venv/bin/prefect deployment run convert/tiny-qwen2 --watch "$@"
