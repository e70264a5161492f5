L=/tmp/rb; mkdir -p $L; B=gpu-bundle
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
timeout 560 bash $B/run.sh $L/run gatestate compare bench kbench > $L/run.log 2>&1; echo "run.sh rc=$?"
tar czf $OUT/rb.tgz -C /tmp rb
sed -n '/======== met GPU summary/,$p' $L/run.log | grep -v "^GPU-FIXTURE" | head -60
grep -E "FAIL|^gate:" $L/run/gpu-gate-state.log | tail -8
