#!/usr/bin/env bash
# Set up .venv/ (if needed), then run agentserve. With no arguments it runs the main job: the gateway
# with its embedded engine, in-memory session store and the default model (configs/gateway.yaml).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "$#" -eq 0 ]; then
    set -- serve
fi
exec .venv/bin/agentserve "$@"
