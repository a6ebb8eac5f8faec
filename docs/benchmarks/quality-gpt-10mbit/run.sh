#!/usr/bin/env bash
# Time to quality of the default GPT (834 k parameters, AdamW, batch 64, 256 steps: its reference is DDP fp32 on local
# workers) on 2 nodes joined at 10 Mbit/s: DDP and its hooks, our per-step codecs, and periodic synchronisation
# (H = 16), on the same token budget and, marked 2x, on twice its steps. Needs root (network namespaces); about
# 45 minutes a seed on 2 cores, evaluations included.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
seeds=${SEEDS:-0}
scalesgd testbed up --nodes 2 --bandwidth 10mbit --prefix q10
trap 'scalesgd testbed down --prefix q10' EXIT
scalesgd bench quality --rates 10mbit --prefix q10 --seeds "$seeds" --eval-every 16 --budget 3 \
  --exchanges "ddp;ddp-fp16;ddp-powersgd4;fp8;onebit;diloco-h16=--local-steps 16 --codec fp32;\
diloco-h16-fp8=--local-steps 16 --codec fp8;\
diloco-h16-fp8-2x=--local-steps 16 --codec fp8 --outer-momentum 0.5 --epochs 2;\
streaming-h16-fp8-2x=--local-steps 16 --fragments 4 --overlap-steps 3 --codec fp8 --outer-momentum 0.5 --epochs 2" \
  --table src/scalesgd/sim/steps_to_target.json --out docs/benchmarks/quality-gpt-10mbit -- --workers 2 --model gpt --dataset text --samples 16384 --epochs 1
