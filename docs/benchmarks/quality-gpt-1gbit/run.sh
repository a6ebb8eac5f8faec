#!/usr/bin/env bash
# 1 Gbit/s, seeds 0-2; the reference (DDP fp32 on local workers) was copied from ../quality-gpt-10mbit-3seeds.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
out=docs/benchmarks/quality-gpt-1gbit
[ ! -f $out/raw.tar.xz ] || tar -xJf $out/raw.tar.xz -C $out  # the runs packed below: finished ones are kept
scalesgd testbed up --nodes 2 --bandwidth 1gbit --prefix q1g
trap 'scalesgd testbed down --prefix q1g' EXIT
scalesgd bench quality --rates 1gbit --prefix q1g --seeds 0,1,2 --eval-every 16 --budget 3 \
  --exchanges "ddp;ddp-fp16;fp16;fp8;diloco-h16-fp8-2x=--local-steps 16 --codec fp8 --outer-momentum 0.5 --epochs 2;\
torchft-h50-2x=--peer torchft --local-steps 50 --outer-momentum 0.5 --epochs 2" \
  --table src/scalesgd/sim/steps_to_target.json \
  --out $out -- --workers 2 --model gpt --dataset text --samples 16384 --epochs 1
# pack the raw output (every run, the reference and quality.json) into raw.tar.xz; quality.md and .png stay readable
tar -C $out -cf - quality.json reference 1gbit | xz -9e > $out/raw.tar.xz && (cd $out && rm -r quality.json reference 1gbit)
