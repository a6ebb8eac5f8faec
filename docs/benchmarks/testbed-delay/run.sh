#!/usr/bin/env bash
# The testbed's added latency (a forwarder of ours: this kernel has no netem), validated on 2 nodes at 10 and
# 100 Mbit/s with 0 and 25 ms one way: bench link's round trip and rates, and the forwarders' CPU.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
python docs/benchmarks/testbed-delay/measure.py | tee docs/benchmarks/testbed-delay/measure.txt
