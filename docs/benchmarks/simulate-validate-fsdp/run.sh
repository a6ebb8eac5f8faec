#!/usr/bin/env bash
# The sharded modes' cost model against the testbed's measured steps (docs/benchmarks/fsdp-comm-gpt: a 13 M-parameter
# GPT sharded over 2 nodes x 2 processes, five reduce-scatters at 1 Gbit/s and 100 Mbit/s): one worker's compute is
# taken from one point (ours in fp32 at 1 Gbit/s), the nine others are predicted by `scalesgd simulate` on gloo.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
out=docs/benchmarks/simulate-validate-fsdp
scratch=$(mktemp -d); trap 'rm -rf "$scratch"' EXIT
measured=$scratch/measured  # docs/benchmarks/fsdp-comm-gpt's runs, unpacked from its raw.tar.xz
mkdir "$measured" && tar -xJf docs/benchmarks/fsdp-comm-gpt/raw.tar.xz -C "$measured"
modes=fsdp2,scalesgd-fsdp,fsdp2-bf16,scalesgd-fsdp-bf16,scalesgd-fsdp-fp8
sim() {  # simulate at rate $1 with one worker's compute $2 seconds: mode → predicted step
  scalesgd simulate --model gpt --gpt-layers 4 --gpt-width 512 --gpt-heads 8 --gpt-block 64 --batch-per-worker 16 \
    --iteration-time "$2" --workers 4 --procs-per-node 2 --inter-bandwidth "$1" --inter-latency 0 \
    --intra-bandwidth 10gbit --intra-latency 0 --fsdp-backend gloo --modes $modes --json --out "$scratch"
}
step() { python -c "import json,sys; print(json.load(open('$measured/$1/$2/summary.json'))['iteration']['median_iteration_s'])"; }
# compute: what the measured fp32 step at 1 Gbit/s leaves after its predicted collectives (the model is linear in it)
comm=$(sim 1gbit 1 | python -c "import json,sys; r=json.load(sys.stdin)['rows']; print(next(x['iteration_s'] for x in r if x['mode']=='scalesgd-fsdp') - 1)")
compute=$(python -c "print($(step 1gbit fsdp-fp32) - $comm)")
echo "one worker's compute: $compute s (from 1gbit fsdp-fp32)"
for rate in 1gbit 100mbit; do
  sim $rate "$compute" > "$scratch/$rate.json"
  python - "$scratch/$rate.json" "$measured/$rate" "$rate" <<'PY'
import json, pathlib, sys
rows, measured = json.load(open(sys.argv[1]))["rows"], pathlib.Path(sys.argv[2])
names = {"fsdp2": "fsdp2-fp32", "scalesgd-fsdp": "fsdp-fp32"}  # the measured runs' folders: ours as fsdp-CODEC
for row in rows:
    run = names.get(row["mode"], row["mode"].removeprefix("scalesgd-"))
    step = json.loads((measured / run / "summary.json").read_text())["iteration"]["median_iteration_s"]
    print(f"{sys.argv[3]} {run}: measured {step:.2f} s, predicted {row['iteration_s']:.2f} s, "
          f"{100 * (row['iteration_s'] / step - 1):+.1f} %")
PY
done
