#!/usr/bin/env bash
# The fp8 kernels' one-time cost a process pays when it builds its first fp8 codec: compiled from a cold inductor
# cache, from the cache that compile left, and eager (SCALESGD_FP8_KERNELS=eager); 3 rounds. Import time apart.
#     bash docs/benchmarks/fp8-compile/run.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
probe='import sys, time
t = time.perf_counter()
from scalesgd.comm.codecs.fp8 import kernels
t1 = time.perf_counter()
k = kernels._Kernels()
k.table()
print(f"{sys.argv[1]}: import {t1 - t:.1f} s, kernels {time.perf_counter() - t1:.2f} s ({k.mode})", flush=True)'
for round in 1 2 3; do
  cache=$(mktemp -d)
  TORCHINDUCTOR_CACHE_DIR=$cache python -c "$probe" "cold$round"
  TORCHINDUCTOR_CACHE_DIR=$cache python -c "$probe" "warm$round"
  SCALESGD_FP8_KERNELS=eager python -c "$probe" "eager$round"
  rm -rf "$cache"
done 2>/dev/null | tee "$here/output.txt"
