#!/usr/bin/env bash
# Validation loss of the sharded engine's compressed reduce-scatter against unsharded DDP fp32, 3 seeds: the language
# model's accuracy recipe (docs/results.md#language-model), 2 workers each holding half of the model: fp8 relative to
# the gathered weights, and 1-bit Adam (its exchange on each unit's whole gradients, Adam's state sharded).
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
scalesgd bench accuracy --seeds 0,1,2 --out docs/benchmarks/fsdp-accuracy-gpt \
  --variants "--engine ddp --codec fp32;--engine scalesgd-fsdp --codec fp8;--engine scalesgd-fsdp --codec onebit --optimizer onebit-adam --compress-after 16" \
  -- --workers 2 --dataset text --model gpt --samples 16384 --batch-size 64 --base-batch 64 \
  --optimizer adamw --base-lr 1e-3 --weight-decay 0.1 --betas 0.9,0.95 --epochs 2 --warmup-epochs 0.125 \
  --schedule cosine --quiet
