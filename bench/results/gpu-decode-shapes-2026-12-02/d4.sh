#!/bin/bash
# Device call 4: the committed tree (c9e025d): the precision gate and its broken variant; the
# 30B-A3B and 4k-context throughput; batch-1 and batch-256 latency; the served ladder; an
# ncu view of the 8B batch-256 decode step.
set -u
B=gpu-bundle; L=$OUT/d4; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used,driver_version --format=csv,noheader | tee $L/gpu.txt
timeout 240 $B/run.sh $L/run gate > $L/run.log 2>&1; echo "gate rc=$?"; sed -n '/======== met GPU summary/,/^$/p' $L/run.log | tail -3
tp() { local name=$1; shift; timeout 70 $B/met bench throughput --load-format dummy "$@" --output $L/$name.json > $L/$name.log 2>&1; echo "$name: $(grep -E '^throughput' $L/$name.log)"; }
tp tp-30b --model $B/configs/Qwen3-30B-A3B --num-prompts 256 --input-len 128 --output-len 256
tp tp4k-8b --model $B/configs/Llama-3.1-8B-Instruct --num-prompts 32 --input-len 4096 --output-len 256
lat() { local name=$1; shift; timeout 50 $B/met bench latency --load-format dummy "$@" --output $L/$name.json > $L/$name.log 2>&1; echo "$name: $(grep -E '^latency' $L/$name.log)"; }
lat lat-8b-b1 --model $B/configs/Llama-3.1-8B-Instruct --batch-size 1 --input-len 128 --output-len 256 --num-iters 3
lat lat-8b-b256 --model $B/configs/Llama-3.1-8B-Instruct --batch-size 256 --input-len 128 --output-len 64 --num-iters 2
python3 .dev/dummy_tokenizer.py $B/configs/Llama-3.1-8B-Instruct /tmp/llama-dummy > $L/tok.log 2>&1
$B/met serve --model /tmp/llama-dummy --load-format dummy --port 8899 > $L/serve.log 2>&1 &
SP=$!
for i in $(seq 1 90); do curl -sf http://127.0.0.1:8899/v1/models >/dev/null 2>&1 && break; sleep 1; done
for cn in 1:8 16:64 64:128 256:256; do
  c=${cn%%:*}; n=${cn##*:}
  timeout 45 $B/met bench serve --base-url http://127.0.0.1:8899 --dataset random --input-len 128 --output-len 256 --num-prompts $n --concurrency $c --num-warmup 2 --output $L/serve-c$c.json > $L/serve-c$c.log 2>&1
  echo "serve c=$c: $(grep -iE 'output tok/s|tok/s' $L/serve-c$c.log | tail -1 | cut -c1-220)"
done
kill $SP 2>/dev/null; wait $SP 2>/dev/null
timeout 100 ncu --clock-control none --cache-control none --csv --page raw --launch-skip 2973 --launch-count 652 \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  $B/met bench latency --model $B/configs/Llama-3.1-8B-Instruct --load-format dummy --batch-size 256 --input-len 128 --output-len 12 --num-iters 1 --num-warmup 0 --enforce-eager > $L/ncu-8b-b256-decode.csv 2>$L/ncu.err
echo "ncu rc=$?"; python3 $B/ncu_summary.py $L/ncu-8b-b256-decode.csv > $L/prof-8b-b256-decode.txt 2>&1; head -16 $L/prof-8b-b256-decode.txt
tar czf $OUT/d4.tgz -C $OUT d4
