#!/bin/sh
# Container entrypoint. No arguments, or arguments that start with "-": kiln-server with the
# config in $KILN_CONFIG plus those arguments (flags override the config's settings; --model and
# --model-root add to its lists). Anything else is a command to run as is (kiln, kiln-loadgen, sh).
set -eu
case "${1:-}" in
  "" | -*) exec kiln-server --config "${KILN_CONFIG:-/etc/kiln/server.textproto}" "$@" ;;
  *) exec "$@" ;;
esac
