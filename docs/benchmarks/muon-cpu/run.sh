#!/usr/bin/env bash
# What torch's Muon costs on this CPU: one step() beside AdamW's and SGD's (one thread), and the default GPT trained
# one short epoch on 8 local workers under adamw and muon, 3 runs each, taking turns (tokens a second: the run's own).
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
here=docs/benchmarks/muon-cpu
scalesgd bench optimizer --model gpt --optimizers sgd,adamw,muon --out $here/step
for run in 1 2 3; do
  for optimizer in adamw muon; do
    dir=$(mktemp -d)
    scalesgd train --workers 8 --model gpt --dataset text --samples 2048 --epochs 1 --batch-size 64 \
      --optimizer $optimizer --run-dir "$dir" > "$dir.log" 2>&1
    python - "$dir" "$optimizer" "$run" "$dir.log" <<'PY' | tee -a $here/train.jsonl
import json, sys
run_dir, optimizer, run, log = sys.argv[1:]
epoch = [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl") if '"kind": "epoch"' in line][-1]
warned = [line.strip() for line in open(log) if "orthogonalises in bf16" in line]
print(json.dumps({"optimizer": optimizer, "run": int(run), "tokens_per_s": round(epoch["tokens_per_s"], 1),
                  "test_loss": round(epoch["test_loss"], 4), "warned": warned[:1]}))
PY
    rm -r "$dir" "$dir.log"
  done
done
