#!/usr/bin/env bash
# Build the pinned llama.cpp tools and the converter venv into a cache outside the repo, in stages:
#   source   the pinned sdist downloaded and checked by sha256, llama.cpp's tree extracted
#   build    the tools compiled (cmake + ninja, static, portable CPU)
#   install  the binaries copied to bin/, the build tree removed
#   venv     the converter's venv (torch, transformers, gguf-py from the same tree), and pip's installation
#            report of it in pip-reports/ (each wheel's URL and sha256, for the provenance)
#   check    every tool reports the pinned commit, the converter starts
# Each stage is marked when done, so a rerun (after a failure, Ctrl-C or a full disk) does only what is
# missing. A finished toolchain (.complete) is reused in about a second. `--check` reruns the checks alone.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=llama-cpp.env
source "$here/llama-cpp.env"
# shellcheck source=lib.sh
source "$here/lib.sh"
PREFIX="$TC_HOME/toolchains/llama.cpp-$LCPP_PY_VERSION-$LLAMA_CPP_COMMIT"
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
TOOLS=(llama-quantize llama-perplexity llama-imatrix llama-completion llama-gguf-split llama-server)
tc_init "llama.cpp $LLAMA_CPP_COMMIT" "$PREFIX" "bash toolchains/setup-llama-cpp.sh"

source_stage() {
  local dl="$PREFIX/src.partial"
  rm -rf "$dl" "$PREFIX/llama.cpp"
  mkdir -p "$dl"
  "$PYTHON" -m pip download --no-deps --no-binary :all: -d "$dl" "llama-cpp-python==$LCPP_PY_VERSION"
  local sdist="$dl/llama_cpp_python-$LCPP_PY_VERSION.tar.gz"
  echo "$LCPP_SDIST_SHA256  $sdist" | sha256sum -c -
  tar -xzf "$sdist" -C "$dl"
  mv "$dl/llama_cpp_python-$LCPP_PY_VERSION/vendor/llama.cpp" "$PREFIX/llama.cpp"
  rm -rf "$dl"
}

build_stage() {
  # only the tools modelmint runs; static, CPU, portable (GGML_NATIVE=OFF), no network features. The build
  # tree is kept until `install`, so an interrupted build resumes where ninja stopped.
  cmake -S "$PREFIX/llama.cpp" -B "$PREFIX/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_BUILD_COMMIT="$LLAMA_CPP_COMMIT" -DLLAMA_BUILD_NUMBER="$LLAMA_CPP_BUILD_NUMBER"
  cmake --build "$PREFIX/build" -j "$JOBS" --target "${TOOLS[@]}"
}

install_stage() {
  rm -rf "$PREFIX/bin.partial"
  mkdir -p "$PREFIX/bin.partial"
  local t
  for t in "${TOOLS[@]}"; do cp "$PREFIX/build/bin/$t" "$PREFIX/bin.partial/"; done
  rm -rf "$PREFIX/bin"
  mv "$PREFIX/bin.partial" "$PREFIX/bin"
  rm -rf "$PREFIX/build"
}

venv_stage() {
  # torch pinned in the same command (unpinned, pip pulls CUDA wheels). tc_pip keeps pip's installation report of
  # each install (every wheel's URL and sha256) for the provenance of the GGUFs the converter makes.
  rm -rf "$PREFIX/venv" "$PREFIX/pip-reports"
  "$PYTHON" -m venv "$PREFIX/venv"
  "$PREFIX/venv/bin/pip" install --upgrade pip
  tc_pip "$PREFIX/venv" "torch==$CONVERTER_TORCH" "transformers==$CONVERTER_TRANSFORMERS" \
    "numpy>=2.2.6,<3" "sentencepiece>=0.1.98,<0.3.0" "protobuf>=4.21.0,<5.0.0" safetensors tokenizers
  tc_pip "$PREFIX/venv" "$PREFIX/llama.cpp/gguf-py"
}

check_stage() {
  # llama-quantize has no --version; the others must report the pinned commit. Output is captured first and
  # matched afterwards: a reader that exits early would kill a tool that writes its version in two writes.
  local b
  for b in llama-completion llama-perplexity llama-imatrix llama-server llama-gguf-split; do
    tc_output_has "commit $LLAMA_CPP_COMMIT" "$PREFIX/bin/$b" --version
  done
  tc_output_has Q4_K_M "$PREFIX/bin/llama-quantize" --help
  "$PREFIX/venv/bin/python" "$PREFIX/llama.cpp/convert_hf_to_gguf.py" --help >/dev/null
  echo "checks passed: ${TOOLS[*]}, convert_hf_to_gguf.py"
}

tc_begin "$@"
tc_require cmake ninja g++ -- cmake ninja-build g++
tc_stage source "llama.cpp $LLAMA_CPP_COMMIT sources (llama-cpp-python $LCPP_PY_VERSION sdist, sha256 checked)" source_stage
tc_stage build "compile ${#TOOLS[@]} llama.cpp tools (-j $JOBS; about 8 min on 2 cores)" build_stage
tc_stage install "install the tools into $PREFIX/bin" install_stage
tc_stage venv "converter venv (torch $CONVERTER_TORCH CPU, transformers $CONVERTER_TRANSFORMERS)" venv_stage
tc_stage check "check the tools and the converter" check_stage
tc_done
