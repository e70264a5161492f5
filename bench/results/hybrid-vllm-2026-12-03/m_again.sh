#!/bin/bash
# The hand-run second pass after m_chunk.sh, same machine (its /tmp/q36 tokenizer dir):
# Qwen3.5-27B 256 x (128 + 256), then the prefix test again plus one hit alone.
export MET_HOME=/tmp/met-home LD_LIBRARY_PATH=/usr/local/cuda/lib64; B=gpu-bundle
timeout 50 $B/met bench throughput --model configs/Qwen3.5-27B --load-format dummy --num-prompts 256 --input-len 128 --output-len 256 2>&1 | grep -E "^throughput"
$B/met serve --model /tmp/q36 --load-format dummy --port 8911 > /tmp/serve2.log 2>&1 & SP=$!
for i in $(seq 1 60); do curl -sf http://127.0.0.1:8911/v1/models > /dev/null && break; sleep 1; done
common="--base-url http://127.0.0.1:8911 --prefix-len 16384 --input-len 32 --output-len 16 --num-warmup 0 --seed 7"
for run in "cold 1 1" "hit 64 64" "hit1 1 1"; do set -- $run; timeout 30 $B/met bench serve $common --num-prompts $2 --concurrency $3 2>&1 | tail -1; done
kill $SP
