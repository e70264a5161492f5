#!/bin/bash
# The 16k-prefix burst under nsys (CUDA API and kernels): where the burst step's host waits
# (synchronisations, allocations) and its kernels go, at the default crossover. `met serve`
# (Qwen3.6-35B-A3B, dummy weights, defaults), one cold request of 16k + 32, then 64 hits at
# once, 16 new tokens each. Results in $OUT/nb (the nsys stats reports and the serve log).
set -u
B=gpu-bundle; O=${OUT:-/tmp/out}/nb; mkdir -p $O
[ -x $B/met ] || bash $B/unpack.sh > /dev/null
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} MET_HOME=/tmp/met-home-shared; mkdir -p $MET_HOME
NSYS=$(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/bin/nsys 2>/dev/null | head -1)
[ -n "$NSYS" ] || { echo "no nsys here"; exit 1; }
python3 scripts/dummy_tokenizer.py configs/Qwen3.6-35B-A3B /tmp/q36 > /dev/null
MET_LOG=warn,met=info,met_server=info,met_scheduler=debug,met_kernels=warn \
  $NSYS profile -t cuda,osrt --cuda-memory-usage=true -o /tmp/burst -f true \
  $B/met serve --model /tmp/q36 --load-format dummy --port 8913 > $O/serve.log 2>&1 &
SP=$!
for i in $(seq 1 200); do curl -sf http://127.0.0.1:8913/v1/models > /dev/null && break; sleep 1; done
echo "up after ${i}s"
c="--prefix-len 16384 --input-len 32 --output-len 16 --num-warmup 0 --seed 7"
for x in cold:1 burst:64; do
  n=${x%:*}; m=${x#*:}
  timeout 90 $B/met bench serve --base-url http://127.0.0.1:8913 $c --num-prompts $m --concurrency $m \
    --output $O/ttft-$n.json > $O/ttft-$n.log 2>&1
  echo "$n: $(grep -E '^c=' $O/ttft-$n.log)"
done
pkill -INT -x met; wait $SP
grep -E "device memory full" $O/serve.log | head -3
for r in cuda_api_sum cuda_gpu_kern_sum cuda_gpu_mem_time_sum cuda_gpu_trace cuda_api_trace; do
  $NSYS stats -r $r -f csv -o $O/$r /tmp/burst.nsys-rep > /dev/null 2>&1
done
head -15 $O/cuda_api_sum*.csv; head -25 $O/cuda_gpu_kern_sum*.csv | cut -c1-200
gzip $O/serve.log $O/*trace*.csv
