#!/usr/bin/env bash
# Time to the target per DDP step at 8 to 1,024 workers: the default GPT at its step measured on one H200 (6.9 ms, 8
# sequences of 64 tokens a worker, fp32 AdamW: gpu-h200-workers/step.jsonl; 9.5 ms under bf16 autocast) on the
# papers' clusters' links (Goyal et al. 2017: 8 GPUs a server, 50 GbE; Honda et al.: ABCI, 4 GPUs a node, 2 × EDR)
# and on the testbed's link (10 Mbit/s, 25 ms each way, one worker a node); each periodic mode's steps to the target
# read at M from the shipped table (a power law in M fitted to 2, 4 and 8 workers); DiLoCo with Muon inside from
# Muon's rows of it.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
here=docs/benchmarks/simulate-workers
modes=ddp,ddp-powersgd,scalesgd-fp8,periodic@16-fp8,periodic@16/4/3-fp8
gpt=(--model gpt --iteration-time 0.0069 --batch-per-worker 8 --modes $modes)
for cluster in goyal fujitsu; do
  scalesgd simulate "${gpt[@]}" --cluster $cluster --workers 8,16,32,64,128,256,512,1024 --out $here/$cluster
done
scalesgd simulate "${gpt[@]}" --procs-per-node 1 --inter-bandwidth 10mbit --inter-latency 25ms \
  --workers 2,4,8,16,32,64,128,256,512,1024 --out $here/testbed-link
scalesgd simulate --model gpt --iteration-time 0.0069 --batch-per-worker 8 --modes periodic@16-fp8 --optimizer muon \
  --procs-per-node 1 --inter-bandwidth 10mbit --inter-latency 25ms --workers 2,4,8,16,32,64,128,256,512,1024 \
  --out $here/testbed-link-muon  # Muon inside: its own steps (2, 4 and 8 workers measured under it)
rm $here/*/simulate.png  # the tables are the claim
