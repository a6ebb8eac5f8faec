#!/usr/bin/env bash
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
r=${RATE:-10}  # Mbit/s; ../quality-digits-100mbit/run.sh runs this with RATE=100
out=docs/benchmarks/quality-digits-${r}mbit
[ ! -f $out/raw.tar.xz ] || tar -xJf $out/raw.tar.xz -C $out  # the runs packed below: finished ones are kept
scalesgd testbed up --nodes 2 --bandwidth ${r}mbit --prefix q${r}
trap "scalesgd testbed down --prefix q${r}" EXIT
scalesgd bench quality --rates ${r}mbit --prefix q${r} --seeds 0,1,2 --eval-every 6 --budget 3 \
  --exchanges "ddp;ddp-fp16;ddp-powersgd4;ddp-powersgd8;fp16;fp8;topk-mc;onebit;lowrank8;lowrank-acp8;\
diloco-h4-fp8=--local-steps 4 --codec fp8 --outer-momentum 0.5;\
diloco-h10-fp8-2x=--local-steps 10 --codec fp8 --outer-momentum 0.5 --epochs 60;\
streaming-h10-fp8-2x=--local-steps 10 --fragments 2 --overlap-steps 2 --codec fp8 --outer-momentum 0.5 --epochs 60;\
torchft-h10-2x=--peer torchft --local-steps 10 --outer-momentum 0.5 --epochs 60;\
torchft-h50-2x=--peer torchft --local-steps 50 --outer-momentum 0.5 --epochs 60;\
diloco-h50-fp8-2x=--local-steps 50 --codec fp8 --outer-momentum 0.5 --epochs 60;\
torchft-streaming-h10-2x=--peer torchft --local-steps 10 --fragments 2 --overlap-steps 2 --outer-momentum 0.5 --epochs 60;\
ddp-fp16-2x=--engine ddp --codec fp16 --epochs 60;ddp-powersgd4-2x=--engine ddp --codec powersgd --rank 4 --epochs 60" \
  --table src/scalesgd/sim/steps_to_target.json \
  --out $out -- --workers 2 --dataset digits --model resnet8 --batch-size 256 --base-batch 64 --epochs 30
# pack the raw output (every run, the reference and quality.json) into raw.tar.xz; quality.md and .png stay readable
tar -C $out -cf - quality.json reference ${r}mbit | xz -9e > $out/raw.tar.xz && (cd $out && rm -r quality.json reference ${r}mbit)
