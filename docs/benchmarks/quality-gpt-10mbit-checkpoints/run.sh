#!/usr/bin/env bash
# Time to quality at 10 Mbit/s with checkpoints on the training clock (each epoch's end, the default): the headline
# rows of ../quality-gpt-10mbit-3seeds, seeds 0-2. The reference (DDP fp32 on local workers) is that benchmark's:
# its runs are copied in first (the same command for them), so the target and the budget are the same.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
out=docs/benchmarks/quality-gpt-10mbit-checkpoints
mkdir -p $out/reference
[ -d $out/reference/ddp-seed0 ] || tar -xJf docs/benchmarks/quality-gpt-10mbit-3seeds/raw.tar.xz -C $out reference
[ ! -f $out/raw.tar.xz ] || tar -xJf $out/raw.tar.xz -C $out  # the runs packed below: finished ones are kept
scalesgd testbed up --nodes 2 --bandwidth 10mbit --prefix qk
trap 'scalesgd testbed down --prefix qk' EXIT
scalesgd bench quality --rates 10mbit --prefix qk --seeds 0,1,2 --eval-every 16 --budget 3 \
  --exchanges "ddp-powersgd8-2x=--engine ddp --codec powersgd --rank 8 --epochs 2;\
diloco-h16-fp8-2x=--local-steps 16 --codec fp8 --outer-momentum 0.5 --epochs 2;\
torchft-h50-2x=--peer torchft --local-steps 50 --outer-momentum 0.5 --epochs 2" \
  --out $out -- --workers 2 --model gpt --dataset text --samples 16384 --epochs 1
tar -C $out -cf - quality.json reference 10mbit | xz -9e > $out/raw.tar.xz && (cd $out && rm -r quality.json reference 10mbit)
