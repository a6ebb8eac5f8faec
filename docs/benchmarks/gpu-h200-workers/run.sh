#!/usr/bin/env bash
# On the lent H200 (the device tool, from the repository's root; writes into $OUT): the default GPT's step on the GPU
# (the time `simulate-workers/run.sh` assumed), DiLoCo H 16 fp8's steps to the target with 16 and 32 workers on the
# machine's 16 CPU cores (steps, not seconds: the law in M gains points past 8), the CUDA tests, and more workers
# than GPUs refused (a local launch: one line, exit 2; torchrun: the rank without a GPU says so).
#   run.sh [SECONDS [PARTS]]      PARTS: any of step,m16,cuda,m32,refusal (default all but refusal, in that order)
set -u
out=${OUT:-/tmp/gpu-h200-workers}
mkdir -p "$out"
end=$(( $(date +%s) + ${1:-540} )) parts=,${2:-step,m16,cuda,m32},
left() { echo $(( end - $(date +%s) )); }
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc
  python3 -c "import torch, platform; print(torch.__version__, torch.cuda.get_device_name(), platform.python_version())"
} > "$out/device.txt" 2>&1
export PYTHONPATH=src PYTHONUNBUFFERED=1 SCALESGD_FP8_KERNELS=eager  # eager: the same bytes, no compile in 32 ranks
want() { [[ $parts == *,$1,* ]]; }
gpt=(--layers 4 --heads 4 --width 128 --block 64 --batch 8 --steps 200)
if want step; then
  for precision in --no-bf16 ""; do
    timeout 60 python3 docs/benchmarks/periodic-gpu/overhead.py --device cuda "${gpt[@]}" $precision
  done > "$out/step.jsonl" 2> "$out/step.err"
  cat "$out/step.jsonl"
fi
steps() {  # M SEEDS TIMEOUT: bench quality on M local CPU workers (run.sh M local 0's command; one GPU, not M)
  CUDA_VISIBLE_DEVICES= timeout "$3" python3 -m scalesgd bench quality --seeds "$2" --eval-every 16 --budget 3 \
    --exchanges "fp8-h16=--local-steps 16 --codec fp8 --outer-momentum 0.5 --epochs 2" --out /tmp/m$1 \
    -- --workers "$1" --model gpt --dataset text --samples 16384 --epochs 1 > "$out/m$1.log" 2>&1
  echo "exit $?" >> "$out/m$1.log"
  tar -C /tmp --exclude='checkpoint*.pt' --exclude='*.png' -cJf "$out/m$1.tar.xz" m$1
  tail -n 4 "$out/m$1.log"
}
! want m16 || steps 16 "${SEEDS:-0,1,2}" $(( $(left) - 10 < 230 ? $(left) - 10 : 230 ))
if want refusal; then  # one GPU here: a second worker has none
  short=(--epochs 1 --warmup none --quiet)
  for launch in "python3 -m scalesgd train --workers 2" \
                "python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m scalesgd train"; do
    echo "\$ $launch ${short[*]} --run-dir /tmp/refused"
    timeout 120 $launch "${short[@]}" --run-dir /tmp/refused 2>&1 | grep -E '^scalesgd: |exitcode'
    echo "exit ${PIPESTATUS[0]}; run dir: $(ls /tmp/refused 2>/dev/null | tr '\n' ' ')"; rm -rf /tmp/refused
  done > "$out/refusal.txt" 2>&1
  timeout 120 python3 -m scalesgd train --workers 1 "${short[@]}" --run-dir /tmp/one > /dev/null 2>&1
  echo "one worker on the GPU: exit $?; $(grep -ho '"final_test_acc": [0-9.]*' /tmp/one/summary.json 2>&1)" \
    >> "$out/refusal.txt"
  cat "$out/refusal.txt"
fi
if want cuda; then
  start=$(date +%s)
  timeout $(( $(left) - 20 < 280 ? $(left) - 20 : 280 )) python3 -m pytest -m cuda tests -q -p no:cacheprovider \
    > "$out/pytest-cuda.txt" 2>&1
  echo "exit $? after $(( $(date +%s) - start )) s" >> "$out/pytest-cuda.txt"
  tail -n 3 "$out/pytest-cuda.txt"
fi
! want m32 || [ "$(left)" -lt 60 ] || steps 32 0 $(( $(left) - 10 ))
