#!/usr/bin/env bash
# qwen2-5-7b-q4-k-m on 1x4xRTX4090-24G: TP 1 x PP 1, 4 replica(s) (written by `modelmint plan --out`)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
MODELS="${MODELS:-/models}"  # the host folder holding qwen2.5-7b-q4_k_m.gguf (modelmint pull NAME:TAG --dest)
IMAGE=vllm/vllm-openai:v0.32.0
docker run -d --name qwen2-5-7b-q4-k-m-0 --gpus '"device=0"' --ipc=host -p 8000:8000 -v "$MODELS:/models:ro" -v "$HERE/vllm.yaml:/config/vllm.yaml:ro" "$IMAGE" --config /config/vllm.yaml
docker run -d --name qwen2-5-7b-q4-k-m-1 --gpus '"device=1"' --ipc=host -p 8001:8000 -v "$MODELS:/models:ro" -v "$HERE/vllm.yaml:/config/vllm.yaml:ro" "$IMAGE" --config /config/vllm.yaml
docker run -d --name qwen2-5-7b-q4-k-m-2 --gpus '"device=2"' --ipc=host -p 8002:8000 -v "$MODELS:/models:ro" -v "$HERE/vllm.yaml:/config/vllm.yaml:ro" "$IMAGE" --config /config/vllm.yaml
docker run -d --name qwen2-5-7b-q4-k-m-3 --gpus '"device=3"' --ipc=host -p 8003:8000 -v "$MODELS:/models:ro" -v "$HERE/vllm.yaml:/config/vllm.yaml:ro" "$IMAGE" --config /config/vllm.yaml
echo "serving qwen2-5-7b-q4-k-m on ports 8000..8003"
