#!/usr/bin/env bash
# The default GPT on 4 testbed nodes at 10 Mbit/s under a fault every 30 s (a worker SIGKILLed, a node frozen 20 s,
# a link down 20 s, in turn on nodes 1-3): fault-free (with and without --elastic), elastic rounds, and the restart of
# every worker.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
out=docs/benchmarks/elastic-schedule-gpt-10mbit
scalesgd testbed up --nodes 4 --bandwidth 10mbit --prefix eg
trap 'scalesgd testbed down --prefix eg' EXIT
# measured 2026-11-29 with SEEDS=0; SEEDS=0,1,2 adds seeds 1 and 2 (runs/MODE-0.json reused)
scalesgd bench elastic-schedule --prefix eg --modes fault-free,elastic-fault-free,elastic,restart --seeds "${SEEDS:-0,1,2}" --limit-s 900 \
  --out $out -- --workers 4 --model gpt --dataset text --samples 16384 --epochs 2 --local-steps 16 --codec fp8 \
  --outer-momentum 0.5 --eval-every 32
# the runs' directories (checkpoints, metrics) are not kept: elastic-schedule.json holds what the table reads
rm -r $out/runs/*/  # each run kept as runs/MODE-SEED.json: a later call with more seeds reuses it
