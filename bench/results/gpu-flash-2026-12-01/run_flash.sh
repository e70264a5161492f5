#!/usr/bin/env bash
# One device call: correctness on both attention backends, kernel benches, offline and served benches.
set -u
B=gpu-bundle; L=/tmp/logs; mkdir -p $L
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bash $B/run.sh $L lib ops fixtures graphs gate > $L/run.out 2>&1
timeout 150 python3 $B/gpu_gate.py --met $B/met --work /tmp/gate-paged --out $L/gpu_gate_paged.json --attention-backend paged > $L/gpu-gate-paged.log 2>&1; echo "paged gate rc=$?" >> $L/run.out
timeout 120 $B/tests/kernels-bench --bench cuda_attention > $L/attn-bench.log 2>&1
for m in Llama-3.1-8B-Instruct Qwen3-0.6B; do
  timeout 100 $B/met bench throughput --model $B/configs/$m --load-format dummy --num-prompts 256 --input-len 128 --output-len 256 --output $L/tp-$m.json > $L/tp-$m.log 2>&1
  timeout 100 $B/met bench throughput --model $B/configs/$m --load-format dummy --num-prompts 32 --input-len 4096 --output-len 256 --output $L/tp4k-$m.json > $L/tp4k-$m.log 2>&1
done
timeout 60 $B/met bench latency --model $B/configs/Llama-3.1-8B-Instruct --load-format dummy --batch-size 1 --input-len 128 --output-len 256 --num-iters 3 --output $L/lat-8b-b1.json > $L/lat.log 2>&1
# Served: met serve on dummy 8B weights, token-id prompts.
$B/met serve --model $B/configs/Llama-3.1-8B-Instruct --load-format dummy --port 8899 > $L/serve.log 2>&1 &
SP=$!
for i in $(seq 1 90); do curl -sf http://127.0.0.1:8899/v1/models >/dev/null 2>&1 && break; sleep 1; done
for cn in 1:8 16:64 64:128 256:256; do
  c=${cn%%:*}; n=${cn##*:}
  timeout 120 $B/met bench serve --base-url http://127.0.0.1:8899 --dataset random --input-len 128 --output-len 256 --num-prompts $n --concurrency $c --num-warmup 2 --output $L/serve-c$c.json > $L/serve-c$c.log 2>&1
done
kill $SP; wait $SP 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp logs
grep -A7 "met GPU summary" $L/run.out; grep "paged gate" $L/run.out; tail -1 $L/gpu-gate-paged.log
grep -E "FAILED|panicked" $L/*.log | head
grep -E "time:|thrpt:|^cuda_attention" $L/attn-bench.log
grep -h -E "^(latency|throughput):" $L/tp-*.log $L/tp4k-*.log $L/lat.log
tail -n 4 $L/serve-c*.log
