#!/bin/bash
# Session 21, second call: FP8 one-row forms (stream vs a8: op checks, kernel bench, 8B batch 1
# beside bf16 and Q4_K_M), per-kernel ncu of the GEMVs in a decode step, then the burst
# under nsys. DEADLINE-guarded, most important first.
set -u
B=gpu-bundle-y; bash $B/unpack.sh > /dev/null
for f in met kernels-ops kernels-bench; do gunzip -c $B/a8/$f.gz > $B/a8/$f; chmod +x $B/a8/$f; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} MET_HOME=/tmp/met-home-shared MET_LOG=info
mkdir -p $MET_HOME
S=$SECONDS; left() { echo $((${DEADLINE:-585} - (SECONDS - S))); }
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
O=$OUT/y; mkdir -p $O
MET_FP8_ONE=a8 timeout 60 $B/a8/kernels-ops fp8_matrices > $O/ops-a8.log 2>&1
echo "ops fp8_matrices a8 rc=$?: $(grep -E '^test result|panicked' $O/ops-a8.log | head -3 | cut -c1-400) [$((SECONDS-S)) s]"
lat() {  # lat TAG BIN MODEL FORMAT
  [ $(left) -gt 40 ] || { echo "skip $1"; return; }
  timeout 60 $2 bench latency --model $3 --load-format $4 --batch-size 1 --input-len 128 \
    --output-len 256 --num-iters 3 --output $O/lat-$1.json > $O/lat-$1.log 2>&1
  echo "latency $1 rc=$?: $(grep -E '^latency' $O/lat-$1.log | head -1) [$((SECONDS-S)) s]"
}
L=configs/Llama-3.1-8B-Instruct; F=configs/Meta-Llama-3-8B-Instruct-FP8
NSYS=$(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/bin/nsys 2>/dev/null | head -1)
tl() {  # tl TAG BIN MODEL FORMAT: in-step kernel times of graph-captured decode steps (nsys, graph nodes)
  [ $(left) -gt 60 ] || { echo "skip nsys $1"; return; }
  timeout 70 $NSYS profile -t cuda --cuda-graph-trace=node -o /tmp/tl-$1 -f true \
    $2 bench latency --model $3 --load-format $4 --batch-size 1 --input-len 128 --output-len 64 --num-iters 1 \
    --num-warmup 0 > $O/tl-$1.log 2>&1
  echo "nsys $1 rc=$? [$((SECONDS-S)) s]"
  for r in cuda_gpu_kern_sum; do $NSYS stats -r $r -f csv -o $O/tl-$1-$r /tmp/tl-$1.nsys-rep > /dev/null 2>&1; done
  head -14 $O/tl-$1-cuda_gpu_kern_sum*.csv | cut -d, -f1-9 | cut -c1-180
}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
prof() {  # prof TAG BIN MODEL FORMAT REGEX
  [ $(left) -gt 50 ] || { echo "skip ncu $1"; return; }
  timeout $(( $(left) > 90 ? 80 : 40 )) $NCU --clock-control none --kernel-name "regex:$5" --launch-count 10 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats --csv --page raw \
    $2 bench latency --model $3 --load-format $4 --batch-size 1 --input-len 32 --output-len 4 --num-iters 1 \
    --num-warmup 0 --enforce-eager > $O/ncu-$1.csv 2> $O/ncu-$1.log
  echo "ncu $1 rc=$? [$((SECONDS-S)) s]"
  python3 - $O/ncu-$1.csv <<'PY'
import csv, sys
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
r = list(csv.reader(rows))
if len(r) < 3: sys.exit()
h = r[0]; ix = {n: i for i, n in enumerate(h)}
cols = ["gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "smsp__issue_active.avg.pct_of_peak_sustained_active", "sm__warps_active.avg.pct_of_peak_sustained_active"]
stalls = [n for n in h if n.startswith("smsp__average_warp_latency_issue_stalled_") and n.endswith(".ratio")]
for row in r[2:12]:
    def v(n):
        try: return float(row[ix[n]].replace(",", ""))
        except Exception: return -1
    top = sorted(stalls, key=v, reverse=True)[:4]
    print(row[ix["Kernel Name"]][:34], " ".join(f"{c.split('__')[1][:14]}={v(c):.1f}" for c in cols if c in ix),
          "|", " ".join(f"{t[41:-6]}={v(t):.1f}" for t in top))
PY
}
lat bf16 $B/met $L dummy; lat fp8 $B/met $F dummy; MET_FP8_ONE=a8 lat fp8-a8 $B/a8/met $F dummy
lat q4 $B/met $L dummy-q4_k_m; lat q4-d2 $B/a8/met $L dummy-q4_k_m
tl fp8 $B/met $F dummy; tl q4 $B/met $L dummy-q4_k_m
timeout $(( $(left) > 60 ? 60 : 1 )) $B/a8/kernels-ops gguf q4_k q6_k int8 --test-threads=4 > $O/ops-gguf-d2.log 2>&1
echo "ops gguf d2 rc=$?: $(grep -E '^test result|panicked' $O/ops-gguf-d2.log | head -3 | cut -c1-300) [$((SECONDS-S)) s]"
MET_FP8_ONE=a8 lat fp8-a8b $B/a8/met $F dummy; lat fp8b $B/met $F dummy; lat q4-d2b $B/a8/met $L dummy-q4_k_m; lat q4b $B/met $L dummy-q4_k_m
MET_FP8_ONE=a8 tl fp8a8 $B/a8/met $F dummy; tl q4d2 $B/a8/met $L dummy-q4_k_m; tl bf16 $B/met $L dummy
FP='fp8_gemv_(small|a8)'; G='gguf_gemv'
prof fp8 $B/met $F dummy "$FP"; MET_FP8_ONE=a8 prof fp8a8 $B/a8/met $F dummy "$FP"; prof q4 $B/met $L dummy-q4_k_m "$G"
for v in stream a8; do
  MET_FP8_ONE=$v timeout $(( $(left) > 45 ? 45 : 1 )) $B/a8/kernels-bench --bench 'cuda_fp8/(qkv|o|gate_up|down|gate_up_silu)/m1_|cuda_gemv/copy' > $O/kbench-$v.log 2>&1
  echo "kbench $v rc=$?"; awk -v v=$v '/^cuda_/{name=$1} /thrpt:/{print v, name, $4, $5}' $O/kbench-$v.log
done
echo "y done [$((SECONDS-S)) s]"; gzip $O/*.csv 2>/dev/null; tar czf $OUT/y.tgz -C $OUT y && rm -rf $OUT/y
if [[ "$GPU" == *H200* && $(left) -gt 150 ]]; then
  timeout $(( $(left) - 10 )) bash $B/session/nb_run.sh
  echo "nb done [$((SECONDS-S)) s]"; tar czf $OUT/nb.tgz -C $OUT nb && rm -rf $OUT/nb
fi
echo "all done [$((SECONDS-S)) s]"
