#!/usr/bin/env bash
# Install a Go compiler (Debian's golang-go) for the Ollama template renderer in pipelines/gorender/ (and the
# tests' blob client in tests/goblob/). Idempotent: does nothing when `go` is already on PATH. Each program is
# built on first use, into $MODELMINT_HOME/toolchains/NAME-<hash of its sources>/, by pipelines/core/gobuild.py.
# `--check` checks it.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
tc_init "Go" "$TC_HOME/toolchains/go" "bash toolchains/setup-go.sh"
tc_require go -- golang-go
ver=$(go version)
if [[ ${1:-} == --check ]]; then
  # the renderer's go.mod needs Go >= 1.19
  minor=$(sed -E 's/.*go1\.([0-9]+).*/\1/' <<<"$ver")
  ((minor >= 19)) || { echo "error: $ver is older than Go 1.19, which pipelines/gorender/go.mod needs" >&2; exit 1; }
  echo "checks passed: $ver"
  exit 0
fi
echo "  Go ready: $ver"
