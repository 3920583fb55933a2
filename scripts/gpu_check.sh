#!/usr/bin/env bash
# On a machine with a CUDA GPU, what only such a machine settles, phase by phase. Each phase runs under a time limit
# of its own, so a slow one leaves the next its turn, and writes to OUT_DIR/<phase>/ as it ends.
#   PHASES="gateway profile validate" bash scripts/gpu_check.sh OUT_DIR
# gateway   `agentserve bench gateway --threads 1` on the host's own cores: the gateway's overhead (docs/gateway.md)
# profile   `agentserve profile` with the engine on the GPU: the simulator's calibration for it (docs/simulator.md)
# validate  `agentserve simulate --validate` on that calibration: real GPU runs against the simulator (VALIDATE_ARGS,
#           by default --repeats 1 --duration 40)
# tests     the GPU tests: the engine against transformers on the device, KV from GPU to GPU over shm and tcp
# steps     decode step times against the attention paths (scripts/gpu_steps.py)
# bench     the agent benchmark's SLO-rate search with every engine on the GPU (BENCH_ARGS, by default a short search:
#           --max-probes 4 --probe-duration 10, 12 probes of about 36 s on one H200)
# PHASES (all six, in this order), MODEL (small), DTYPE (bfloat16), WORKLOAD (swe) and LIMIT_<phase> (seconds)
# choose the run. A bench point's requests are on disk as soon as it ends, so a phase cut short keeps what it measured.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the project's packages, for scripts/ run as files too
out=${1:?usage: scripts/gpu_check.sh OUT_DIR}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
MODEL=${MODEL:-small} DTYPE=${DTYPE:-bfloat16}
declare -A limit=([gateway]=100 [profile]=200 [validate]=260 [tests]=120 [steps]=300 [bench]=600)

"$PY" -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print(torch.cuda.get_device_name())' \
    || exit 2

gpu=(env AGENTSERVE_ENGINE_DEVICE=cuda "AGENTSERVE_ENGINE_DTYPE=$DTYPE")

phase_command() {  # the phase's command, into the array `cmd`
    case $1 in
    gateway) cmd=("$PY" -m agentserve bench gateway --out "$2" --threads 1) ;;
    profile) cmd=("${gpu[@]}" "$PY" -m agentserve profile --model "$MODEL" --out "$2/calibration.json") ;;
    validate) cmd=("${gpu[@]}" "$PY" -m agentserve simulate --validate --out "$2"
                   --calibration "$out/profile/calibration.json" ${VALIDATE_ARGS:---repeats 1 --duration 40}) ;;
    tests) cmd=("$PY" -m pytest -q -p no:cacheprovider tests/engine/model/test_cuda.py) ;;
    steps) cmd=("$PY" scripts/gpu_steps.py "$2/steps.json" --model "$MODEL" --dtype "$DTYPE") ;;
    bench) cmd=("$PY" -m agentserve bench --workload "${WORKLOAD:-swe}" --model "$MODEL"
                --env AGENTSERVE_ENGINE_DEVICE=cuda --env "AGENTSERVE_ENGINE_DTYPE=$DTYPE" --out "$2"
                ${BENCH_ARGS:---max-probes 4 --probe-duration 10}) ;;
    *) echo "unknown phase $1" >&2; return 2 ;;
    esac
}

for phase in ${PHASES:-gateway profile validate tests steps bench}; do
    seconds=LIMIT_$phase
    seconds=${!seconds:-${limit[$phase]:-300}}
    mkdir -p "$out/$phase"
    phase_command "$phase" "$out/$phase" || continue
    echo "== $phase (at most $seconds s) $(date -u +%T)"
    started=$SECONDS
    PYTHONUNBUFFERED=1 timeout -k 10 "$seconds" "${cmd[@]}" 2>&1 | tee "$out/$phase/log.txt"
    echo "== $phase: status ${PIPESTATUS[0]} in $((SECONDS - started)) s"
done
