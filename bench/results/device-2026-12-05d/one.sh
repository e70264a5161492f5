#!/bin/bash
# One call for a short lease, most important first: FP8 op checks (padded cuBLASLt rows,
# norms' e4m3 rows, the f16 one-row GEMV), the one-row e4m3 GEMV bench under stream and f16,
# batch-1 decode of the 8B shape in bf16 / FP8 stream / FP8 f16, 256 x (128 + 256) in bf16
# and FP8, then Q4_K_M and Qwen3.6 batch 1 if time is left. Results in $OUT/one.
set -u
B=gpu-bundle; O=${OUT:-/tmp/out}/one; mkdir -p $O
[ -x $B/met ] || bash $B/unpack.sh > /dev/null
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} MET_HOME=/tmp/met-home-shared MET_LOG=info
mkdir -p $MET_HOME
T0=$SECONDS
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 $B/tests/kernels-ops fp8 --test-threads=4 > $O/ops-fp8.log 2>&1
echo "ops fp8 rc=$?: $(grep -E '^test result|panicked' $O/ops-fp8.log | head -3 | cut -c1-400) [$((SECONDS-T0)) s]"
MET_FP8_ONE=f16 timeout 60 $B/tests/kernels-ops fp8_matrices > $O/ops-f16.log 2>&1
echo "ops fp8_matrices f16 rc=$?: $(grep -E '^test result|panicked' $O/ops-f16.log | head -2 | cut -c1-400)"
for v in stream f16; do
  MET_FP8_ONE=$v timeout 50 $B/tests/kernels-bench --bench 'cuda_fp8/(qkv|o|gate_up|down|gate_up_silu)/m1_|cuda_gemv/copy' > $O/kbench-$v.log 2>&1
  echo "kbench $v rc=$?"; awk -v v=$v '/^cuda_/{name=$1} /thrpt:/{print v, name, $4, $5}' $O/kbench-$v.log
done
lat() {  # lat TAG MODEL FORMAT
  timeout 90 $B/met bench latency --model $2 --load-format $3 --batch-size 1 --input-len 128 \
    --output-len 256 --num-iters 3 --output $O/lat-$1.json > $O/lat-$1.log 2>&1
  echo "latency $1 rc=$?: $(grep -E '^latency' $O/lat-$1.log | head -1) [$((SECONDS-T0)) s]"
}
lat bf16 configs/Llama-3.1-8B-Instruct dummy
lat fp8 configs/Meta-Llama-3-8B-Instruct-FP8 dummy
MET_FP8_ONE=f16 lat fp8-f16 configs/Meta-Llama-3-8B-Instruct-FP8 dummy
for x in bf16:configs/Llama-3.1-8B-Instruct fp8:configs/Meta-Llama-3-8B-Instruct-FP8; do
  IFS=: read tag model <<< "$x"
  timeout 100 $B/met bench throughput --model $model --load-format dummy --num-prompts 256 --input-len 128 \
    --output-len 256 --output $O/tput-$tag.json > $O/tput-$tag.log 2>&1
  echo "throughput $tag rc=$?: $(grep -E '^throughput' $O/tput-$tag.log | tail -1) [$((SECONDS-T0)) s]"
done
[ $((SECONDS-T0)) -lt 330 ] && lat q4km configs/Llama-3.1-8B-Instruct dummy-q4_k_m
[ $((SECONDS-T0)) -lt 370 ] && lat q36 configs/Qwen3.6-35B-A3B dummy
echo "done [$((SECONDS-T0)) s]"
