L=$OUT/ra; mkdir -p $L; B=gpu-bundle
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
timeout 150 bash $B/run.sh $L/lb lorabench > $L/lb.log 2>&1; echo "lorabench rc=$?"
grep -h -E "^(latency|throughput):" $L/lb/bench-lora.log | cut -c1-200
timeout 420 bash $B/run.sh $L/run lib ops fixtures graphs generate gate > $L/run.log 2>&1; echo "run.sh rc=$?"
sed -n '/======== met GPU summary/,/^$/p' $L/run.log; grep -h -E "^FAILED|panicked" $L/run/*.log | head
grep -E "FAIL|^gate:" $L/run/gpu-gate.log | head -20
