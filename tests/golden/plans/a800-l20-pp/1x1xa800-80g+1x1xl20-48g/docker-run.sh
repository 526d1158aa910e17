#!/usr/bin/env bash
# qwen2-5-32b on 1x1xA800-80G+1x1xL20-48G: TP 1 x PP 2, 1 replica(s) (written by `modelmint plan --out`)
# run `head` on the A800-80G machine (the first stage), `worker` on each L20-48G one
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
MODELS="${MODELS:-/models}"  # the host folder holding qwen2-5-32b (modelmint pull NAME:TAG --dest)
IMAGE=vllm/vllm-openai:v0.32.0
case "${1:-}" in
  head)
    docker run -d --name qwen2-5-32b-ray --gpus all --network host --ipc=host -v "$MODELS:/models:ro" -v "$HERE/vllm.yaml:/config/vllm.yaml:ro" -e VLLM_PP_LAYER_PARTITION=41,23 --entrypoint /bin/bash "$IMAGE" -c "ray start --head --port=6379 --num-gpus=1 --block"
    until docker exec qwen2-5-32b-ray python3 -c 'import ray, sys; ray.init(address="auto", logging_level="ERROR"); sys.exit(sum(n["Alive"] for n in ray.nodes()) < 2)'; do sleep 5; done
    docker exec -d qwen2-5-32b-ray vllm serve --config /config/vllm.yaml --port 8000
    echo "serving qwen2-5-32b on port 8000 of this machine" ;;
  worker)
    [ -n "${2:-}" ] || { echo "usage: $0 worker HEAD_IP" >&2; exit 2; }
    docker run -d --name qwen2-5-32b-ray --gpus all --network host --ipc=host -v "$MODELS:/models:ro" -v "$HERE/vllm.yaml:/config/vllm.yaml:ro" -e VLLM_PP_LAYER_PARTITION=41,23 --entrypoint /bin/bash "$IMAGE" -c "ray start --address=$2:6379 --num-gpus=1 --block" ;;
  *)
    echo "usage: $0 head (on one machine), then $0 worker HEAD_IP on the 1 other(s)" >&2
    exit 2 ;;
esac
