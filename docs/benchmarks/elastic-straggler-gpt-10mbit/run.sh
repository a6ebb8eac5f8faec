#!/usr/bin/env bash
# A straggler: the failure schedule's GPT on 4 testbed nodes at 10 Mbit/s without faults, node 1's worker held by a
# cgroup's CPU quota to half its share of the cores all run: elastic rounds planning its steps by its pace
# (elastic-slow), the same with a grace window instead (elastic-slow-grace, seed 0), lockstep rounds
# (fault-free-slow), against the all-fast run (fault-free). Each run stops once it reaches the target.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
out=docs/benchmarks/elastic-straggler-gpt-10mbit
scalesgd testbed up --nodes 4 --bandwidth 10mbit --prefix eg
trap 'scalesgd testbed down --prefix eg' EXIT
train=(--workers 4 --model gpt --dataset text --samples 16384 --epochs 2 --local-steps 16 --codec fp8
       --outer-momentum 0.5 --eval-every 32)
# measured 2026-11-30, lockstep (fault-free-slow) 2026-11-29 (each run kept as runs/MODE-SEED.json and reused by a later call)
for seed in 0 1 2; do
  for mode in fault-free elastic-slow fault-free-slow; do
    scalesgd bench elastic-schedule --prefix eg --modes $mode --seeds $seed --until-target --limit-s 900 --out $out \
      -- "${train[@]}"
  done
done
scalesgd bench elastic-schedule --prefix eg --modes elastic-slow-grace --seeds 0 --until-target --limit-s 900 \
  --out $out -- "${train[@]}"
scalesgd bench elastic-schedule --kept-only --modes fault-free,elastic-slow,elastic-slow-grace,fault-free-slow \
  --seeds 0,1,2 --out $out -- "${train[@]}"
rm -r $out/runs/*/
