#!/usr/bin/env bash
# The soak: elastic rounds on the failure schedule (a fault every 30 s on nodes 1-3 in turn: SIGKILL, node frozen
# 20 s, link down 20 s) for a run of 24 epochs (6,144 steps, over 30 minutes at 10 Mbit/s): it must end exit 0 with
# every member of its last round on the same global state.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
out=docs/benchmarks/elastic-soak-gpt-10mbit
scalesgd testbed up --nodes 4 --bandwidth 10mbit --prefix eg
trap 'scalesgd testbed down --prefix eg' EXIT
scalesgd bench elastic-schedule --prefix eg --modes elastic --seeds 0 --limit-s 3000 --out $out -- --workers 4 \
  --model gpt --dataset text --samples 16384 --epochs 24 --local-steps 16 --codec fp8 --outer-momentum 0.5
rm -r $out/runs/*/
