#!/usr/bin/env bash
# Time to quality of the default GPT (834 k parameters, AdamW, batch 64, 256 steps: its reference is DDP fp32 on local
# workers) on 2 nodes joined at 10 Mbit/s, seed 0: every exchange a user could pick. DDP and its hooks, our per-step
# codecs, torchft's DiLoCo (H 10, 50, 100) and Streaming DiLoCo, and ours, on the same token budget and, marked 2x, on
# twice its steps (outer momentum 0.5). Needs root (network namespaces); about 80 minutes on 2 cores, evaluations
# included; finished runs are kept.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
out=docs/benchmarks/quality-gpt-10mbit
[ ! -f $out/raw.tar.xz ] || tar -xJf $out/raw.tar.xz -C $out  # the runs packed below: finished ones are kept
seeds=${SEEDS:-0}
scalesgd testbed up --nodes 2 --bandwidth 10mbit --prefix q10
trap 'scalesgd testbed down --prefix q10' EXIT
scalesgd bench quality --rates 10mbit --prefix q10 --seeds "$seeds" --eval-every 16 --budget 3 \
  --exchanges "ddp;ddp-fp16;ddp-powersgd4;fp8;onebit;diloco-h16=--local-steps 16 --codec fp32;\
diloco-h16-fp8=--local-steps 16 --codec fp8;\
diloco-h16-fp8-2x=--local-steps 16 --codec fp8 --outer-momentum 0.5 --epochs 2;\
streaming-h16-fp8-2x=--local-steps 16 --fragments 4 --overlap-steps 3 --codec fp8 --outer-momentum 0.5 --epochs 2;\
torchft-h10-2x=--peer torchft --local-steps 10 --outer-momentum 0.5 --epochs 2;\
torchft-h50-2x=--peer torchft --local-steps 50 --outer-momentum 0.5 --epochs 2;\
torchft-h100-2x=--peer torchft --local-steps 100 --outer-momentum 0.5 --epochs 2;\
torchft-streaming-h16-2x=--peer torchft --local-steps 16 --fragments 4 --overlap-steps 3 --outer-momentum 0.5 --epochs 2;\
diloco-h32-fp8-2x=--local-steps 32 --codec fp8 --outer-momentum 0.5 --epochs 2;\
diloco-h8-fp8=--local-steps 8 --codec fp8 --outer-momentum 0.5;\
diloco-h16-fp8-m5=--local-steps 16 --codec fp8 --outer-momentum 0.5;\
streaming-h8-fp8=--local-steps 8 --fragments 4 --overlap-steps 1 --codec fp8 --outer-momentum 0.5;\
localsgd-h8-fp8=--local-steps 8 --codec fp8 --outer-lr 1 --outer-momentum 0;\
diloco-h16-topk-2x=--local-steps 16 --codec topk --density 0.05 --density-warmup 0 --outer-momentum 0.5 --epochs 2;\
fp16;topk-mc;lowrank8;lowrank-acp8;\
ddp-powersgd4-2x=--engine ddp --codec powersgd --rank 4 --epochs 2;\
ddp-powersgd8-2x=--engine ddp --codec powersgd --rank 8 --epochs 2" \
  --table src/scalesgd/sim/steps_to_target.json --out $out -- --workers 2 --model gpt --dataset text --samples 16384 --epochs 1
# pack the raw output (every run, the reference and quality.json) into raw.tar.xz; quality.md and .png stay readable
tar -C $out -cf - quality.json reference 10mbit | xz -9e > $out/raw.tar.xz && (cd $out && rm -r quality.json reference 10mbit)
