#!/usr/bin/env bash
# Installs what is missing, builds the release preset, writes the embedded default model
# (a small deterministic one made by `kiln synth`) and runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

export CCACHE_DIR=${CCACHE_DIR:-$PWD/build/ccache}
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target kiln

model=models-cache/kiln-tiny
if [[ ! -f $model/config.json ]]; then
  build/release/clients/kiln synth --preset kiln-tiny --dtype bf16 --out "$model"
fi
echo "kiln: default model ready at $model"
echo "try: build/release/clients/kiln run --model $model --prompt_ids 1,2,3,4,5 --max_tokens 32"
exec build/release/clients/kiln run --model "$model" --prompt_ids 1,2,3,4,5 --max_tokens 32 "$@"
