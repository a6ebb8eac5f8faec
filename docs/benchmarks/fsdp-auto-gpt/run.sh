#!/usr/bin/env bash
# --exchange auto within the sharded engine: the 13 M-parameter GPT of docs/benchmarks/fsdp-comm-gpt (4 blocks of 512)
# sharded over 2 nodes x 2 processes at 1 Gbit/s and 100 Mbit/s, the codec of the shards' sums chosen among fp32,
# fp16, bf16 and fp8 at start-up; its choice, predicted step and measured median step beside the steps measured there
# for each codec run as given (one run a rate).
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
text=$(python -c "import typing; print(typing.__file__)")  # a small file every machine has: evaluations stay short
out=docs/benchmarks/fsdp-auto-gpt
[ ! -f $out/raw.tar.xz ] || tar -xJf $out/raw.tar.xz -C $out  # the runs packed below: finished ones are kept
trap 'scalesgd testbed down --prefix fa' EXIT
for rate in 1gbit 100mbit; do
  dir=$out/$rate
  [ -f $dir/summary.json ] && continue
  rm -rf $dir
  scalesgd testbed up --nodes 2 --procs-per-node 2 --bandwidth $rate --prefix fa
  scalesgd testbed run --prefix fa -- scalesgd train --model gpt --dataset text --data-file "$text" --samples 768 --batch-size 64 \
    --epochs 1 --gpt-layers 4 --gpt-width 512 --gpt-heads 8 --eval-every 12 --engine scalesgd-fsdp --exchange auto \
    --compress-after 0 --run-dir $dir --quiet
  scalesgd testbed down --prefix fa
done
measured=$(mktemp -d)  # fsdp-comm-gpt's runs: each codec as given (ours in folders fsdp-CODEC)
tar -xJf docs/benchmarks/fsdp-comm-gpt/raw.tar.xz -C "$measured"
python - "$out" "$measured" <<'PY'
import json, pathlib, sys
out, measured = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
for rate in ("1gbit", "100mbit"):
    s = json.loads((out / rate / "summary.json").read_text())
    chose = json.loads((out / rate / "auto.json").read_text())
    given = {run.name: json.loads((run / "summary.json").read_text())["iteration"]["median_iteration_s"]
             for run in sorted((measured / rate).glob("fsdp-*"))}
    print(f"{rate}: auto chose {chose['codec']} (predicted {chose['predicted_s']:.2f} s a step: "
          + ", ".join(f"{c['codec']} {c['iteration_s']:.2f}" for c in chose["candidates"])
          + f"); measured {s['iteration']['median_iteration_s']:.2f} s (median of {s['iteration']['iterations']}), "
          f"validation loss {s['final_test_loss']:.4f}; each codec as given there: "
          + ", ".join(f"{name} {step:.2f} s" for name, step in given.items()))
PY
rm -rf "$measured"
# pack the runs into raw.tar.xz (results.txt is the summary above)
tar -C $out -cf - 100mbit 1gbit | xz -9e > $out/raw.tar.xz && rm -r $out/100mbit $out/1gbit
