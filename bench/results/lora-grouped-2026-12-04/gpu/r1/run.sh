L=$OUT/r1; mkdir -p $L; B=gpu-bundle
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for t in $($B/tests/kernels-ops --list 2>/dev/null | grep -E '^cuda(_only)?::lora' | sed 's/: test$//'); do
  timeout 60 $B/tests/kernels-ops --exact $t --test-threads=1 --nocapture >> $L/ops-lora.log 2>&1 && echo "ok $t" || echo "FAIL $t"; done
timeout 240 bash $B/run.sh $L/lb lorabench > $L/lb.log 2>&1; echo "lorabench rc=$?"
grep -h -E "^(latency|throughput):|decode step|out tok" $L/lb/bench-lora.log | head -20
timeout 280 python3 bench/results/gate-qwen3next-hit-2026-12-03/diag.py --met $B/met --seeds 11-22 --work /tmp/diag --out $L/diag.json > $L/diag.log 2>&1; echo "diag rc=$?"
tail -30 $L/diag.log | cut -c1-400
