#!/usr/bin/env bash
# Set up .venv/ (if needed), then run linters, type checks and the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/ensure_redis.sh
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/pytest "$@"
