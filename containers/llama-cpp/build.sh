#!/usr/bin/env bash
# The llama.cpp image's compile: the same cmake configuration as toolchains/setup-llama-cpp.sh's build stage
# (tests/test_images_files.py checks that the flags agree), with CUDA when asked. Runs inside the image build and,
# unchanged, on any machine with cmake, ninja, g++ (and the CUDA toolkit for GGML_CUDA=1), no podman needed:
#
#   GGML_CUDA=1 CMAKE_CUDA_ARCHITECTURES=90 bash containers/llama-cpp/build.sh SRC_DIR OUT_DIR
#
# SRC_DIR: llama.cpp's tree (the pinned sdist's vendor/llama.cpp; the host toolchain keeps it under
# $MODELMINT_HOME/toolchains/llama.cpp-*/llama.cpp). OUT_DIR/bin gets the tools; OUT_DIR/build is the build tree,
# kept so an interrupted compile resumes where ninja stopped.
# GGML_CUDA=0 (default): the CPU build, byte-for-byte the host toolchain's. GGML_CUDA=1: ggml's CUDA backend for
# CMAKE_CUDA_ARCHITECTURES (default "80;86;89;90": A100/A800, A10/RTX 30, L4/L20/RTX 40, H100/H200).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../../toolchains/llama-cpp.env
source "$here/../../toolchains/llama-cpp.env"
src=${1:?usage: build.sh SRC_DIR OUT_DIR}
out=${2:?usage: build.sh SRC_DIR OUT_DIR}
GGML_CUDA=${GGML_CUDA:-0}
JOBS=${JOBS:-$(nproc)}
TOOLS=(llama-quantize llama-perplexity llama-imatrix llama-completion llama-gguf-split llama-server)
[[ -f $src/CMakeLists.txt ]] || { echo "error: $src is not llama.cpp's source tree (no CMakeLists.txt)" >&2; exit 1; }
cuda=()
if [[ $GGML_CUDA == 1 ]]; then
  command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]] ||
    { echo "error: GGML_CUDA=1 needs the CUDA toolkit (nvcc not on PATH nor in /usr/local/cuda/bin)" >&2; exit 1; }
  cuda=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES:-80;86;89;90}")
  [[ -x /usr/local/cuda/bin/nvcc ]] && cuda+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
fi
t0=$SECONDS
cmake -S "$src" -B "$out/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_BUILD_COMMIT="$LLAMA_CPP_COMMIT" -DLLAMA_BUILD_NUMBER="$LLAMA_CPP_BUILD_NUMBER" "${cuda[@]}"
cmake --build "$out/build" -j "$JOBS" --target "${TOOLS[@]}"
mkdir -p "$out/bin.partial"
for t in "${TOOLS[@]}"; do cp "$out/build/bin/$t" "$out/bin.partial/"; done
rm -rf "${out:?}/bin"
mv "$out/bin.partial" "$out/bin"
echo "built ${TOOLS[*]} (GGML_CUDA=$GGML_CUDA${cuda:+ ${cuda[*]}}) into $out/bin in $((SECONDS - t0)) s"
