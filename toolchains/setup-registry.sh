#!/usr/bin/env bash
# Install Debian's docker-registry (the CNCF distribution registry, 2.8) for `modelmint registry serve` and the tests
# of `modelmint publish` and `modelmint pull --from-registry`: they start it themselves on 127.0.0.1 with their own
# storage and config, and stop it by its pid; and skopeo, the independent OCI client the tests read published
# images with. Idempotent: does nothing when both are already on PATH. The package's own service is not used
# (nothing touches /etc/docker/registry or /var/lib/docker-registry). `--check` checks them.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
tc_init "the distribution registry" "$TC_HOME/toolchains/docker-registry" "bash toolchains/setup-registry.sh"
tc_require docker-registry skopeo -- docker-registry skopeo
ver=$(docker-registry --version 2>&1)
if [[ ${1:-} == --check ]]; then
  [[ $ver == *" 2."* ]] || { echo "error: $ver is not distribution 2.x, which the tests were written against" >&2; exit 1; }
  skopeo --version >/dev/null || { echo "error: skopeo does not run" >&2; exit 1; }
  echo "checks passed: $ver; $(skopeo --version)"
  exit 0
fi
echo "  registry ready: $ver"
