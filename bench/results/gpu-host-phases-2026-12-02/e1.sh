#!/bin/bash
# Call e1: qkv prologue two heads per warp + norm weights before the reduction + step phase timing.
set -u
B=gpu-bundle; L=$OUT/e1; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used,driver_version --format=csv,noheader | tee $L/gpu.txt
timeout 200 $B/run.sh $L/run ops fixtures graphs > $L/run.log 2>&1; echo "run.sh rc=$?"
sed -n '/======== met GPU summary/,/^$/p' $L/run.log | tail -5; grep -h "FAILED\|panicked" $L/run/*.log | head
tp() { local bin=$1 name=$2; shift 2; timeout 70 $B/$bin bench throughput --load-format dummy "$@" --output $L/$name.json > $L/$name.log 2>&1; echo "$name: $(grep -E '^throughput|^decode step' $L/$name.log | tr '\n' ' ')"; }
M8="--model $B/configs/Llama-3.1-8B-Instruct --num-prompts 256 --input-len 128 --output-len 256"
tp met-base tp8b-base-r1 $M8
tp met tp8b-new-r1 $M8
tp met-base tp8b-base-r2 $M8
tp met tp8b-new-r2 $M8
lat() { local name=$1; shift; timeout 60 $B/met bench latency --load-format dummy "$@" --output $L/$name.json > $L/$name.log 2>&1; echo "$name: $(grep -E '^latency|^decode step' $L/$name.log | tr '\n' ' ')"; }
lat lat-8b-b256 --model $B/configs/Llama-3.1-8B-Instruct --batch-size 256 --input-len 128 --output-len 64 --num-iters 2
lat lat-8b-b1 --model $B/configs/Llama-3.1-8B-Instruct --batch-size 1 --input-len 128 --output-len 128 --num-iters 2
for bin in met met-base; do
timeout 90 ncu --clock-control none --cache-control none --csv --page raw --kernel-name regex:"qkv_rotary|add_rms_norm_v" --launch-skip 200 --launch-count 60 \
  --metrics gpu__time_duration.sum $B/$bin bench latency --model $B/configs/Llama-3.1-8B-Instruct --load-format dummy --batch-size 256 --input-len 16 --output-len 6 --num-iters 1 --num-warmup 0 --enforce-eager > $L/ncu-$bin.csv 2>$L/ncu-$bin.err
echo "ncu $bin rc=$?"; python3 $B/ncu_summary.py $L/ncu-$bin.csv 2>&1 | head -6
done
tar czf $OUT/e1.tgz -C $OUT e1
