#!/usr/bin/env bash
# The GPU tests and the gate on the MoE change, Qwen3-30B-A3B after it, and the live suites on CUDA.
set -u
B=gpu-bundle; S=gpu-bundle-stage; L=/tmp/logs3; mkdir -p $L
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bash $B/run.sh $L lib ops fixtures graphs gate > $L/run.out 2>&1
M=$S/configs/Qwen3-30B-A3B
timeout 120 $B/met bench throughput --model $M --load-format dummy --num-prompts 256 --input-len 128 --output-len 256 --output $L/tp-30b-a3b.json > $L/tp-30b-a3b.log 2>&1
timeout 90 $B/met bench latency --model $M --load-format dummy --batch-size 1 --input-len 128 --output-len 128 --num-iters 2 --output $L/lat-30b-a3b-b1.json > $L/lat-30b-a3b-b1.log 2>&1
timeout 90 $B/met bench latency --model $M --load-format dummy --batch-size 64 --input-len 128 --output-len 128 --num-iters 2 --output $L/lat-30b-a3b-b64.json > $L/lat-30b-a3b-b64.log 2>&1
# The live suites: the default model put where met looks for it (the fault tests start their own server).
mkdir -p /root/.cache/met/models
cp gpu-bundle-model/c/part.ac /tmp/model/; cat /tmp/model/part.aa /tmp/model/part.ab /tmp/model/part.ac > /root/.cache/met/models/SmolLM2-135M-Instruct.Q4_1.gguf
M=/root/.cache/met/models/SmolLM2-135M-Instruct.Q4_1.gguf; md5sum $M > $L/model.md5
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/whl/*.whl > $L/pip.log 2>&1
export PYTHONPATH=/tmp/site
KEY=met-live-key
serve() { MET_LOG=info $B/met serve --device cuda --model $M --host 127.0.0.1 --port $1 --api-key $KEY --reasoning-parser qwen3 $2 > $L/serve-$1.log 2>&1 & SP=$!
  for i in $(seq 1 90); do curl -sf -H "Authorization: Bearer $KEY" http://127.0.0.1:$1/v1/models >/dev/null 2>&1 && break; sleep 1; done; }
serve 8898 ""
for s in crates/server/tests/live/test_openai.py crates/server/tests/live/test_agents.py; do
  MET_BASE_URL=http://127.0.0.1:8898 MET_API_KEY=$KEY timeout 200 python3 $s > $L/live-$(basename $s .py).log 2>&1; echo "$s rc=$?" >> $L/live.rc
done
kill $SP; wait $SP 2>/dev/null
# The old reasoning test (no warm-up request) against a server without prefix caching.
serve 8897 "--no-prefix-caching"
MET_BASE_URL=http://127.0.0.1:8897 MET_API_KEY=$KEY timeout 100 python3 $S/test_agents_old.py TestReasoning > $L/live-old-reasoning-nocache.log 2>&1; echo "old reasoning, no prefix cache rc=$?" >> $L/live.rc
kill $SP; wait $SP 2>/dev/null
tar czf $OUT/logs3.tgz -C /tmp logs3
grep -A8 "met GPU summary" $L/run.out; grep -E "^FAILED|panicked" $L/*.log | head -20
grep -E "gate:" $L/gpu-gate.log | head -3
cat $L/model.md5 $L/live.rc; tail -n 3 $L/live-*.log
for f in $L/tp-30b-a3b.log $L/lat-30b-a3b-*.log; do echo "== $f"; grep -E "warm-up|throughput:|latency:" $f | cut -c1-300; done
