#!/bin/bash
# Session 22, call 3 (H200: Qwen3.6-35B-A3B in bf16 needs its memory): where the device time
# of the 16k burst's steps goes (MET_KERNEL_TIMES=1 through met serve), then Qwen3.6 batch-1
# eager decode's kernel table.
set -u
B=gpu-bundle-next; bash $B/unpack.sh > /dev/null
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} MET_HOME=/tmp/met-home-shared MET_LOG=info
mkdir -p $MET_HOME
S=$SECONDS; left() { echo $((${DEADLINE:-585} - (SECONDS - S))); }
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
if [[ "$GPU" == *H200* ]]; then
  O=$OUT/kb; mkdir -p $O
  python3 scripts/dummy_tokenizer.py configs/Qwen3.6-35B-A3B /tmp/q36 > /dev/null
  MET_KERNEL_TIMES=1 MET_LOG=warn,met=info,met_server=info,met_scheduler=debug \
    $B/met serve --model /tmp/q36 --load-format dummy --port 8911 > $O/serve.log 2>&1 &
  SP=$!
  for i in $(seq 1 150); do curl -sf http://127.0.0.1:8911/v1/models > /dev/null && break; sleep 1; done
  c="--prefix-len 16384 --input-len 32 --output-len 16 --num-warmup 0 --seed 7"
  for x in cold:1 burst:64; do
    n=${x%:*}; m=${x#*:}
    timeout 90 $B/met bench serve --base-url http://127.0.0.1:8911 $c --num-prompts $m --concurrency $m \
      --output $O/ttft-$n.json > $O/ttft-$n.log 2>&1
    echo "$n: $(grep -E '^c=' $O/ttft-$n.log)"
  done
  kill $SP; wait $SP 2> /dev/null
  grep -E "step [0-9.]+ ms|step kernel times" $O/serve.log | tail -12 | cut -c1-1200
  gzip $O/serve.log; tar czf $OUT/kb.tgz -C $OUT kb && rm -rf $OUT/kb
fi
O=$OUT/kq; mkdir -p $O
MET_KERNEL_TIMES=1 timeout 200 $B/met bench latency --model configs/Qwen3.6-35B-A3B --load-format dummy --batch-size 1 \
  --input-len 128 --output-len 16 --num-iters 1 --num-warmup 0 --enforce-eager > $O/kt-q36.log 2>&1
echo "kt q36 rc=$? [$((SECONDS-S)) s]"; grep "step kernel times" $O/kt-q36.log | tail -1 | cut -c1-1500
gzip $O/kt-q36.log; tar czf $OUT/kq.tgz -C $OUT kq && rm -rf $OUT/kq
echo "all done [$((SECONDS-S)) s]"
