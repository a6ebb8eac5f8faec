#!/usr/bin/env bash
# The 10 Mbit/s failure schedule's runs at 100 Mbit/s (../elastic-schedule-gpt-10mbit/run.sh): fault-free, elastic
# rounds, torchft's DiLoCo with its own fault tolerance and the restart of every worker, under a fault every 30 s on
# nodes 1-3 in turn.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
out=docs/benchmarks/elastic-schedule-gpt-100mbit
scalesgd testbed up --nodes 4 --bandwidth 100mbit --prefix eh
trap 'scalesgd testbed down --prefix eh' EXIT
train=(--workers 4 --model gpt --dataset text --samples 16384 --epochs 2 --local-steps 16 --codec fp8
       --outer-momentum 0.5 --eval-every 32)
# fault-free, elastic and torchft measured in one session, in turn seed by seed (2026-12-01 at 60023f0: a joining
# launch forks its worker itself), fault-free stopped at the target; the restart measured 2026-11-29 (RESTART=1 runs
# it again; its figures and the 2026-11-30 session's are in earlier/); each run kept as runs/MODE-SEED.json and reused
# by a later call
for seed in ${SEEDS:-0 1 2}; do
  scalesgd bench elastic-schedule --prefix eh --modes fault-free --seeds "$seed" --until-target --limit-s 600 \
    --out $out -- "${train[@]}"
  for mode in elastic torchft; do
    scalesgd bench elastic-schedule --prefix eh --modes $mode --seeds "$seed" --limit-s 600 --out $out -- "${train[@]}"
  done
  if [[ -n "${RESTART:-}" ]]; then  # seed 1 was given 600 s, seeds 0 and 2 240 s (4x elastic's time then)
    scalesgd bench elastic-schedule --prefix eh --modes restart --seeds "$seed" --limit-s "${RESTART_LIMIT_S:-240}" \
      --out $out -- "${train[@]}"
  fi
done
scalesgd bench elastic-schedule --kept-only --modes fault-free,elastic,torchft${RESTART:+,restart} --seeds 0,1,2 \
  --out $out \
  -- "${train[@]}"
rm -r $out/runs/*/
