#!/usr/bin/env bash
# Install a Go compiler (Debian's golang-go) for the template renderer in pipelines/gorender/.
# Idempotent: does nothing when `go` is already on PATH. The renderer itself is built on first use,
# into $MODELMINT_HOME/toolchains/gorender-<hash of main.go>/, by pipelines/gorender.py.
set -euo pipefail
if command -v go >/dev/null 2>&1; then
  echo "go ready: $(go version)"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "go is not installed and apt-get is not available: install Go >= 1.19 and put it on PATH" >&2
  exit 1
fi
apt-get update -q
apt-get install -y -q --no-install-recommends golang-go
echo "go ready: $(go version)"
