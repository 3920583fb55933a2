#!/usr/bin/env bash
# On a machine with a CUDA GPU: the GPU tests (engine against transformers on the device, KV from GPU to GPU over
# shm and tcp), decode step times against the attention paths (scripts/gpu_steps.py), then the agent benchmark's
# SLO-rate search with every engine on the GPU. Figures go to OUT_DIR.
#   bash scripts/gpu_check.sh OUT_DIR [`agentserve bench` arguments, by default a short search:
#                                      --max-probes 4 --probe-duration 10: 12 probes of about 36 s on one H200]
# WORKLOAD (swe), MODEL (small) and DTYPE (bfloat16) choose the run; each point's requests are on disk as soon as
# it ends (OUT_DIR/<workload>/requests), so a run cut short keeps what it measured.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu_check.sh OUT_DIR [bench arguments]}
shift
[ $# -gt 0 ] || set -- --max-probes 4 --probe-duration 10
mkdir -p "$out"
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
"$PY" -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print(torch.cuda.get_device_name())' \
    || exit 2
"$PY" -m pytest -q -p no:cacheprovider tests/engine/test_cuda.py 2>&1 | tee "$out/tests.txt"
"$PY" scripts/gpu_steps.py "$out/steps.json" --model "${MODEL:-small}" --dtype "${DTYPE:-bfloat16}" 2>&1 \
    | tee "$out/steps.txt"
for workload in ${WORKLOAD:-swe}; do
    "$PY" -m gateway.cli bench --workload "$workload" --model "${MODEL:-small}" \
        --env AGENTSERVE_ENGINE_DEVICE=cuda --env "AGENTSERVE_ENGINE_DTYPE=${DTYPE:-bfloat16}" \
        --out "$out/$workload" "$@" 2>&1 | tee "$out/bench-$workload.log"
done
