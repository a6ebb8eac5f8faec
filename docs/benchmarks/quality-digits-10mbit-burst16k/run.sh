#!/usr/bin/env bash
# The image classifier at 10 Mbit/s with the links' token bucket at 16 KB (13 ms of line rate) instead of 256 KB, so
# that a periodic round (78 KB in fp8, 312 KB in fp32) pays the link as on a real one; the reference (DDP fp32 on
# local workers) was copied from ../quality-digits-10mbit.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
out=docs/benchmarks/quality-digits-10mbit-burst16k
[ ! -f $out/raw.tar.xz ] || tar -xJf $out/raw.tar.xz -C $out  # the runs packed below: finished ones are kept
scalesgd testbed up --nodes 2 --bandwidth 10mbit --burst 16kb --prefix qb10
trap "scalesgd testbed down --prefix qb10" EXIT
scalesgd bench quality --rates 10mbit --prefix qb10 --seeds 0,1,2 --eval-every 6 --budget 3 \
  --exchanges "ddp-fp16;ddp-powersgd4;\
diloco-h10-fp8-2x=--local-steps 10 --codec fp8 --outer-momentum 0.5 --epochs 60;\
streaming-h10-fp8-2x=--local-steps 10 --fragments 2 --overlap-steps 2 --codec fp8 --outer-momentum 0.5 --epochs 60;\
diloco-h50-fp8-2x=--local-steps 50 --codec fp8 --outer-momentum 0.5 --epochs 60;\
torchft-h10-2x=--peer torchft --local-steps 10 --outer-momentum 0.5 --epochs 60;\
torchft-h50-2x=--peer torchft --local-steps 50 --outer-momentum 0.5 --epochs 60;\
torchft-streaming-h10-2x=--peer torchft --local-steps 10 --fragments 2 --overlap-steps 2 --outer-momentum 0.5 --epochs 60;\
ddp-fp16-2x=--engine ddp --codec fp16 --epochs 60;ddp-powersgd4-2x=--engine ddp --codec powersgd --rank 4 --epochs 60" \
  --out $out -- --workers 2 --dataset digits --model resnet8 --batch-size 256 --base-batch 64 --epochs 30
# pack the raw output (every run, the reference and quality.json) into raw.tar.xz; quality.md and .png stay readable
tar -C $out -cf - quality.json reference 10mbit | xz -9e > $out/raw.tar.xz && (cd $out && rm -r quality.json reference 10mbit)
