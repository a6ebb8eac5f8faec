#!/usr/bin/env bash
# On the lent H200 (the device tool, from the repository's root): the CUDA tests after the periodic rounds, the
# membership and the sharded engine's adapter landed, and what a DiLoCo round adds to a GPT's step on the GPU
# (periodic-gpu/overhead.py, as measured before them). Writes into $OUT.
set -u
out=${OUT:-/tmp/gpu-h200-rounds}
mkdir -p "$out"
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  python3 -c "import torch, platform; print(torch.__version__, torch.cuda.get_device_name(), platform.python_version())"
} > "$out/device.txt" 2>&1
export PYTHONPATH=src PYTHONUNBUFFERED=1
start=$(date +%s)
timeout 420 python3 -m pytest -m cuda tests -q -p no:cacheprovider > "$out/pytest-cuda.txt" 2>&1
echo "exit $? after $(( $(date +%s) - start )) s" >> "$out/pytest-cuda.txt"
timeout 120 python3 docs/benchmarks/periodic-gpu/overhead.py --device cuda --layers 8 --width 512 --steps 60 \
  > "$out/overhead.jsonl" 2> "$out/overhead.err"
echo "overhead exit $?" >> "$out/overhead.err"
tail -3 "$out/pytest-cuda.txt"; cat "$out/overhead.jsonl"
