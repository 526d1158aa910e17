#!/usr/bin/env bash
# Build the pinned llama.cpp tools and the converter venv into a cache outside the repo.
# Idempotent: a finished toolchain (marked by .complete) is reused in about a second.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=llama-cpp.env
source "$here/llama-cpp.env"
MODELMINT_HOME=${MODELMINT_HOME:-$HOME/.cache/modelmint}
PREFIX="$MODELMINT_HOME/toolchains/llama.cpp-$LCPP_PY_VERSION-$LLAMA_CPP_COMMIT"
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}

if [[ -f "$PREFIX/.complete" ]]; then
  echo "llama.cpp toolchain ready: $PREFIX"
  exit 0
fi
for tool in cmake ninja g++; do
  command -v "$tool" >/dev/null || { apt-get update -q && apt-get install -y -q --no-install-recommends cmake ninja-build g++; break; }
done

# a directory without .complete is a killed earlier attempt: start it over
work="$PREFIX"
rm -rf "$work"
mkdir -p "$work"/{src,bin}

# 1. source: the pinned sdist, checked by sha256 before a byte of it is used
"$PYTHON" -m pip download -q --no-deps --no-binary :all: -d "$work/src" "llama-cpp-python==$LCPP_PY_VERSION"
sdist="$work/src/llama_cpp_python-$LCPP_PY_VERSION.tar.gz"
echo "$LCPP_SDIST_SHA256  $sdist" | sha256sum -c --quiet -
tar -xzf "$sdist" -C "$work/src"
rm "$sdist"
mv "$work/src/llama_cpp_python-$LCPP_PY_VERSION/vendor/llama.cpp" "$work/llama.cpp"
rm -rf "$work/src"

# 2. only the tools modelmint runs; static, CPU, portable (GGML_NATIVE=OFF), no network features
cmake -S "$work/llama.cpp" -B "$work/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_BUILD_COMMIT="$LLAMA_CPP_COMMIT" -DLLAMA_BUILD_NUMBER="$LLAMA_CPP_BUILD_NUMBER" >/dev/null
cmake --build "$work/build" -j "$JOBS" --target \
  llama-quantize llama-perplexity llama-imatrix llama-completion llama-gguf-split llama-server
cp "$work"/build/bin/llama-* "$work/bin/"
rm -rf "$work/build"

# 3. converter venv: torch pinned in the same command (unpinned, pip pulls CUDA wheels)
"$PYTHON" -m venv "$work/venv"
"$work/venv/bin/pip" install -q --upgrade pip
"$work/venv/bin/pip" install -q "torch==$CONVERTER_TORCH" "transformers==$CONVERTER_TRANSFORMERS" \
  "numpy>=2.2.6,<3" "sentencepiece>=0.1.98,<0.3.0" "protobuf>=4.21.0,<5.0.0" safetensors tokenizers
"$work/venv/bin/pip" install -q "$work/llama.cpp/gguf-py"

# 4. smoke: every tool starts, the converter imports
# (llama-quantize has no --version; the others must report the pinned commit)
for b in llama-completion llama-perplexity llama-imatrix llama-server llama-gguf-split; do
  "$work/bin/$b" --version 2>&1 | grep -q "commit $LLAMA_CPP_COMMIT" || { echo "$b does not report commit $LLAMA_CPP_COMMIT" >&2; exit 1; }
done
"$work/bin/llama-quantize" --help 2>&1 | grep -q Q4_K_M
"$work/venv/bin/python" "$work/llama.cpp/convert_hf_to_gguf.py" --help >/dev/null

touch "$PREFIX/.complete"
echo "llama.cpp toolchain ready: $PREFIX"
