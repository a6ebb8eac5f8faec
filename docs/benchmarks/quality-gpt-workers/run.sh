#!/usr/bin/env bash
# Time to quality past two workers: the default GPT on M testbed nodes × 1 (its two-epoch recipe, the global batch
# 64 whatever M), every exchange against DDP fp32's final loss on M local workers (+ 1 %), on a link of RATE with
# DELAY added one way (the testbed's forwarder: its CPU over the run is written beside the figures).
#   run.sh M RATE DELAY SEEDS EXCHANGES      e.g. run.sh 8 10mbit 25ms 0,1,2 "fp8-h16;sparseloco-h16"
#   run.sh M local 0 SEEDS EXCHANGES         steps to the target alone, on M local workers (no link)
set -euo pipefail
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
m=$1 rate=$2 delay=$3 seeds=$4 pick=$5
here=docs/benchmarks/quality-gpt-workers
out=$here/m$m-$rate-$delay-${6:-main}
declare -A X=(
  [fp8-h16]="--local-steps 16 --codec fp8 --outer-momentum 0.5 --epochs 2"
  [fp8-h32]="--local-steps 32 --codec fp8 --outer-momentum 0.5 --epochs 2"
  [fp8-h8]="--local-steps 8 --codec fp8 --outer-momentum 0.5 --epochs 2"
  [fp8-h16-carry8]="--local-steps 16 --overlap-steps 8 --carry --codec fp8 --outer-momentum 0.5 --epochs 2"
  [fp8-h16-carry4]="--local-steps 16 --overlap-steps 4 --carry --codec fp8 --outer-momentum 0.5 --epochs 2"
  [fp8-h8-carry4]="--local-steps 8 --overlap-steps 4 --carry --codec fp8 --outer-momentum 0.5 --epochs 2"
  [streaming-fp8-h16]="--local-steps 16 --fragments 4 --overlap-steps 3 --codec fp8 --outer-momentum 0.5 --epochs 2"
  [streaming-sparseloco-h16]="--local-steps 16 --fragments 4 --overlap-steps 3 --codec sparseloco --sparseloco-top 128 --epochs 2"
  [sparseloco-h16]="--local-steps 16 --codec sparseloco --sparseloco-top 128 --epochs 2"
  [sparseloco-h4]="--local-steps 4 --codec sparseloco --sparseloco-top 128 --epochs 2"
  [sparseloco-h8]="--local-steps 8 --codec sparseloco --sparseloco-top 128 --epochs 2"
  [muon-fp8-h16]="--local-steps 16 --codec fp8 --outer-momentum 0.5 --optimizer muon --epochs 2"
  [muon-sparseloco-h16]="--local-steps 16 --codec sparseloco --sparseloco-top 128 --optimizer muon --epochs 2"
  [torchft-h50]="--peer torchft --local-steps 50 --outer-momentum 0.5 --epochs 2"
  [torchft-h50-buckets]="--peer torchft --peer-bucket-mb 25 --local-steps 50 --outer-momentum 0.5 --epochs 2"
  [torchft-h50-buckets-muon]="--peer torchft --peer-bucket-mb 25 --local-steps 50 --outer-momentum 0.5 --optimizer muon --epochs 2"
  [fp8]="--codec fp8"
  [fp8-single]="--codec fp8 --buckets single"
  [auto]="--exchange auto"
  [auto-2x]="--exchange auto --epochs 2"
  [ddp]="--engine ddp --codec fp32"
  [ddp-muon]="--engine ddp --codec fp32 --optimizer muon --epochs 2"
  [ddp-powersgd8]="--engine ddp --codec powersgd --rank 8 --epochs 2"
)
exchanges=""
for name in ${pick//;/ }; do exchanges+="$name=${X[$name]};"; done
[ ! -f $out/raw.tar.xz ] || tar -xJf $out/raw.tar.xz -C $out  # finished runs are kept (what the report reads)
keep=(--exclude='checkpoint*.pt' --exclude='ranks-*' --exclude='*.png')
call=$out/calls/${seeds//,/}-${pick//;/+}  # each call's record and report (quality.{json,md} are the last call's)
if [ "$rate" = local ]; then
  scalesgd bench quality --seeds "$seeds" --eval-every 16 --budget 3 --exchanges "${exchanges%;}" --out $out \
    -- --workers "$m" --model gpt --dataset text --samples 16384 --epochs 1
  mkdir -p $out/calls && xz -9e -c $out/quality.json > $call.json.xz && cp $out/quality.md $call.md
  tar -C $out "${keep[@]}" -cf - quality.json reference local | xz -9e > $out/raw.tar.xz && \
    (cd $out && rm -r quality.json reference local)
  exit 0
fi
scalesgd testbed up --nodes "$m" --bandwidth "$rate" --latency "$delay" --prefix qw
trap 'scalesgd testbed down --prefix qw' EXIT
mkdir -p $out
python $here/forwarders.py snapshot qw "$m" > $out/.before
scalesgd bench quality --rates "$rate@$delay" --prefix qw --seeds "$seeds" --eval-every 16 --budget 3 \
  --exchanges "${exchanges%;}" --out $out -- --workers "$m" --model gpt --dataset text --samples 16384 --epochs 1
mkdir -p $out/calls && xz -9e -c $out/quality.json > $call.json.xz && cp $out/quality.md $call.md
python $here/forwarders.py snapshot qw "$m" > $out/.after
python $here/forwarders.py cost $out/.before $out/.after | tee -a $out/forwarders.jsonl && rm $out/.before $out/.after
tar -C $out "${keep[@]}" -cf - quality.json reference "$rate@$delay" | xz -9e > $out/raw.tar.xz && \
  (cd $out && rm -r quality.json reference "$rate@$delay")
