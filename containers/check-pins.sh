#!/bin/sh
# Run inside an image build: each build arg that names a pin must equal toolchains/*.env's value, or the build
# stops here, naming both (scripts/images.sh passes the .env values; a hand-run build that overrides one lands here).
#   sh check-pins.sh ENV_FILE NAME...     (the build args arrive as environment variables of the RUN step)
set -eu
env_file=$1
shift
bad=0
for name in "$@"; do
  want=$(sed -n "s/^$name=//p" "$env_file" | tail -n 1)
  eval "got=\${$name-}"
  if [ -z "$want" ]; then
    echo "error: $name is not a pin in $env_file (the Dockerfile names a pin that toolchains/ does not have)" >&2
    bad=1
  elif [ "$got" != "$want" ]; then
    echo "error: build arg $name=$got disagrees with toolchains/$(basename "$env_file") ($name=$want);" \
      "build with the pins: bash scripts/images.sh (or change toolchains/$(basename "$env_file") and rebuild)" >&2
    bad=1
  fi
done
[ "$bad" = 0 ] || exit 1
echo "pins agree with toolchains/$(basename "$env_file"): $*"
