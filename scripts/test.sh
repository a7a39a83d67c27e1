#!/usr/bin/env bash
# Runs every test: installs what is missing, builds the `dev` preset and runs the suite, then
# the same suite under AddressSanitizer + UndefinedBehaviorSanitizer (`asan` preset).
# KILN_TEST_PRESETS="dev" limits the presets.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

jobs=$(nproc)
export CCACHE_DIR=${CCACHE_DIR:-$PWD/build/ccache}
for preset in ${KILN_TEST_PRESETS:-dev asan}; do
  echo "== $preset: configure and build"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j "$jobs"
  echo "== $preset: test"
  ctest --preset "$preset" -j "$jobs" --timeout 900
done
