#!/usr/bin/env bash
# fp8's kernels eager against compiled in a periodic run (DiLoCo H 16): the default GPT on 4 testbed nodes at
# 100 Mbit/s, no faults, seed 0, each run stopped at the target; eager and compiled in turn, twice, in one session
# (2026-11-30, at 58026be: SCALESGD_FP8_KERNELS chose the path). Output: periodic-ab.txt.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
out=$(mktemp -d)
train=(--workers 4 --model gpt --dataset text --samples 16384 --epochs 2 --local-steps 16 --codec fp8
       --outer-momentum 0.5 --eval-every 32)
scalesgd testbed up --nodes 4 --bandwidth 100mbit --prefix eg
trap 'scalesgd testbed down --prefix eg' EXIT
for i in 1 2; do
  for k in eager compiled; do
    SCALESGD_FP8_KERNELS=$k scalesgd bench elastic-schedule --prefix eg --modes fault-free --seeds 0 --until-target \
      --limit-s 600 --out "$out/$k-$i" -- "${train[@]}"
  done
done
OUT=$out python - <<'PY' | tee docs/benchmarks/fp8-compile/periodic-ab.txt
import json, os
from scalesgd.bench.elastic.schedule import summarise
print("run: time to target s (wall, evaluations left out) | of it, training clock s | start to the first step s")
for k in ("eager-1", "compiled-1", "eager-2", "compiled-2"):
    r = summarise(json.load(open(f"{os.environ['OUT']}/{k}/runs/fault-free-0.json")), 2.2876)
    first = r["evals"][0]
    spans = sorted((e["at"] - e["eval_s"], e["at"]) for e in r["evaluations"])
    held = sum(max(0, min(first["at"], b) - a) for a, b in spans if a < first["at"])
    start = first["at"] - r["launched"] - held - first["train_s"]
    print(f"{k}: {r['to_target_s']:.1f} | {r['clock_to_target_s']:.1f} | {start:.1f}")
PY
