#!/usr/bin/env bash
# Set everything up, then build the bundled tiny model through the whole GGUF path.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
.venv/bin/modelmint catalog list
.venv/bin/modelmint convert tiny-qwen2 "$@"
