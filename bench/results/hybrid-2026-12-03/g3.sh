#!/bin/bash
# transformers' own bf16 greedy continuations of the hybrid fixtures on the H200, against
# the float32 reference: the noise met's CUDA token counts (g2) are read against.
set -u
N=${NAME:-g3}; L=$OUT/$N; mkdir -p $L; cp -r crates/model-layers/tests/fixtures/hf /tmp/hf-fixtures
timeout 300 python3 scripts/hf_bf16_hybrid_greedy.py --fixtures /tmp/hf-fixtures \
  --met-json bench/results/hybrid-2026-12-03/g2-hybrid.json > $L/bf16.log 2>&1; echo "rc=$?"
grep -E "BF16|Error|error" $L/bf16.log | head -20
