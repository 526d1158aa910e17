#!/usr/bin/env bash
# qwen2.5-7b:q4_k_m: one Ollama instance per GPU on this 4-GPU machine, behind nginx on port 11434 (ollama/nginx.conf)
# `modelmint pull qwen2.5-7b:q4_k_m` creates it in Ollama
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$HERE/logs"
CUDA_VISIBLE_DEVICES=0 OLLAMA_HOST=127.0.0.1:11435 OLLAMA_KEEP_ALIVE=-1 OLLAMA_CONTEXT_LENGTH=8192 nohup ollama serve >"$HERE/logs/ollama-0.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 OLLAMA_HOST=127.0.0.1:11436 OLLAMA_KEEP_ALIVE=-1 OLLAMA_CONTEXT_LENGTH=8192 nohup ollama serve >"$HERE/logs/ollama-1.log" 2>&1 &
CUDA_VISIBLE_DEVICES=2 OLLAMA_HOST=127.0.0.1:11437 OLLAMA_KEEP_ALIVE=-1 OLLAMA_CONTEXT_LENGTH=8192 nohup ollama serve >"$HERE/logs/ollama-2.log" 2>&1 &
CUDA_VISIBLE_DEVICES=3 OLLAMA_HOST=127.0.0.1:11438 OLLAMA_KEEP_ALIVE=-1 OLLAMA_CONTEXT_LENGTH=8192 nohup ollama serve >"$HERE/logs/ollama-3.log" 2>&1 &
until curl -sf http://127.0.0.1:11435/api/version >/dev/null; do sleep 1; done
OLLAMA_HOST=127.0.0.1:11435 ollama create qwen2.5-7b:q4_k_m-ctx8192 -f "$HERE/Modelfile"  # the planned num_ctx
until curl -sf http://127.0.0.1:11435/api/version >/dev/null; do sleep 1; done
curl -sf http://127.0.0.1:11435/api/generate -d '{"model": "qwen2.5-7b:q4_k_m-ctx8192"}' >/dev/null
until curl -sf http://127.0.0.1:11436/api/version >/dev/null; do sleep 1; done
curl -sf http://127.0.0.1:11436/api/generate -d '{"model": "qwen2.5-7b:q4_k_m-ctx8192"}' >/dev/null
until curl -sf http://127.0.0.1:11437/api/version >/dev/null; do sleep 1; done
curl -sf http://127.0.0.1:11437/api/generate -d '{"model": "qwen2.5-7b:q4_k_m-ctx8192"}' >/dev/null
until curl -sf http://127.0.0.1:11438/api/version >/dev/null; do sleep 1; done
curl -sf http://127.0.0.1:11438/api/generate -d '{"model": "qwen2.5-7b:q4_k_m-ctx8192"}' >/dev/null
nginx -c "$HERE/nginx.conf" -p "$HERE"
echo "qwen2.5-7b:q4_k_m-ctx8192 on http://127.0.0.1:11434"
