#!/usr/bin/env bash
# Install the pinned llmcompressor venv into a cache outside the repo, in two stages (venv, check), each
# marked when done; a finished toolchain (.complete) is reused in about a second. `--check` reruns the checks.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=llmcompressor.env
source "$here/llmcompressor.env"
# shellcheck source=lib.sh
source "$here/lib.sh"
PREFIX="$TC_HOME/toolchains/llmcompressor-$LLMC_VERSION"
PYTHON=${PYTHON:-python3}
tc_init "llmcompressor $LLMC_VERSION" "$PREFIX" "bash toolchains/setup-llmcompressor.sh"

venv_stage() {
  rm -rf "$PREFIX/venv" "$PREFIX/pip-reports"
  "$PYTHON" -m venv "$PREFIX/venv"
  "$PREFIX/venv/bin/pip" install --upgrade pip
  # torch pinned in the SAME command: unpinned, pip resolves llmcompressor's torch<=2.14 to a CUDA 2.14 wheel.
  # tc_pip keeps pip's installation report (each wheel's URL and sha256) for the provenance of what it builds.
  tc_pip "$PREFIX/venv" "torch==$LLMC_TORCH" "llmcompressor==$LLMC_VERSION" \
    "transformers==$LLMC_TRANSFORMERS" "compressed-tensors==$LLMC_COMPRESSED_TENSORS" safetensors pyyaml
}

check_stage() {
  # the pins are what got installed, and the modifiers modelmint uses import
  "$PREFIX/venv/bin/python" - "$LLMC_VERSION" "$LLMC_TORCH" "$LLMC_TRANSFORMERS" "$LLMC_COMPRESSED_TENSORS" <<'PY'
import sys
from importlib.metadata import version

want = dict(zip(["llmcompressor", "torch", "transformers", "compressed-tensors"], sys.argv[1:]))
got = {name: version(name) for name in want}
bad = {n: (got[n], w) for n, w in want.items() if got[n].split("+")[0] != w}
if bad:
    sys.exit(f"installed versions differ from the pins (got, want): {bad}")
import llmcompressor.modifiers.quantization  # noqa: F401
import llmcompressor.modifiers.transform.awq  # noqa: F401
print("checks passed: llmcompressor toolchain versions", got)
PY
}

tc_begin "$@"
tc_stage venv "llmcompressor venv (llmcompressor $LLMC_VERSION, torch $LLMC_TORCH CPU, transformers $LLMC_TRANSFORMERS)" venv_stage
tc_stage check "check the pinned versions and imports" check_stage
tc_done
