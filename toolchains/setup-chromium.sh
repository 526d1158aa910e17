#!/usr/bin/env bash
# Install Debian's chromium for the registry site's browser test (tests/test_site_browser.py): the test starts it
# headless itself, speaks the Chrome DevTools protocol to it over --remote-debugging-pipe (no port, no driver), and
# stops it by its pid. Only the tests need it; the main job does not. Idempotent: does nothing when chromium is
# already on PATH. `--check` checks that it runs headless and reports a version.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
tc_init "chromium (headless, for the site's browser test)" "$TC_HOME/toolchains/chromium" "bash toolchains/setup-chromium.sh"
tc_require chromium -- chromium
# captured first, then matched: a pipe into grep under pipefail can fail on SIGPIPE (docs: shared notes)
# (Debian's launcher script may print a warning of its own first: the version is its last line)
ver=$(chromium --headless --no-sandbox --version 2>&1 || true)
ver=${ver##*$'\n'}
if [[ ${1:-} == --check ]]; then
  [[ $ver == Chromium\ [0-9]* ]] || { echo "error: chromium --version printed '$ver', not a Chromium version; reinstall it: apt-get install --reinstall chromium" >&2; exit 1; }
  echo "checks passed: $ver"
  exit 0
fi
echo "  chromium ready: $ver"
