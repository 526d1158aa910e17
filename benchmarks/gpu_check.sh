#!/usr/bin/env bash
# One GPU check for modelmint: (1) the memory CUDA reports on this GPU and the non-torch memory of one process
# (what vLLM's profiler measures, vllm/utils/mem_utils.py MemorySnapshot), (2) llama.cpp at the pinned commit
# built with the llama-cpp image's CUDA flags, and one perplexity run offloaded to the GPU against the CPU figure.
# Run from the repository root on a GPU machine with torch, CMake, ninja and nvcc; $OUT receives the logs. It reads
# .devcheck/ (git-ignored), prepared on the build machine:
#   .devcheck/llama.cpp-src.tar.xz       the pinned llama.cpp tree (from the llama.cpp toolchain's llama.cpp/, without
#                                        .git, models, docs, tests, examples and the backends other than CPU and CUDA)
#   .devcheck/tiny-qwen2-q4_k_m.gguf     from `modelmint convert tiny-qwen2`; its CPU perplexity with the same
#                                        arguments is printed below for comparison
# Last run: 2026-12-04 on an H200 (tests/data/gpu_measurements/h200.json; CUDA PPL 1186.5164, CPU 1186.7428).
set -u
D=.devcheck
OUT=${OUT:-$D/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
t0=$SECONDS
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,compute_cap --format=csv
python3 - <<'PY' | tee "$OUT/cuda_memory.json"
import json, torch
free0, total = torch.cuda.mem_get_info()           # creates the CUDA context
x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
y = x @ x                                          # cuBLAS handle and workspace, as a model's first matmul
torch.cuda.synchronize()
free1, _ = torch.cuda.mem_get_info()
reserved = torch.cuda.memory_reserved()
p = torch.cuda.get_device_properties(0)
gib = 2**30
print(json.dumps({
    "name": p.name, "torch": torch.__version__, "cuda": torch.version.cuda,
    "compute_capability": f"{p.major}.{p.minor}",
    "total_memory_gib (torch.cuda.mem_get_info)": round(total / gib, 3),
    "properties_total_memory_gib": round(p.total_memory / gib, 3),
    "used_after_context_gib": round((total - free0) / gib, 3),
    "non_torch_after_first_matmul_gib": round((total - free1 - reserved) / gib, 3),
    "torch_reserved_gib": round(reserved / gib, 3),
}, indent=1))
PY
echo "== llama.cpp CUDA build ($((SECONDS - t0)) s)"
mkdir -p /tmp/l && tar -xJf $D/llama.cpp-src.tar.xz -C /tmp/l
command -v nvcc || export PATH=/usr/local/cuda/bin:$PATH
nvcc --version | tail -2
cmake -S /tmp/l/llama.cpp -B /tmp/l/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_COMMIT=0c1e570 -DLLAMA_BUILD_NUMBER=0 \
  -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
grep -i "cuda" "$OUT/cmake.log" | head -5
cmake --build /tmp/l/build -j 16 --target llama-perplexity llama-quantize > "$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log"; exit 1; }
echo "== built ($((SECONDS - t0)) s)"
/tmp/l/build/bin/llama-perplexity --version 2>&1 | tail -2
/tmp/l/build/bin/llama-perplexity -m $D/tiny-qwen2-q4_k_m.gguf -f pipelines/data/eval.txt -c 128 --chunks 8 -b 128 \
  -ngl 99 > "$OUT/ppl_gpu.log" 2>&1
grep -E "CUDA0|offload|Final estimate|error" "$OUT/ppl_gpu.log" | head -12
echo "CPU build, same file and arguments: Final estimate: PPL = 1186.7428 +/- 196.63920"
echo "== done ($((SECONDS - t0)) s)"
