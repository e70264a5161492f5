#!/usr/bin/env bash
# Run 2b: the precision gate (both backends' default = flash), throughput, batch-token sweep.
set -u
B=gpu-bundle
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
$B/run.sh $OUT/logs gate 2>&1 | sed -n '/^== /p;/^attention sharpness/,$p' | tail -25
for m in Llama-3.1-8B-Instruct Qwen3-0.6B Qwen3-30B-A3B; do
  timeout 100 $B/met bench throughput --model $B/configs/$m --load-format dummy --num-prompts 256 --input-len 128 --output-len 256 --output $OUT/tp-$m.json 2>&1 | grep -E "^throughput"
done
timeout 100 $B/met bench latency --model $B/configs/Llama-3.1-8B-Instruct --load-format dummy --batch-size 1 --input-len 128 --output-len 256 --num-iters 3 --output $OUT/lat-8b-b1.json 2>&1 | grep -E "^latency"
timeout 100 $B/met bench throughput --model $B/configs/Llama-3.1-8B-Instruct --load-format dummy --num-prompts 32 --input-len 4096 --output-len 256 --output $OUT/tp4k-8b.json 2>&1 | grep -E "^throughput"
echo "== max-batch-tokens sweep, 8B, 256 x (128 + 256)"
for mbt in 2048 4096 16384; do
  echo "-- $mbt"; timeout 100 $B/met bench throughput --model $B/configs/Llama-3.1-8B-Instruct --load-format dummy --num-prompts 256 --input-len 128 --output-len 256 --max-batch-tokens $mbt --output $OUT/tp-8b-mbt$mbt.json 2>&1 | grep -E "^throughput"
done
