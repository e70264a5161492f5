#!/bin/bash
# Device call 2: decode-attention shapes with the metadata read before the PDL wait; every
# cuBLASLt candidate for the decode GEMMs against cublasGemmEx.
set -u
B=gpu-bundle; L=$OUT/d2; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used,driver_version --format=csv,noheader | tee $L/gpu.txt
timeout 120 .dev/lt_probe 64,128,256 > $L/lt_probe.txt 2>&1; echo "probe rc=$?"
grep -E "gemm_ex" $L/lt_probe.txt
for v in 4,3,0 4,3,1 4,2,1 2,3,0 2,3,1 2,2,1; do
  MET_FD=$v timeout 60 $B/tests/kernels-bench --bench 'cuda_attention/flash/decode' --warm-up-time 0.3 --measurement-time 1 > $L/kb-$v.log 2>&1
  echo "== MET_FD=$v $(grep -E '^cuda_attention|time:' $L/kb-$v.log | paste - - | awk '{printf "%s %s | ", $5, $6}')"
done
for v in 4,3,1 2,3,1 2,2,1; do
  MET_FD=$v timeout 90 $B/tests/kernels-ops cuda::paged_attention cuda::attention --test-threads=1 > $L/ops-$v.log 2>&1
  echo "ops MET_FD=$v rc=$? $(grep -E '^test result' $L/ops-$v.log)"
done
tp() { local name=$1; shift; timeout 60 $B/met bench throughput --load-format dummy --model $B/configs/Llama-3.1-8B-Instruct --num-prompts 256 --input-len 128 --output-len 256 --output $L/$name.json > $L/$name.log 2>&1; echo "$name: $(grep -E '^throughput' $L/$name.log)"; }
MET_FD=4,3,0 MET_FD_ZBIG=2 tp tp8b-w4s3p0-z2
MET_FD=2,3,1 MET_FD_ZBIG=1 tp tp8b-w2s3p1-z1
MET_FD=2,2,1 MET_FD_ZBIG=1 tp tp8b-w2s2p1-z1
MET_FD=2,3,0 MET_FD_ZBIG=1 tp tp8b-w2s3p0-z1
MET_FD=4,3,0 MET_FD_ZBIG=2 tp tp8b-w4s3p0-z2-r2
MET_FD=2,3,1 MET_FD_ZBIG=1 tp tp8b-w2s3p1-z1-r2
tar czf $OUT/d2.tgz -C $OUT d2
