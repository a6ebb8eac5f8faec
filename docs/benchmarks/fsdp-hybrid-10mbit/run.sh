#!/usr/bin/env bash
# The hybrid layout (2 shards within each node, replicated across nodes) on 2 nodes x 2 processes whose nodes are
# joined at 10 Mbit/s: FSDP2's own (its cross-node all-reduce in bf16) against ours, fp8 across nodes every step and
# periodic synchronisation of the shards (DiLoCo, H 16, fp8 pseudo-gradients, twice the epochs: DiLoCo takes more
# steps to a loss, as in docs/results.md#time-to-quality). Seeds 0-2; for each seed the target is unsharded DDP
# fp32's final validation loss on loopback + 1 % (its time there, the compute-only bound); each run stops at 3x it.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
out=docs/benchmarks/fsdp-hybrid-10mbit
[ ! -f $out/raw.tar.xz ] || tar -xJf $out/raw.tar.xz -C $out  # the runs packed below: finished ones are kept
common=(--workers 4 --procs-per-node 2 --model gpt --dataset text --samples 8192 --batch-size 64 --eval-every 16
        --quiet)
for seed in 0 1 2; do
  dir=$out/seed$seed
  [ -f $dir/reference/summary.json ] || { rm -rf $dir/reference
    scalesgd train "${common[@]}" --seed $seed --run-dir $dir/reference; }
done
trap 'scalesgd testbed down --prefix h10' EXIT
scalesgd testbed up --nodes 2 --procs-per-node 2 --bandwidth 10mbit --prefix h10
for seed in 0 1 2; do
  dir=$out/seed$seed
  budget=$(python -c "import json; print(3 * json.load(open('$dir/reference/summary.json'))['train_s'])")
  while IFS='=' read -r label flags; do
    [ -f $dir/$label/summary.json ] && continue
    rm -rf $dir/$label
    # shellcheck disable=SC2086
    scalesgd testbed run --prefix h10 -- scalesgd train "${common[@]}" --seed $seed $flags --time-budget "$budget" \
      --run-dir $dir/$label
  done <<'MODES'
fsdp2-node-bf16=--engine fsdp2 --shard node --codec bf16
fsdp-node-fp8=--engine scalesgd-fsdp --shard node --codec fp8
fsdp-node-diloco-h16-fp8-2x=--engine scalesgd-fsdp --shard node --local-steps 16 --codec fp8 --outer-momentum 0.5 --epochs 4
MODES
done
python - "$out" <<'PY'
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
LABELS = ("fsdp2-node-bf16", "fsdp-node-fp8", "fsdp-node-diloco-h16-fp8-2x")
def evals(run):
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [e for e in lines if e["kind"] == "eval"]
def reached(run, target):
    return next((e["train_s"] for e in evals(run) if e["test_loss"] <= target), None)
times = {label: [] for label in LABELS}
for seed in sorted(out.glob("seed*")):
    target = json.loads((seed / "reference/summary.json").read_text())["final_test_loss"] * 1.01
    bound = reached(seed / "reference", target)
    print(f"{seed.name}: target {target:.4f} (DDP fp32's final loss on loopback + 1 %), reached there at {bound:.1f} s "
          "(the bound)")
    for label in LABELS:
        last, when = evals(seed / label)[-1], reached(seed / label, target)
        times[label].append(None if when is None else when / bound)
        shown = f"{when:.1f} s ({when / bound:.2f}x the bound)" if when is not None else "not reached"
        print(f"  {label}: target {shown}; last loss {last['test_loss']:.4f} at step {last['iter']}, "
              f"{last['link_bytes_sent'] / last['iter'] / 2**20:.3f} MiB a step on node 0's link")
for label, ratios in times.items():
    got = sorted(r for r in ratios if r is not None)
    spread = f"median {statistics.median(got):.2f}x the bound ({got[0]:.2f}-{got[-1]:.2f})" if got else "none"
    print(f"{label}: reached in {len(got)} of {len(ratios)} seeds; {spread}")
PY
# pack the runs into raw.tar.xz (results.txt is the summary above)
tar -C $out -cf - seed0 seed1 seed2 | xz -9e > $out/raw.tar.xz && rm -r $out/seed0 $out/seed1 $out/seed2
