#!/usr/bin/env bash
# dense-80g on 2x2xA100-40G: TP 2 x PP 2, 1 replica(s) (written by `modelmint plan --out`)
# every machine the same GPU type
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
MODELS="${MODELS:-/models}"  # the host folder holding dense-80g (modelmint pull NAME:TAG --dest)
IMAGE=vllm/vllm-openai:v0.32.0
case "${1:-}" in
  head)
    docker run -d --name dense-80g-ray --gpus all --network host --ipc=host -v "$MODELS:/models:ro" -v "$HERE/vllm.yaml:/config/vllm.yaml:ro" --entrypoint /bin/bash "$IMAGE" -c "ray start --head --port=6379 --num-gpus=2 --block"
    until docker exec dense-80g-ray python3 -c 'import ray, sys; ray.init(address="auto", logging_level="ERROR"); sys.exit(sum(n["Alive"] for n in ray.nodes()) < 2)'; do sleep 5; done
    docker exec -d dense-80g-ray vllm serve --config /config/vllm.yaml --port 8000
    echo "serving dense-80g on port 8000 of this machine" ;;
  worker)
    [ -n "${2:-}" ] || { echo "usage: $0 worker HEAD_IP" >&2; exit 2; }
    docker run -d --name dense-80g-ray --gpus all --network host --ipc=host -v "$MODELS:/models:ro" -v "$HERE/vllm.yaml:/config/vllm.yaml:ro" --entrypoint /bin/bash "$IMAGE" -c "ray start --address=$2:6379 --num-gpus=2 --block" ;;
  *)
    echo "usage: $0 head (on one machine), then $0 worker HEAD_IP on the 1 other(s)" >&2
    exit 2 ;;
esac
