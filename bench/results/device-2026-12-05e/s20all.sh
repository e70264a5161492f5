#!/bin/bash
# Session 20, one call for everything, most important first, each part only if time is left:
# the 16k burst under nsys; GGUF prefetch A/B (8B Q4_K_M batch 1, met vs met-base);
# FP8 one-row variants (op checks, kernel bench, 8B batch 1).
set -u
B=gpu-bundle; bash $B/unpack.sh > /dev/null
gunzip -c $B/met-base.gz > $B/met-base; chmod +x $B/met-base
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} MET_HOME=/tmp/met-home-shared MET_LOG=info
mkdir -p $MET_HOME
S=$SECONDS; left() { echo $((${DEADLINE:-585} - (SECONDS - S))); }
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
if [[ "$GPU" == *H200* && -n "${BURST:-}" ]]; then  # Qwen3.6-35B-A3B in bf16 needs the H200's memory
  timeout $(( ${DEADLINE:-585} / 3 + 20 )) bash $B/session/nb_run.sh
  echo "nb done [$((SECONDS-S)) s]"; tar czf $OUT/nb.tgz -C $OUT nb && rm -rf $OUT/nb
fi
O=$OUT/x; mkdir -p $O
lat() {  # lat TAG BIN MODEL FORMAT
  [ $(left) -gt 40 ] || { echo "skip $1"; return; }
  timeout 60 $B/$2 bench latency --model $3 --load-format $4 --batch-size 1 --input-len 128 \
    --output-len 256 --num-iters 3 --output $O/lat-$1.json > $O/lat-$1.log 2>&1
  echo "latency $1 rc=$?: $(grep -E '^latency' $O/lat-$1.log | head -1) [$((SECONDS-S)) s]"
}
L=configs/Llama-3.1-8B-Instruct; F=configs/Meta-Llama-3-8B-Instruct-FP8
lat q4-new met $L dummy-q4_k_m; lat q4-base met-base $L dummy-q4_k_m
MET_FP8_ONE=stream4 lat fp8-s4 met $F dummy; lat fp8 met $F dummy; MET_FP8_ONE=f16w lat fp8-f16w met $F dummy
lat q4-new2 met $L dummy-q4_k_m; lat q4-base2 met-base $L dummy-q4_k_m
timeout $(( $(left) > 60 ? 60 : 1 )) $B/tests/kernels-ops gguf q4_k q6_k int8 --test-threads=4 > $O/ops-gguf.log 2>&1
echo "ops gguf rc=$?: $(grep -E '^test result|panicked' $O/ops-gguf.log | head -3 | cut -c1-300) [$((SECONDS-S)) s]"
for v in stream4 f16w; do
  MET_FP8_ONE=$v timeout $(( $(left) > 40 ? 40 : 1 )) $B/tests/kernels-ops fp8_matrices > $O/ops-$v.log 2>&1
  echo "ops fp8_matrices $v rc=$?: $(grep -E '^test result|panicked' $O/ops-$v.log | head -3 | cut -c1-300) [$((SECONDS-S)) s]"
done
for v in stream stream4 f16w; do
  MET_FP8_ONE=$v timeout $(( $(left) > 45 ? 45 : 1 )) $B/tests/kernels-bench --bench 'cuda_fp8/(qkv|o|gate_up|down|gate_up_silu)/m1_|cuda_gemv/copy' > $O/kbench-$v.log 2>&1
  echo "kbench $v rc=$?"; awk -v v=$v '/^cuda_/{name=$1} /thrpt:/{print v, name, $4, $5}' $O/kbench-$v.log
done
echo "all done [$((SECONDS-S)) s]"; tar czf $OUT/x.tgz -C $OUT x && rm -rf $OUT/x
