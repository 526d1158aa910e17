#!/usr/bin/env bash
# Install the pinned llmcompressor venv into a cache outside the repo.
# Idempotent: a finished toolchain (marked by .complete) is reused in about a second.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=llmcompressor.env
source "$here/llmcompressor.env"
MODELMINT_HOME=${MODELMINT_HOME:-$HOME/.cache/modelmint}
PREFIX="$MODELMINT_HOME/toolchains/llmcompressor-$LLMC_VERSION"
PYTHON=${PYTHON:-python3}

if [[ -f "$PREFIX/.complete" ]]; then
  echo "llmcompressor toolchain ready: $PREFIX"
  exit 0
fi

# a directory without .complete is a killed earlier attempt: start it over
rm -rf "$PREFIX"
mkdir -p "$PREFIX"
"$PYTHON" -m venv "$PREFIX/venv"
"$PREFIX/venv/bin/pip" install -q --upgrade pip
# torch pinned in the SAME command: unpinned, pip resolves llmcompressor's torch<=2.14 to a CUDA 2.14 wheel
"$PREFIX/venv/bin/pip" install -q "torch==$LLMC_TORCH" "llmcompressor==$LLMC_VERSION" \
  "transformers==$LLMC_TRANSFORMERS" "compressed-tensors==$LLMC_COMPRESSED_TENSORS" safetensors pyyaml

# smoke: the pins are what got installed, and the modifiers modelmint uses import
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
print("llmcompressor toolchain versions:", got)
PY

touch "$PREFIX/.complete"
echo "llmcompressor toolchain ready: $PREFIX"
