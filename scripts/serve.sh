#!/usr/bin/env bash
# Installs what is missing, builds the release preset and starts kiln-server with the embedded
# default model (checkpoints/kiln-brown: a 16 M-parameter Llama with an MTP head, trained on the
# Brown Corpus; its README.md is the model card) loaded as "default": gRPC on 127.0.0.1:50051,
# the OpenAI-compatible HTTP API on http://127.0.0.1:8000/v1. Extra arguments go to kiln-server.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

export CCACHE_DIR=${CCACHE_DIR:-$PWD/build/ccache}
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target kiln kiln-server

root=$PWD/checkpoints
model=$root/kiln-brown
echo "kiln: try, from another terminal (the README shows what they print):"
echo "  build/release/clients/kiln generate --model default --prompt 'In the spring of 1961,' \\"
echo "      --max_tokens 60 --temperature 0.7 --top_p 0.9 --seed 3"
echo "  curl -s http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\"
echo "      -d '{\"model\": \"default\", \"prompt\": \"The jury said\", \"max_tokens\": 40, \"temperature\": 0.7, \"top_p\": 0.9, \"seed\": 3}'"
exec build/release/server/kiln-server --listen 127.0.0.1:50051 --http-listen 127.0.0.1:8000 \
  --model-root "$root" --model "default=$model" "$@"
