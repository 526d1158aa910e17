#!/usr/bin/env bash
# qwen2-5-7b-fp8 on 1x8xA800-80G: TP 1 x PP 1, 8 replica(s) (written by `modelmint plan --out`)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
MODELS="${MODELS:-/models}"  # the host folder holding qwen2-5-7b-fp8 (modelmint pull NAME:TAG --dest)
IMAGE=vllm/vllm-openai:v0.32.0
docker run -d --name qwen2-5-7b-fp8-1x8xa800-80g-0 --gpus '"device=0"' --ipc=host -p 8001:8000 -v "$MODELS:/models:ro" -v "$HERE/vllm.yaml:/config/vllm.yaml:ro" "$IMAGE" --config /config/vllm.yaml
docker run -d --name qwen2-5-7b-fp8-1x8xa800-80g-1 --gpus '"device=1"' --ipc=host -p 8002:8000 -v "$MODELS:/models:ro" -v "$HERE/vllm.yaml:/config/vllm.yaml:ro" "$IMAGE" --config /config/vllm.yaml
docker run -d --name qwen2-5-7b-fp8-1x8xa800-80g-2 --gpus '"device=2"' --ipc=host -p 8003:8000 -v "$MODELS:/models:ro" -v "$HERE/vllm.yaml:/config/vllm.yaml:ro" "$IMAGE" --config /config/vllm.yaml
docker run -d --name qwen2-5-7b-fp8-1x8xa800-80g-3 --gpus '"device=3"' --ipc=host -p 8004:8000 -v "$MODELS:/models:ro" -v "$HERE/vllm.yaml:/config/vllm.yaml:ro" "$IMAGE" --config /config/vllm.yaml
docker run -d --name qwen2-5-7b-fp8-1x8xa800-80g-4 --gpus '"device=4"' --ipc=host -p 8005:8000 -v "$MODELS:/models:ro" -v "$HERE/vllm.yaml:/config/vllm.yaml:ro" "$IMAGE" --config /config/vllm.yaml
docker run -d --name qwen2-5-7b-fp8-1x8xa800-80g-5 --gpus '"device=5"' --ipc=host -p 8006:8000 -v "$MODELS:/models:ro" -v "$HERE/vllm.yaml:/config/vllm.yaml:ro" "$IMAGE" --config /config/vllm.yaml
docker run -d --name qwen2-5-7b-fp8-1x8xa800-80g-6 --gpus '"device=6"' --ipc=host -p 8007:8000 -v "$MODELS:/models:ro" -v "$HERE/vllm.yaml:/config/vllm.yaml:ro" "$IMAGE" --config /config/vllm.yaml
docker run -d --name qwen2-5-7b-fp8-1x8xa800-80g-7 --gpus '"device=7"' --ipc=host -p 8008:8000 -v "$MODELS:/models:ro" -v "$HERE/vllm.yaml:/config/vllm.yaml:ro" "$IMAGE" --config /config/vllm.yaml
docker run -d --name qwen2-5-7b-fp8-1x8xa800-80g-router --network host -v "$HERE/docker-nginx.conf:/etc/nginx/nginx.conf:ro" nginx:1.27
echo "serving qwen2-5-7b-fp8 on port 8000: nginx in front of 8 replicas on ports 8001..8008"
