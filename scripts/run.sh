#!/usr/bin/env bash
# Set up .venv/ (if needed), then run agentserve. With no arguments it runs the main job:
# one request through the colocated engine on the default built-in model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "$#" -eq 0 ]; then
    set -- generate --model small --prompt "Summarise the tool output in one line:" --max-tokens 32 --json
fi
exec .venv/bin/agentserve "$@"
