#!/usr/bin/env bash
# Ring allreduce where the link has delay: 4 testbed nodes × 1 at 100 Mbit/s, 25 ms added each way (a 51 ms round
# trip); ours (ring, fp8) against gloo's own (native), medians of 5 after 2 warm-ups. `run.sh NAME` writes NAME.md.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
out=docs/benchmarks/testbed-allreduce-latency
scalesgd testbed up --nodes 4 --bandwidth 100mbit --latency 25ms --prefix ar
trap 'scalesgd testbed down --prefix ar' EXIT
scalesgd testbed run --prefix ar -- scalesgd bench allreduce --sizes 64K,256K,1M --algorithms ring,native,fp8 \
  --repeats 5 --warmup 2 --out /tmp/allreduce-latency
sed "s|/tmp/allreduce-latency|$out/OUT|" /tmp/allreduce-latency/allreduce.md > "$out/${1:-after}.md"
