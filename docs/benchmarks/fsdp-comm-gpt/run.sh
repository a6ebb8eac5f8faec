#!/usr/bin/env bash
# The gradients' reduce-scatter, FSDP2's own (--engine fsdp2) against ours (--engine scalesgd-fsdp, the codec on
# FSDP2's custom reduce-scatter), fp32 and bf16, and ours in fp8 (relative to the gathered weights, summed around a
# ring), 2 nodes x 2 processes sharding a 13 M-parameter GPT (4 blocks of 512), at
# 1 Gbit/s and 100 Mbit/s: each node's link bytes per step and the median step time, one run a mode and rate.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
text=$(python -c "import typing; print(typing.__file__)")  # a small file every machine has: evaluations stay short
out=docs/benchmarks/fsdp-comm-gpt
[ ! -f $out/raw.tar.xz ] || tar -xJf $out/raw.tar.xz -C $out  # the runs packed below: finished ones are kept
trap 'scalesgd testbed down --prefix fc' EXIT
for rate in 1gbit 100mbit; do
  scalesgd testbed up --nodes 2 --procs-per-node 2 --bandwidth $rate --prefix fc
  for mode in fsdp2-fp32 scalesgd-fsdp-fp32 fsdp2-bf16 scalesgd-fsdp-bf16 scalesgd-fsdp-fp8; do
    dir=$out/$rate/${mode#scalesgd-}  # ours in folders fsdp-CODEC, as raw.tar.xz has them (the engine's earlier name)
    [ -f $dir/summary.json ] && continue
    rm -rf $dir
    scalesgd testbed run --prefix fc -- scalesgd train --model gpt --dataset text --data-file "$text" --samples 768 --batch-size 64 \
      --epochs 1 --gpt-layers 4 --gpt-width 512 --gpt-heads 8 --eval-every 12 --engine ${mode%-*} --codec ${mode##*-} \
      --compress-after 0 --run-dir $dir --quiet  # (fp8 from the first step; the casts have no dense start)
  done
  scalesgd testbed down --prefix fc
done
python - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for summary in sorted(out.glob("*/*/summary.json")):
    s = json.loads(summary.read_text())
    evals = [json.loads(line) for line in (summary.parent / "metrics.jsonl").read_text().splitlines()]
    last = [e for e in evals if e["kind"] == "eval"][-1]
    steps = last["iter"]
    print(f"{summary.parent.parent.name} {summary.parent.name}: {last['link_bytes_sent'] / steps / 2**20:.1f} MiB a "
          f"step on the node's link, step {s['iteration']['median_iteration_s']:.2f} s (median of "
          f"{s['iteration']['iterations']}), validation loss {s['final_test_loss']:.4f}")
PY
# pack the runs into raw.tar.xz (results.txt is the summary above)
tar -C $out -cf - 100mbit 1gbit | xz -9e > $out/raw.tar.xz && rm -r $out/100mbit $out/1gbit
