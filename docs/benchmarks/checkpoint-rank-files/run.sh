#!/usr/bin/env bash
# A periodic GPT run's checkpoints on 2 nodes x 1 at 10 Mbit/s: each rank's own state gathered to rank 0 (BEFORE, a
# commit) against each rank writing its own file (this tree); three runs each. Usage: run.sh BEFORE_COMMIT [OUT]
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
before=$1; out=${2:-docs/benchmarks/checkpoint-rank-files/runs}; mkdir -p "$out"
tree=$(mktemp -d); git worktree add -q --detach "$tree/before" "$before"
scalesgd testbed up --nodes 2 --bandwidth 10mbit --prefix ck > /dev/null
trap 'scalesgd testbed down --prefix ck > /dev/null; git worktree remove --force "$tree/before"' EXIT
for n in 1 2 3; do
  for side in before after; do
    src=$([ $side = before ] && echo "$tree/before/src" || echo "$PWD/src")
    PYTHONPATH=$src scalesgd testbed run --prefix ck -- scalesgd train --run-dir "$out/$side-$n" --model gpt \
      --dataset text --samples 4096 --epochs 2 --local-steps 16 --codec fp8 --outer-momentum 0.5 --quiet
    python - "$out/$side-$n" <<'PY' >> "$out/../results.jsonl"
import json, pathlib, sys
run = pathlib.Path(sys.argv[1]); s = json.loads((run / "summary.json").read_text())
print(json.dumps({"run": run.name, "checkpoint_bytes": (run / "checkpoint.pt").stat().st_size,
                  "rank_file_bytes": sum(f.stat().st_size for f in run.glob("ranks-*/*.pt")),
                  **{k: s[k] for k in ("wall_time_s", "startup_s", "train_s", "bytes_sent", "final_test_loss")}}))
PY
  done
done
