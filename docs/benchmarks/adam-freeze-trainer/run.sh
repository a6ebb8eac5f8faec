#!/usr/bin/env bash
# Every run of trainer.py behind docs/results.md#adam-freeze, one after another, appended to results.jsonl.
set -euo pipefail
cd "$(dirname "$0")"
run() { torchrun --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 29731 trainer.py "$@" 2>/dev/null \
        | grep '^{' >> results.jsonl; }
for seed in 0 1 2; do
  run --exchange ddp --seed "$seed"
  run --exchange onebit --freeze default --seed "$seed"
  run --exchange topk-momentum --freeze default --seed "$seed"
done
run --exchange onebit --freeze warmup --seed 0
run --exchange topk-momentum --freeze warmup --seed 0
