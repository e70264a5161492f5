L=$OUT/r2; mkdir -p $L; B=gpu-bundle
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
M=$B/configs/Llama-3.1-8B-Instruct
for lora in "--lora-dummy 8:16" ""; do
timeout 200 ncu --clock-control none --cache-control none --csv --page raw \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  $B/met bench latency --model $M --load-format dummy --batch-size 256 --input-len 16 --output-len 3 \
  --num-iters 1 --num-warmup 0 --enforce-eager $lora > $L/ncu.csv 2>$L/ncu.err
echo "== lora=[$lora] rc=$?"; python3 $B/ncu_summary.py $L/ncu.csv --by-step | sed -n '/-- decode/,$p' | head -30
done
