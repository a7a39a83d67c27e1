#!/bin/sh
# Installs the Debian packages the image's build stage needs: the list in scripts/setup.sh (the
# one place it is kept) minus the packages only tests and benchmarks use.
# Usage: build-deps.sh scripts/setup.sh
set -eu
setup=${1:?usage: build-deps.sh path/to/scripts/setup.sh}

# Test-only: GoogleTest, libtorch (reference forward), promtool, the Python e2e client, numpy
# (the GGUF converter and its test).
exclude=" libgtest-dev googletest libtorch-dev prometheus python3-grpcio python3-protobuf python3-numpy git "

# The words of setup.sh's `packages=( ... )` array, comments dropped.
all=$(sed -n '/^packages=(/,/^)/p' "$setup" | sed -e 's/#.*//' -e 's/^packages=(//' -e 's/)$//' |
      tr -s ' \t' '\n' | sed '/^$/d')
packages=""
for package in $all; do
  case "$exclude" in *" $package "*) continue ;; esac
  packages="$packages $package"
done
case "$packages" in
  *libgrpc++-dev*) ;;
  *) echo "build-deps.sh: no package list found in $setup (did its format change?)" >&2; exit 1 ;;
esac

echo "build-deps:$packages"
apt-get update -qq
# shellcheck disable=SC2086 # a list of words
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $packages
rm -rf /var/lib/apt/lists/*
