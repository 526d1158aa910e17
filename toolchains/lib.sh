# Shared by the toolchain setup scripts (sourced, not run). A toolchain is built in stages, each marked when it
# finished, so a rerun does only what is missing; one lock per toolchain, so two setups on one machine wait for
# each other instead of building into the same directory; one line per stage with its time on the terminal,
# the tools' own output in a log file per stage; on failure: the stage, its log, the likely cause, what was
# kept, and the command to run next.
#
#   tc_init NAME PREFIX SCRIPT    NAME for messages, PREFIX the toolchain directory, SCRIPT the rerun command
#   tc_begin "$@"                 `--check`: run the script's check_stage on the installed toolchain and exit;
#                                 else exit when PREFIX is complete, or take the lock and return to build
#   tc_ready                      true (and says so) when PREFIX is complete: the fast path, no lock taken
#   tc_lock                       wait for any other setup of the same toolchain
#   tc_stage ID "what" FUNC …     run FUNC (under set -e, output to the stage's log) unless ID is marked done
#   tc_done                       mark the whole toolchain complete
#   tc_pip VENV ARG…              VENV/bin/pip install ARG…, keeping pip's installation report of it (every package
#                                 installed, its URL and sha256) as the next NN.json of PREFIX/pip-reports: the
#                                 provenance names the wheels that ran by digest from these
#   tc_output_has "TEXT" CMD …    run CMD, capture all its output, then look for TEXT (never a pipe into grep -q:
#                                 under pipefail an early-exiting reader kills a tool that writes twice)
#   tc_require CMD… -- PKG…       the commands must exist; installs the Debian packages when apt-get is there

TC_HOME=${MODELMINT_HOME:-$HOME/.cache/modelmint}

tc_init() {
  TC_NAME=$1 TC_PREFIX=$2 TC_RERUN=$3
  TC_MARKS="$TC_PREFIX/.stages"
  TC_LOGS="$TC_HOME/logs/setup/$(basename "$TC_PREFIX")"
  # fd 3: the terminal, for progress lines printed while a stage's own output goes to its log
  exec 3>&1
}

tc_ready() {
  if [[ -f "$TC_PREFIX/.complete" ]]; then
    echo "  $TC_NAME ready: $TC_PREFIX"
    return 0
  fi
  return 1
}

tc_begin() {
  if [[ ${1:-} == --check ]]; then
    [[ -f "$TC_PREFIX/.complete" ]] || { echo "error: $TC_PREFIX is not a finished toolchain; run: $TC_RERUN" >&2; exit 1; }
    check_stage
    exit 0
  fi
  tc_ready && exit 0
  tc_lock
  tc_ready && exit 0  # another setup finished it while this one waited
  return 0
}

tc_lock() {
  mkdir -p "$(dirname "$TC_PREFIX")"
  _tc_wait_lock 9 "$TC_PREFIX.lock" "another setup of $TC_NAME on this machine" "setup-"
}

_tc_wait_lock() { # FD LOCKFILE WHO PGREP: open LOCKFILE on FD (held until the script ends or closes it) and take it
  local fd=$1 lock=$2 who=$3 pattern=$4
  eval "exec $fd>\"\$lock\""
  flock -n "$fd" && return 0
  echo "  waiting for $who (lock $lock) …"
  flock -w "${TC_LOCK_WAIT_S:-7200}" "$fd" && return 0
  echo "error: $who has held $lock for over ${TC_LOCK_WAIT_S:-7200} s" >&2
  echo "  → if no setup is running (\`pgrep -af '$pattern'\`), rerun: $TC_RERUN" >&2
  exit 1
}

_tc_done_stages() {
  local f names=()
  for f in "$TC_MARKS"/*; do [[ -e $f ]] && names+=("$(basename "$f")"); done
  echo "${names[*]:-nothing}"
}

_tc_cause() {
  # The likely cause, from the stage's log: a full disk, an unreachable package index, or the log's tail.
  local log=$1 avail_kb
  # A full disk may not even get its message into the log (the log lives on it): ask the disk too.
  avail_kb=$(df -Pk "$TC_PREFIX" 2>/dev/null | awk 'NR == 2 {print $4}') || avail_kb=""
  if grep -qiE 'No space left on device|ENOSPC|Disk quota exceeded|not enough free space' "$log" 2>/dev/null ||
    [[ -n $avail_kb && $avail_kb -lt 16384 ]]; then
    echo "the disk is full (${avail_kb:-?} KiB free on the filesystem holding $TC_PREFIX); free space there," \
      "or point MODELMINT_HOME at a larger disk"
  elif grep -qiE 'Could not find a version that satisfies|No matching distribution|Failed to establish a new connection|Network is unreachable|Temporary failure in name resolution|Read timed out|ConnectionError|Connection refused|ProxyError|HTTP error 5[0-9][0-9]' "$log"; then
    echo "pip could not get a package from the index (network or index down, or the pinned version is not" \
      "served there); check the connection and pip's index settings (pip config list)"
  elif grep -qE 'Could not get lock|Unable to acquire the dpkg frontend lock' "$log"; then
    echo "another package manager (apt-get, dpkg, unattended-upgrades) held its lock (\`pgrep -af 'apt|dpkg'\`" \
      "names it); rerun when it is done"
  else
    echo "see the last lines of the log below"
  fi
}

_tc_interrupted() {
  [[ -n ${_tc_pid:-} ]] && { kill -TERM -- "-$_tc_pid" 2>/dev/null; wait "$_tc_pid" 2>/dev/null; }
  echo
  echo "  interrupted during: $_tc_what; the stages done so far are kept (rerun: $TC_RERUN)" >&3
  exit 130
}

tc_stage() {
  local id=$1 what=$2
  shift 2
  local mark="$TC_MARKS/$id" log="$TC_LOGS/$id.log"
  if [[ -f $mark ]]; then
    echo "  ✓ $what (done in an earlier run)"
    return 0
  fi
  mkdir -p "$TC_MARKS" "$TC_LOGS"
  local t0=$SECONDS rc pid last=""
  # The stage runs in a subshell under set -e (not in an `if`, where bash would ignore set -e); the loop below
  # shows the build's progress (ninja's [n/m]) or a heartbeat, every 30 s.
  # The stage gets its own process group (set -m), so Ctrl-C or a kill stops all of it (ninja, pip), not only
  # the subshell; the trap is in place before the stage starts.
  _tc_pid="" _tc_what=$what
  trap '_tc_interrupted' INT TERM
  set +e -m
  ( set -e; "$@" ) >"$log" 2>&1 &
  pid=$!
  _tc_pid=$pid
  set +m
  local next=$((t0 + 30)) step
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if ((SECONDS >= next)); then
      next=$((next + 30))
      step=$(grep -oE '^\[[0-9]+/[0-9]+\]' "$log" 2>/dev/null | tail -n 1) || true
      if [[ -n $step ]]; then
        [[ $step != "$last" ]] && echo "      … $what: $step compiled ($((SECONDS - t0)) s)" >&3
        last=$step
      else
        echo "      … $what ($((SECONDS - t0)) s)" >&3
      fi
    fi
  done
  wait "$pid"
  rc=$?
  trap - INT TERM
  set -e
  if (( rc != 0 )); then
    {
      echo "error: setting up $TC_NAME failed at stage '$id' ($what), exit $rc, after $((SECONDS - t0)) s"
      echo "  cause: $(_tc_cause "$log")"
      echo "  log:   $log"
      echo "  kept:  stages already done: $(_tc_done_stages) (a rerun starts at '$id')"
      echo "  next:  fix the cause, then rerun: $TC_RERUN"
      echo "  ---- last lines of $log ----"
      grep -v '^WARNING: Location ' "$log" | tail -n 15 | sed 's/^/  | /'
    } >&2
    exit "$rc"
  fi
  touch "$mark"
  echo "  ✓ $what ($((SECONDS - t0)) s)"
}

tc_done() {
  touch "$TC_PREFIX/.complete"
  echo "  $TC_NAME ready: $TC_PREFIX"
}

tc_pip() {
  local venv=$1 dir="$TC_PREFIX/pip-reports" n
  shift
  mkdir -p "$dir"
  n=$(find "$dir" -maxdepth 1 -name '[0-9][0-9].json' | wc -l)
  n=$(printf '%02d' $((n + 1)))
  # written under another name and renamed once pip has finished: a report is never half there
  rm -f "$dir/$n.json.partial"
  "$venv/bin/pip" install --report "$dir/$n.json.partial" "$@"
  mv "$dir/$n.json.partial" "$dir/$n.json"
}

tc_output_has() {
  local want=$1 out
  shift
  out=$("$@" 2>&1) || true
  if [[ $out != *"$want"* ]]; then
    echo "check failed: \`$*\` does not print '$want'; it printed:" >&2
    printf '%s\n' "$out" | tail -n 5 >&2
    return 1
  fi
}

tc_require() {
  local cmds=() pkgs=() missing=() c
  while (($#)) && [[ $1 != -- ]]; do cmds+=("$1"); shift; done
  (($#)) && shift
  pkgs=("$@")
  for c in "${cmds[@]}"; do command -v "$c" >/dev/null 2>&1 || missing+=("$c"); done
  ((${#missing[@]} == 0)) && return 0
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "error: $TC_NAME needs ${missing[*]}, which are not installed, and apt-get is not available" >&2
    echo "  → install them with your package manager (Debian/Ubuntu: ${pkgs[*]}), then rerun: $TC_RERUN" >&2
    exit 1
  fi
  mkdir -p "$TC_LOGS"
  local log="$TC_LOGS/apt.log" lock="$TC_HOME/apt.lock"
  # apt-get does not wait for dpkg's lock: two setups at once (the README's and the tests', or two checkouts) made
  # the second fail with "Could not get lock". Setups take turns on one lock (fd 8; tc_lock holds fd 9), look again
  # for what the other one may have installed meanwhile, and wait out anyone else's dpkg (DPkg::Lock::Timeout).
  _tc_wait_lock 8 "$lock" "another setup's apt-get" "apt-get|setup-"
  missing=()
  for c in "${cmds[@]}"; do command -v "$c" >/dev/null 2>&1 || missing+=("$c"); done
  if ((${#missing[@]} == 0)); then
    exec 8>&-
    return 0
  fi
  echo "  installing ${pkgs[*]} with apt-get (log: $log)"
  local wait=(-o DPkg::Lock::Timeout=600)
  if ! { apt-get "${wait[@]}" update -q &&
    DEBIAN_FRONTEND=noninteractive apt-get "${wait[@]}" install -y -q --no-install-recommends "${pkgs[@]}"; } \
    >"$log" 2>&1; then
    echo "error: apt-get could not install ${pkgs[*]}: $(_tc_cause "$log")" >&2
    echo "  log: $log" >&2
    echo "  → install them by hand, then rerun: $TC_RERUN" >&2
    exit 1
  fi
  exec 8>&-
}
