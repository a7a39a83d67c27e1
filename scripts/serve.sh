#!/usr/bin/env bash
# Installs what is missing, builds the release preset, writes the embedded default model (a
# small deterministic model made by `kiln synth`, with a byte-level BPE tokenizer) and starts
# kiln-server with it loaded as "default": gRPC on 127.0.0.1:50051, the OpenAI-compatible HTTP
# API on http://127.0.0.1:8000/v1. Extra arguments go to kiln-server.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

export CCACHE_DIR=${CCACHE_DIR:-$PWD/build/ccache}
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target kiln kiln-server

root=$PWD/models-cache
model=$root/kiln-tiny
# Written again when missing or older than its chat template.
if ! grep -qs chat_template "$model/tokenizer_config.json"; then
  build/release/clients/kiln synth --preset kiln-tiny --dtype bf16 --out "$model"
fi
echo "kiln: try, from another terminal:"
echo "  build/release/clients/kiln generate --model default --prompt 'The kiln is' --max_tokens 32"
echo "  curl -s http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\"
echo "    -d '{\"model\": \"default\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 16}'"
exec build/release/server/kiln-server --listen 127.0.0.1:50051 --http-listen 127.0.0.1:8000 \
  --model-root "$root" --model "default=$model" "$@"
