#!/usr/bin/env bash
# Build every image in containers/ with podman, in dependency order, tagged modelmint/NAME:VERSION (pyproject.toml's
# version); one line per step with its time, each build's own output in $MODELMINT_HOME/logs/images/NAME.log.
#
#   bash scripts/images.sh [NAME...]     NAME: llama-cpp llmcompressor prefect-worker vllm (default: all; a named
#                                        image brings the images it is built FROM)
#   bash scripts/images.sh base          only the Python base (pulled, or the local stand-in below)
#   bash scripts/images.sh --list        each image's directory and tag, one a line (needs no podman)
#
# What it does, in order:
#   1. podman, buildah, skopeo, runc, debootstrap: installed with apt-get when missing.
#   2. $MODELMINT_HOME/images/containers.conf (CONTAINERS_CONF): runc, not crun, and explicit ulimits (crun cannot
#      raise RLIMIT_NOFILE without CAP_SYS_RESOURCE and refuses cgroup v1 hybrid). /etc is never edited.
#   3. The Python base the Dockerfiles name (ARG PYTHON_IMAGE): used unchanged when present or pullable. Where it
#      cannot be pulled (no Docker Hub), a LOCAL STAND-IN is made: `debootstrap --variant=minbase bookworm` from
#      this machine's Debian mirror, `podman import`, then containers/base/Dockerfile.stand-in (Debian's Python 3.11,
#      `python`/`pip` on PATH), tagged with the real base's name and labelled modelmint.stand-in. It is for local
#      builds only: NEVER push it or an image built on it. It is rebuilt when missing or when its fingerprint label
#      (mirror, suite, Dockerfile.stand-in) differs.
#   4. Each image: the pins as build args read from toolchains/*.env (checked inside the build by
#      containers/check-pins.sh: a disagreeing pin fails the build, naming both); pip inside the build uses this
#      host's index configuration and CA bundle (pip config list, PIP_*, /etc/pip.conf; REQUESTS_CA_BUNDLE /
#      SSL_CERT_FILE) through read-only build mounts (podman build -v), never a layer; torch is the CPU wheel, from
#      a local wheel directory in that configuration or the CPU index (https://download.pytorch.org/whl/cpu) when
#      reachable, pinned in the same install command as everything else (toolchains/setup-*.sh).
#   5. Prints each image's size and build time.
# A build interrupted halfway resumes from its cached layers on the next run (podman keeps every finished layer).
# MODELMINT_IMAGES_NO_COMPILE=1: stop (exit 3) instead of building the llama-cpp image when its inputs changed since
# the cached one (the llama.cpp compile is 12-15 min on 2 cores: the nightly tier's job, not CI's images tier).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

MODELMINT_HOME=${MODELMINT_HOME:-$HOME/.cache/modelmint}
IMAGES_HOME=$MODELMINT_HOME/images
LOGS=$MODELMINT_HOME/logs/images
RERUN="bash scripts/images.sh${*:+ $*}"
mkdir -p "$IMAGES_HOME" "$LOGS"
start=$SECONDS

VERSION=$(awk -F'"' '/^version = /{print $2; exit}' pyproject.toml)
[[ -n $VERSION ]] || { echo "error: no version = \"…\" in pyproject.toml's [project]" >&2; exit 1; }

# directory under containers/ -> the image's name (the tags the Dockerfiles' comments and containers/k8s/ use)
declare -A NAME_OF=([llama-cpp]=modelmint/llama-cpp [llmcompressor]=modelmint/llmcompressor
  [prefect-worker]=modelmint/prefect-worker [vllm]=modelmint/vllm-cpu)

if [[ ${1:-} == --list ]]; then
  for d in llama-cpp llmcompressor prefect-worker vllm; do echo "$d ${NAME_OF[$d]}:$VERSION"; done
  exit 0
fi

step() { echo "  ✓ $1 ($((SECONDS - $2)) s)"; }
die() { echo "error: $1" >&2; shift; local l; for l in "$@"; do echo "  $l" >&2; done; exit 1; }

# ------------------------------------------------------------------------------------------------ 1. the tools
echo "• podman and its tools"
t0=$SECONDS
PKGS=(podman buildah skopeo runc debootstrap)
missing=()
for c in podman buildah skopeo runc debootstrap; do command -v "$c" >/dev/null 2>&1 || missing+=("$c"); done
if ((${#missing[@]})); then
  if ! command -v apt-get >/dev/null 2>&1; then
    die "building the images needs ${missing[*]}, which are not installed, and apt-get is not available" \
      "→ install ${PKGS[*]} with your package manager, then rerun: $RERUN"
  fi
  echo "  installing ${PKGS[*]} with apt-get (log: $LOGS/apt.log)"
  if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${PKGS[@]}"; } \
    >"$LOGS/apt.log" 2>&1; then
    die "apt-get could not install ${PKGS[*]} (log: $LOGS/apt.log)" "→ install them by hand, then rerun: $RERUN"
  fi
fi
step "podman $(podman --version | awk '{print $3}'), buildah, skopeo, runc, debootstrap" "$t0"

# ------------------------------------------------------------------------------------ 2. podman's configuration
t0=$SECONDS
export CONTAINERS_CONF=$IMAGES_HOME/containers.conf
cat >"$CONTAINERS_CONF.tmp" <<'EOF'
# written by scripts/images.sh (CONTAINERS_CONF points here; /etc/containers is left alone)
[containers]
# crun and podman's defaults raise RLIMIT_NOFILE/NPROC, which needs CAP_SYS_RESOURCE; explicit limits need nothing
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
# crun refuses this machine kind's cgroup v1 hybrid layout; runc runs
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
mv "$CONTAINERS_CONF.tmp" "$CONTAINERS_CONF"
GRAPHROOT=$(podman info --format '{{.Store.GraphRoot}}' 2>"$LOGS/podman-info.log") ||
  die "podman info failed: $(tail -n 3 "$LOGS/podman-info.log")" "→ check podman by hand: CONTAINERS_CONF=$CONTAINERS_CONF podman info"
step "containers.conf: runtime runc, explicit ulimits ($CONTAINERS_CONF); storage $GRAPHROOT" "$t0"

disk_full_or() { # LOG: the cause of a failed build, a full disk named with the storage path
  local log=$1 avail
  avail=$(df -Pk "$GRAPHROOT" 2>/dev/null | awk 'NR == 2 {print $4}') || avail=""
  if grep -qiE 'no space left on device|ENOSPC|disk quota exceeded' "$log" 2>/dev/null || [[ -n $avail && $avail -lt 1048576 ]]; then
    echo "the disk is full: ${avail:-?} KiB free on the filesystem holding podman's storage $GRAPHROOT" \
      "(podman info --format '{{.Store.GraphRoot}}'); free space there (podman system df; podman rmi the images" \
      "you do not need; not podman image prune, which also drops the build stages' cached layers, the llama.cpp" \
      "compile among them), then rerun: $RERUN (finished layers are kept)"
  else
    echo "see the last lines of the log below"
  fi
}

# ----------------------------------------------------------------------------------------------- 3. the base
BASE=$(sed -n 's/^ARG PYTHON_IMAGE=//p' containers/llama-cpp/Dockerfile)
for f in containers/*/Dockerfile; do
  b=$(sed -n 's/^ARG PYTHON_IMAGE=//p' "$f")
  [[ -z $b || $b == "$BASE" ]] || die "$f names base $b, containers/llama-cpp/Dockerfile $BASE: give them one base"
done
[[ $BASE == */* ]] && BASE_REF=$BASE || BASE_REF=docker.io/library/$BASE
# another name for the base (the tests make a missing or stale stand-in under a name of their own)
BASE_REF=${MODELMINT_IMAGES_BASE:-$BASE_REF}

mirror() { # the host's configured Debian mirror (one-line or deb822 sources)
  local m
  m=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
    awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /^(https?|file):/) {print $i; exit}}')
  [[ -n $m ]] || m=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
    awk 'tolower($1) == "uris:" && $2 !~ /security/ {print $2; exit}')
  echo "${m:-http://deb.debian.org/debian}"
}

label_of() { podman image inspect --format "{{ index .Labels \"$2\" }}" "$1" 2>/dev/null || true; }

ensure_base() {
  echo "• base image $BASE_REF"
  local t0=$SECONDS mirror fp rootfs have
  mirror=$(mirror)
  fp=$( { echo "bookworm minbase $mirror"; cat containers/base/Dockerfile.stand-in; } | sha256sum | cut -c1-16)
  if podman image exists "$BASE_REF"; then
    have=$(label_of "$BASE_REF" modelmint.stand-in.fingerprint)
    if [[ -z $have ]]; then
      step "$BASE_REF present (the real image, used unchanged)" "$t0"
      return 0
    elif [[ $have == "$fp" ]]; then
      step "$BASE_REF is the local stand-in (fingerprint $fp, up to date; never push it)" "$t0"
      return 0
    fi
    echo "  the local stand-in is stale (fingerprint $have, want $fp): rebuilding it"
  elif timeout 120 podman pull -q "$BASE_REF" >"$LOGS/base-pull.log" 2>&1; then
    step "$BASE_REF pulled (the real image, used unchanged)" "$t0"
    return 0
  else
    echo "  $BASE_REF cannot be pulled (log $LOGS/base-pull.log): making a local stand-in"
  fi
  local key
  key=$(echo "bookworm minbase $mirror" | sha256sum | cut -c1-16)
  rootfs=localhost/modelmint/bookworm-minbase:$key
  if ! podman image exists "$rootfs"; then
    # the debootstrapped tree is kept as a tarball beside containers.conf: a new or wiped storage imports it again
    local dir=$IMAGES_HOME/rootfs.partial tarball=$IMAGES_HOME/bookworm-minbase-$key.tar t1=$SECONDS
    if [[ ! -f $tarball ]]; then
      rm -rf "$dir"
      mkdir -p "$dir"
      echo "  debootstrap --variant=minbase bookworm from $mirror (about 2 min; log $LOGS/debootstrap.log)"
      debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$LOGS/debootstrap.log" 2>&1 ||
        die "debootstrap failed: $(disk_full_or "$LOGS/debootstrap.log")" "log: $LOGS/debootstrap.log" \
          "→ check the mirror ($mirror) is reachable, then rerun: $RERUN"
      tar -C "$dir" -cf "$tarball.partial" . && mv "$tarball.partial" "$tarball"
      rm -rf "$dir"
    fi
    podman import -q "$tarball" "$rootfs" >"$LOGS/import.log" 2>&1 ||
      die "podman import failed: $(disk_full_or "$LOGS/import.log")" "log: $LOGS/import.log" \
        "---- last lines ----" "$(tail -n 4 "$LOGS/import.log")"
    step "Debian bookworm minbase imported as $rootfs" "$t1"
  fi
  if ! podman build --network host -f containers/base/Dockerfile.stand-in --build-arg "ROOTFS=$rootfs" \
    --label "modelmint.stand-in=local stand-in for $BASE_REF made by scripts/images.sh: never push" \
    --label "modelmint.stand-in.fingerprint=$fp" -t "$BASE_REF" containers/base >"$LOGS/base.log" 2>&1; then
    die "building the stand-in base failed: $(disk_full_or "$LOGS/base.log")" "log: $LOGS/base.log" \
      "---- last lines ----" "$(tail -n 8 "$LOGS/base.log")"
  fi
  step "local stand-in $BASE_REF (fingerprint $fp; Debian's $(podman run --rm "$BASE_REF" python --version 2>&1); never push it)" "$t0"
}

# ------------------------------------------------------------------------------ 4. pip's configuration, mounted
# The host's pip settings as one pip.conf mounted at /etc/pip.conf for the build's RUN steps, with every local path
# it names (CA bundle, wheel directories, file:// indexes, constraints) mounted read-only under /run/modelmint-host.
# Build mounts are not part of any layer; the build's history records no value of them.
MOUNTS=()
pip_mounts() {
  local conf=$IMAGES_HOME/pip.conf cpu_index=https://download.pytorch.org/whl/cpu reach=0 line
  curl -fsS -o /dev/null --max-time 10 "$cpu_index/torch/" 2>/dev/null && reach=1
  python3 - "$conf.tmp" "$reach" "$cpu_index" >"$IMAGES_HOME/pip-mounts" <<'PY'
import configparser, os, re, subprocess, sys

out, reach, cpu_index = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
sections: dict[str, dict[str, str]] = {"global": {}}
env: dict[str, str] = {}
for line in listing.splitlines():
    m = re.match(r"^([^=]+?)\.([\w-]+)='(.*)'$", line)
    if not m:
        continue
    section, key, value = m.groups()
    (env if section == ":env:" else sections.setdefault(section, {}))[key] = value
sections["global"].update(env)  # PIP_* variables override the files, as in pip
g = sections["global"]
if "cert" not in g:
    for var in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        if os.environ.get(var):
            g["cert"] = os.environ[var]
            break
if reach:
    g["extra-index-url"] = " ".join([*g.get("extra-index-url", "").split(), cpu_index])
mounts: set[str] = set()


def local(token: str) -> str:
    path = token[len("file://"):] if token.startswith("file://") else token
    if not path.startswith("/") or not os.path.exists(path):
        return token
    path = os.path.realpath(path)
    # a PEP 503 index's pages link their files relatively (../../files/…): mount the directory above `simple`
    mounts.add(os.path.dirname(path) if os.path.basename(path) == "simple" else path)
    return ("file://" if token.startswith("file://") else "") + "/run/modelmint-host" + path


for values in sections.values():
    for key in ("cert", "client-cert", "find-links", "index-url", "extra-index-url", "constraint", "requirement"):
        if key in values:
            values[key] = " ".join(local(t) for t in values[key].split())
parser = configparser.RawConfigParser()
for name, values in sections.items():
    parser[name] = values
with open(out, "w", encoding="utf-8") as f:
    f.write("# scripts/images.sh: this host's pip settings, mounted read-only into image builds\n")
    parser.write(f)
for path in sorted(mounts):
    print(path)
PY
  mv "$conf.tmp" "$conf"
  MOUNTS=(-v "$conf:/etc/pip.conf:ro")
  while read -r line; do MOUNTS+=(-v "$line:/run/modelmint-host$line:ro"); done <"$IMAGES_HOME/pip-mounts"
  if ((reach)); then TORCH_NOTE="torch from the CPU index"; else TORCH_NOTE="the CPU index unreachable: torch from pip's configured wheel directories"; fi
}

# ------------------------------------------------------------------------------------------------ 5. the images
deps_of() { # the modelmint images a Dockerfile is built FROM
  local ref d
  for ref in $(sed -n 's/^FROM \(modelmint\/[^: ]*\).*/\1/p' "containers/$1/Dockerfile"); do
    for d in "${!NAME_OF[@]}"; do [[ ${NAME_OF[$d]} == "$ref" ]] && echo "$d"; done
  done
}
ORDER=()
add_in_order() {
  local d
  [[ " ${ORDER[*]} " == *" $1 "* ]] && return 0
  [[ -n ${NAME_OF[$1]:-} && -f containers/$1/Dockerfile ]] ||
    die "no image '$1' (containers/$1/Dockerfile)" "→ one of: ${!NAME_OF[*]}"
  for d in $(deps_of "$1"); do add_in_order "$d"; done
  ORDER+=("$1")
}
inputs_of() { # DIR ARGS…: fingerprint of what a build reads: its Dockerfile, every COPY source, its build args,
  # the base and the images it is built FROM
  local dir=$1 src
  shift
  {
    printf '%s\n' "$@"
    cat "containers/$dir/Dockerfile"
    for src in $(sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "containers/$dir/Dockerfile" |
      awk '$1 == "COPY" && $2 !~ /^--from/ {for (i = 2; i < NF; i++) if ($i !~ /^--/) print $i}'); do
      find "$src" -type f ! -path '*/__pycache__/*' -print0 2>/dev/null | LC_ALL=C sort -z | xargs -0r sha256sum
    done
    podman image inspect --format '{{.Id}}' "$BASE_REF" 2>/dev/null
    local d
    for d in $(deps_of "$dir"); do podman image inspect --format '{{.Id}}' "${NAME_OF[$d]}:$VERSION" 2>/dev/null; done
  } | sha256sum | cut -c1-16
}

build_image() {
  local dir=$1 tag="${NAME_OF[$1]}:$VERSION" log="$LOGS/$1.log" t0=$SECONDS args=() name value fp pid rc next
  echo "• $tag (containers/$dir/Dockerfile)"
  # the pins this Dockerfile declares, with toolchains/*.env's values; the project version
  for name in $(sed -n 's/^ARG \([A-Z0-9_]*\).*/\1/p' "containers/$dir/Dockerfile" | sort -u); do
    value=$(sed -n "s/^$name=//p" toolchains/*.env | tail -n 1)
    [[ -n $value ]] && args+=(--build-arg "$name=$value")
  done
  args+=(--build-arg "MODELMINT_VERSION=$VERSION" --build-arg "TORCH_CPU_INDEX=")
  fp=$(inputs_of "$dir" "${args[@]}")
  if [[ $dir == llama-cpp && ${MODELMINT_IMAGES_NO_COMPILE:-0} == 1 && "$(label_of "$tag" modelmint.inputs)" != "$fp" ]]; then
    echo "error: $tag needs the llama.cpp compile (its inputs changed since the cached image; 12-15 min on 2 cores)," \
      "left to the nightly tier: bash scripts/images.sh llama-cpp" >&2
    exit 3
  fi
  set +e -m
  podman build --network host --layers "${MOUNTS[@]}" "${args[@]}" --label "modelmint.inputs=$fp" \
    -f "containers/$dir/Dockerfile" -t "$tag" . >"$log" 2>&1 &
  pid=$!
  set +m
  trap 'kill -INT -- -$pid 2>/dev/null; wait $pid 2>/dev/null; echo; echo "  interrupted while building $tag: the finished layers are cached, a rerun resumes from them ($RERUN)" >&2; exit 130' INT TERM
  next=$((t0 + 60))
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if ((SECONDS >= next)); then
      next=$((next + 60))
      echo "      … $(grep -oE 'STEP [0-9]+/[0-9]+' "$log" | tail -n 1 || true) ($((SECONDS - t0)) s)"
    fi
  done
  wait "$pid"
  rc=$?
  trap - INT TERM
  set -e
  if ((rc != 0)); then
    {
      echo "error: building $tag failed (exit $rc) after $((SECONDS - t0)) s"
      echo "  cause: $(disk_full_or "$log")"
      grep -h '^error: ' "$log" | sed 's/^/  /' || true
      echo "  log:   $log"
      echo "  next:  fix the cause, then rerun: $RERUN (the finished layers are cached)"
      echo "  ---- last lines of $log ----"
      tail -n 12 "$log" | sed 's/^/  | /'
    } >&2
    exit 1
  fi
  local size
  size=$(podman image inspect --format '{{.Size}}' "$tag")
  step "$tag: $((size / 1000000)) MB, $(grep -c '^--> Using cache' "$log" || true) layers from cache" "$t0"
  SUMMARY+=("$(printf '%-36s %6d MB %5d s' "$tag" $((size / 1000000)) $((SECONDS - t0)))")
}

ensure_base
[[ ${1:-} == base ]] && exit 0
pip_mounts
echo "  pip in builds: this host's settings ($IMAGES_HOME/pip.conf, $((${#MOUNTS[@]} / 2)) read-only mounts); $TORCH_NOTE"
wanted=("$@")
((${#wanted[@]})) || wanted=(llama-cpp llmcompressor prefect-worker vllm)
for d in "${wanted[@]}"; do add_in_order "$d"; done
SUMMARY=()
for d in "${ORDER[@]}"; do build_image "$d"; done
echo "images (tag, size, build time):"
printf '  %s\n' "${SUMMARY[@]}"
[[ $(label_of "$BASE_REF" modelmint.stand-in) ]] &&
  echo "  built on the local stand-in of $BASE_REF: for this machine only, never push them"
echo "images done in $(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s"
