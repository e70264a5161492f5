#!/usr/bin/env bash
# One device call: checks of the new bundle, the split-decode threshold A/B (gpu-bundle-exp = 32,
# gpu-bundle = 8), and met bench serve on dummy 8B weights.
set -u
B=gpu-bundle; A=gpu-bundle-exp; L=/tmp/logs; mkdir -p $L
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bash $B/run.sh $L ops graphs gate > $L/run.out 2>&1
M=Llama-3.1-8B-Instruct
for x in A B; do
  bin=$A; [ $x = B ] && bin=$B
  for bs in 16 32; do
    timeout 40 $bin/met bench latency --model $bin/configs/$M --load-format dummy --batch-size $bs --input-len 128 --output-len 256 --num-iters 3 --output $L/lat-$x-b$bs.json > $L/lat-$x-b$bs.log 2>&1
  done
  timeout 60 $bin/met bench throughput --model $bin/configs/$M --load-format dummy --num-prompts 32 --input-len 4096 --output-len 256 --output $L/tp4k-$x.json > $L/tp4k-$x.log 2>&1
done
python3 gpu-bundle-stage/dummy_tokenizer.py $B/configs/$M /tmp/llama-dummy > $L/tok.log 2>&1
$B/met serve --model /tmp/llama-dummy --load-format dummy --port 8899 > $L/serve.log 2>&1 &
SP=$!
for i in $(seq 1 90); do curl -sf http://127.0.0.1:8899/v1/models >/dev/null 2>&1 && break; sleep 1; done
for cn in 1:8 16:64 64:128 256:256; do
  c=${cn%%:*}; n=${cn##*:}
  timeout 60 $B/met bench serve --base-url http://127.0.0.1:8899 --dataset random --input-len 128 --output-len 256 --num-prompts $n --concurrency $c --num-warmup 2 --output $L/serve-c$c.json > $L/serve-c$c.log 2>&1
done
kill $SP 2>/dev/null; wait $SP 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp logs
grep -A5 "met GPU summary" $L/run.out; grep -E "FAILED|panicked" $L/*.log | head
grep -h -E "^(latency|throughput):" $L/lat-*.log $L/tp4k-*.log
tail -n 3 $L/tok.log $L/serve.log; tail -n 12 $L/serve-c*.log | cut -c1-200
