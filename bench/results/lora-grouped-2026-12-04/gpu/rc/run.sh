L=/tmp/rc; mkdir -p $L; B=gpu-bundle
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
timeout 20 $B/met generate --device cuda --model $B/configs/Qwen3-0.6B --load-format dummy --prompt-ids 1,2,3 --max-tokens 2 --kv-cache-dtype fp8 > $L/fp8-refusal.log 2>&1; echo "fp8 on cuda rc=$?"; grep -i "error" $L/fp8-refusal.log | tail -2 | cut -c1-300
timeout 250 bash $B/run.sh $L/run lib ops fixtures graphs generate compare > $L/run.log 2>&1; echo "run.sh rc=$?"
tar czf $OUT/rc.tgz -C /tmp rc
sed -n '/======== met GPU summary/,/^$/p' $L/run.log
sed -n '/^model  /,$p' $L/run/gpu-compare.log | head -5
