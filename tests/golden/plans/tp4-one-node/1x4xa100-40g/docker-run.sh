#!/usr/bin/env bash
# dense-80g on 1x4xA100-40G: TP 4 x PP 1, 1 replica(s) (written by `modelmint plan --out`)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
MODELS="${MODELS:-/models}"  # the host folder holding dense-80g (modelmint pull NAME:TAG --dest)
IMAGE=vllm/vllm-openai:v0.32.0
docker run -d --name dense-80g-0 --gpus '"device=0,1,2,3"' --ipc=host -p 8000:8000 -v "$MODELS:/models:ro" -v "$HERE/vllm.yaml:/config/vllm.yaml:ro" "$IMAGE" --config /config/vllm.yaml
echo "serving dense-80g on port 8000"
