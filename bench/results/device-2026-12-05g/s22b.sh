#!/bin/bash
# Session 22, call 2: batch-1 A/B on one machine (main's met against gpu-next's: GGUF two units
# in flight + one launch for two parts; MET_L2_PREFETCH=0/1), then per-kernel step times
# (MET_KERNEL_TIMES=1, eager) of 8B bf16 / FP8 / Q4_K_M decode and 256-request steps (the burst:
# s22c.sh). DEADLINE-guarded, most important first.
set -u
B=gpu-bundle-next; bash $B/unpack.sh > /dev/null
gunzip -c $B/met-main.gz > $B/met-main; chmod +x $B/met-main
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} MET_HOME=/tmp/met-home-shared MET_LOG=info
mkdir -p $MET_HOME
S=$SECONDS; left() { echo $((${DEADLINE:-585} - (SECONDS - S))); }
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
O=$OUT/z; mkdir -p $O
lat() {  # lat TAG BIN MODEL FORMAT [extra]
  [ $(left) -gt 40 ] || { echo "skip $1"; return; }
  timeout 60 $B/$2 bench latency --model $3 --load-format $4 --batch-size 1 --input-len 128 \
    --output-len 256 --num-iters 3 --output $O/lat-$1.json > $O/lat-$1.log 2>&1
  echo "latency $1 rc=$?: $(grep -E '^latency' $O/lat-$1.log | head -1 | cut -c1-200) [$((SECONDS-S)) s]"
}
L=configs/Llama-3.1-8B-Instruct; F=configs/Meta-Llama-3-8B-Instruct-FP8
for r in 1 2; do
  lat bf16-$r met-main $L dummy; lat q4-main-$r met-main $L dummy-q4_k_m; lat q4-next-$r met $L dummy-q4_k_m
  MET_L2_PREFETCH=1 lat q4-pf-$r met $L dummy-q4_k_m; MET_L2_PREFETCH=2 lat q4-pf2-$r met $L dummy-q4_k_m
  lat fp8-$r met $F dummy; MET_L2_PREFETCH=1 lat fp8-pf-$r met $F dummy; MET_L2_PREFETCH=2 lat fp8-pf2-$r met $F dummy
  MET_L2_PREFETCH=1 lat bf16-pf-$r met $L dummy; MET_L2_PREFETCH=2 lat bf16-pf2-$r met $L dummy
done
timeout $(( $(left) > 60 ? 60 : 1 )) $B/tests/kernels-ops gguf q4_k q6_k int8 --test-threads=4 > $O/ops-gguf.log 2>&1
echo "ops gguf rc=$?: $(grep -E '^test result|panicked' $O/ops-gguf.log | head -3 | cut -c1-300) [$((SECONDS-S)) s]"
kt() {  # kt TAG MODEL FORMAT: one eager batch-1 run under MET_KERNEL_TIMES, its decode step tables
  [ $(left) -gt 40 ] || { echo "skip kt $1"; return; }
  MET_KERNEL_TIMES=1 timeout 60 $B/met bench latency --model $2 --load-format $3 --batch-size 1 --input-len 128 \
    --output-len 16 --num-iters 1 --num-warmup 0 --enforce-eager > $O/kt-$1.log 2>&1
  echo "kt $1 rc=$? [$((SECONDS-S)) s]"; grep "step kernel times" $O/kt-$1.log | tail -1 | cut -c1-1500
}
kt bf16 $L dummy; kt fp8 $F dummy; kt q4 $L dummy-q4_k_m
kt256() {  # kt256 TAG MODEL: 256 x (128 + 32) eager under MET_KERNEL_TIMES: a decode step of 256's table
  [ $(left) -gt 60 ] || { echo "skip kt256 $1"; return; }
  MET_KERNEL_TIMES=1 timeout 90 $B/met bench throughput --model $2 --load-format dummy --num-prompts 256 --input-len 128 \
    --output-len 32 --enforce-eager > $O/kt256-$1.log 2>&1
  echo "kt256 $1 rc=$? [$((SECONDS-S)) s]"; grep "step kernel times" $O/kt256-$1.log | sed -n '20p' | cut -c1-1500
  gzip $O/kt256-$1.log
}
kt256 bf16 $L; kt256 fp8 $F
echo "z done [$((SECONDS-S)) s]"; tar czf $OUT/z.tgz -C $OUT z && rm -rf $OUT/z
echo "all done [$((SECONDS-S)) s]"
