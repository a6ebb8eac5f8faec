#!/usr/bin/env bash
# Each rank's peak memory and training state, DDP against the sharded engine (every rank's shard, and 2 shards a node
# replicated across nodes), on a 101 M-parameter GPT with AdamW at 4 sequences a rank (where the state, not the
# activations, is most of a rank's memory): 2 nodes x 2 processes on the testbed at 1 Gbit/s, one run a mode (a
# rank's peak resident set, and its part above what the process held before data and model, as CUDA's allocator
# counts only tensors; the spread is over the 4 ranks). Each mode twice: glibc's malloc as it comes, which keeps
# freed blocks below its moving mmap threshold (up to 32 MiB) in the heap, and with MALLOC_MMAP_THRESHOLD_=131072,
# every block above 128 KiB returned to the system when freed.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
text=$(python -c "import typing; print(typing.__file__)")  # a small file every machine has: evaluations stay short
out=docs/benchmarks/fsdp-memory-gpt101m
[ ! -f $out/raw.tar.xz ] || tar -xJf $out/raw.tar.xz -C $out  # the runs packed below: finished ones are kept
scalesgd testbed up --nodes 2 --procs-per-node 2 --bandwidth 1gbit --prefix fm
trap 'scalesgd testbed down --prefix fm' EXIT
for seed in 0; do
  for alloc in "" 131072; do
  for mode in "ddp:--engine ddp --codec fp32" "fsdp:--engine scalesgd-fsdp --codec fp32" "fsdp-node:--engine scalesgd-fsdp --shard node --codec fp32"; do
    name=${mode%%:*}${alloc:+-mmap}; args=${mode#*:}
    [ -f $out/$name-seed$seed/summary.json ] && continue
    rm -rf $out/$name-seed$seed
    scalesgd testbed run --prefix fm -- env ${alloc:+MALLOC_MMAP_THRESHOLD_=$alloc} scalesgd train --model gpt --dataset text --data-file "$text" --samples 48 --batch-size 16 \
      --epochs 1 --gpt-layers 8 --gpt-width 1024 --gpt-heads 8 --seed $seed $args --run-dir $out/$name-seed$seed --quiet
  done
  done
done
python - "$out" <<'PY'
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
rows = {s.parent.name.rsplit("-seed", 1)[0]: json.loads(s.read_text())["memory"] for s in out.glob("*/summary.json")}
for name, m in sorted(rows.items()):  # one run a mode: the spread is over its 4 ranks
    base = rows["ddp-mmap" if name.endswith("-mmap") else "ddp"]  # DDP with the same allocator
    ddp = statistics.median(base["peak_mb"])
    ddp_own = statistics.median(p - b for p, b in zip(base["peak_mb"], base["before_mb"]))
    peaks, state = sorted(m["peak_mb"]), sorted(m["state_mb"])
    own = sorted(p - b for p, b in zip(m["peak_mb"], m["before_mb"]))
    print(f"{name}: peak {statistics.median(peaks):.0f} MiB a rank ({peaks[0]:.0f}-{peaks[-1]:.0f}), "
          f"{statistics.median(peaks) / ddp:.2f}x DDP's median peak; above the process before data and model "
          f"{statistics.median(own):.0f} MiB ({own[0]:.0f}-{own[-1]:.0f}), {statistics.median(own) / ddp_own:.2f}x "
          f"DDP's; parameters and optimizer state {statistics.median(state):.0f} MiB ({state[0]:.0f}-{state[-1]:.0f})")
PY
# pack the runs into raw.tar.xz (results.txt is the summary above)
(cd $out && tar -cf - *-seed0 | xz -9e > raw.tar.xz && rm -r *-seed0)
