#!/usr/bin/env bash
# torchft's DiLoCo (pip package, `--peer torchft`) at H 10, 50 and 100 on seed 0, and ours at H 32 (fewer bytes);
# the reference (DDP fp32 on local workers, seeds 0-2) is copied from ../quality-gpt-10mbit-3seeds.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
scalesgd testbed up --nodes 2 --bandwidth 10mbit --prefix q10
trap 'scalesgd testbed down --prefix q10' EXIT
scalesgd bench quality --rates 10mbit --prefix q10 --seeds 0 --eval-every 16 --budget 3 \
  --exchanges "torchft-h10-2x=--peer torchft --local-steps 10 --outer-momentum 0.5 --epochs 2;\
torchft-h50-2x=--peer torchft --local-steps 50 --outer-momentum 0.5 --epochs 2;\
torchft-h100-2x=--peer torchft --local-steps 100 --outer-momentum 0.5 --epochs 2;\
diloco-h32-fp8-2x=--local-steps 32 --codec fp8 --outer-momentum 0.5 --epochs 2" \
  --table src/scalesgd/sim/steps_to_target.json --out docs/benchmarks/quality-gpt-10mbit-torchft -- --workers 2 --model gpt --dataset text --samples 16384 --epochs 1
