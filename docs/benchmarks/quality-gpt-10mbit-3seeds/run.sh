#!/usr/bin/env bash
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate  # seed 0's runs were copied from ../quality-gpt-10mbit (ddp-powersgd4 and ddp-powersgd8-2x too)
out=docs/benchmarks/quality-gpt-10mbit-3seeds
[ ! -f $out/raw.tar.xz ] || tar -xJf $out/raw.tar.xz -C $out  # the runs packed below: finished ones are kept
scalesgd testbed up --nodes 2 --bandwidth 10mbit --prefix q10
trap 'scalesgd testbed down --prefix q10' EXIT
scalesgd bench quality --rates 10mbit --prefix q10 --seeds 0,1,2 --eval-every 16 --budget 3 \
  --exchanges "ddp;ddp-fp16;ddp-powersgd4;ddp-powersgd8;diloco-h16-fp8-2x=--local-steps 16 --codec fp8 --outer-momentum 0.5 --epochs 2;\
streaming-h16-fp8-2x=--local-steps 16 --fragments 4 --overlap-steps 3 --codec fp8 --outer-momentum 0.5 --epochs 2;\
torchft-h50-2x=--peer torchft --local-steps 50 --outer-momentum 0.5 --epochs 2;\
torchft-streaming-h16-2x=--peer torchft --local-steps 16 --fragments 4 --overlap-steps 3 --outer-momentum 0.5 --epochs 2;\
auto-2x=--exchange auto --epochs 2;ddp-powersgd8-2x=--engine ddp --codec powersgd --rank 8 --epochs 2" \
  --table src/scalesgd/sim/steps_to_target.json \
  --out $out -- --workers 2 --model gpt --dataset text --samples 16384 --epochs 1
# pack the raw output (every run, the reference and quality.json) into raw.tar.xz; quality.md and .png stay readable
tar -C $out -cf - quality.json reference 10mbit | xz -9e > $out/raw.tar.xz && (cd $out && rm -r quality.json reference 10mbit)
