#!/usr/bin/env bash
# DiLoCo's outer optimizer on the default GPT (256 steps of AdamW at batch 64, 2 local workers, seed 0): final
# validation loss per (H, outer lr, outer momentum[, epochs]); DDP fp32's on the same run is 2.2649.
set -euo pipefail
cd "$(dirname "$0")/../../.."
for args in "16 0.7 0.9 1" "16 1.0 0 1" "16 1.0 0.5 1" "8 1.0 0 1" "32 1.0 0 1" "16 0.7 0.5 1" "16 1.5 0 1" "16 2.0 0 1" \
            "16 0.7 0.5 2"; do
  set -- $args
  d=${OUT:-/tmp/diloco-outer}/h$1-lr$2-m$3-ep$4
  [ -f "$d/summary.json" ] || scalesgd train --workers 2 --model gpt --dataset text --samples 16384 --epochs "$4" \
    --local-steps "$1" --outer-lr "$2" --outer-momentum "$3" --run-dir "$d" --quiet
  echo "H=$1 outer_lr=$2 outer_momentum=$3 epochs=$4 final_test_loss=$(python -c "import json; print(round(json.load(open('$d/summary.json'))['final_test_loss'], 4))")"
done
# the runs behind results.txt are packed in raw.tar.xz here: OUT=DIR reuses them after tar -xJf raw.tar.xz -C DIR
