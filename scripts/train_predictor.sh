#!/usr/bin/env bash
# Make the shipped predictor, predictor/default_model.pt and its metadata default_model.json (docs/predictor.md):
# train on the Mooncake conversation trace and the gateway recordings of the webarena and swe workloads.
#   scripts/train_predictor.sh            train on the recordings in predictor/recordings/ (about 20 s)
#   scripts/train_predictor.sh --record   record them afresh first (tiny model, two seeds each: about 17 min)
set -euo pipefail
cd "$(dirname "$0")/.."
TRACE="${AGENTSERVE_PREDICTOR_TRACE:-predictor/data/mooncake_conversation_trace.jsonl}"
RECORDINGS=predictor/recordings

record() {  # workload, seed, rate, tail seconds, then --append or nothing
  .venv/bin/python scripts/record_agent_sessions.py --workload "$1" --out "$RECORDINGS/$1.jsonl" --seed "$2" \
    --rate "$3" --arrivals 150 --tail "$4" "${@:5}"
}

if [[ "${1:-}" == "--record" ]]; then
  record webarena 0 0.5 60
  record webarena 1 0.5 60 --append
  record swe 0 0.4 75
  record swe 1 0.4 75 --append
elif [[ $# -gt 0 ]]; then
  echo "usage: $0 [--record]" >&2
  exit 2
fi

.venv/bin/agentserve predictor train --trace "$TRACE" "$RECORDINGS/webarena.jsonl" "$RECORDINGS/swe.jsonl" \
  --out predictor/default_model.pt --quiet
.venv/bin/agentserve predictor eval
