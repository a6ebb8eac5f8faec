#!/usr/bin/env bash
# 100 Mbit/s over seeds 0-2 for the fastest of each kind; seed 0's runs and the reference (DDP fp32 on local
# workers) were copied from ../quality-gpt-100mbit and ../quality-gpt-10mbit-3seeds.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
out=docs/benchmarks/quality-gpt-100mbit-3seeds
[ ! -f $out/raw.tar.xz ] || tar -xJf $out/raw.tar.xz -C $out  # the runs packed below: finished ones are kept
scalesgd testbed up --nodes 2 --bandwidth 100mbit --prefix q100
trap 'scalesgd testbed down --prefix q100' EXIT
scalesgd bench quality --rates 100mbit --prefix q100 --seeds 0,1,2 --eval-every 16 --budget 3 \
  --exchanges "ddp-fp16;fp8;diloco-h16-fp8-2x=--local-steps 16 --codec fp8 --outer-momentum 0.5 --epochs 2;\
torchft-h50-2x=--peer torchft --local-steps 50 --outer-momentum 0.5 --epochs 2;auto=--exchange auto;auto-2x=--exchange auto --epochs 2;\
ddp-powersgd8;ddp-powersgd8-2x=--engine ddp --codec powersgd --rank 8 --epochs 2" \
  --table src/scalesgd/sim/steps_to_target.json \
  --out $out -- --workers 2 --model gpt --dataset text --samples 16384 --epochs 1
# pack the raw output (every run, the reference and quality.json) into raw.tar.xz; quality.md and .png stay readable
tar -C $out -cf - quality.json reference 100mbit | xz -9e > $out/raw.tar.xz && (cd $out && rm -r quality.json reference 100mbit)
