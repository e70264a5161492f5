#!/usr/bin/env bash
# Kernel benches (crates/kernels/benches/cpu.rs, the branch's version in both binaries):
# BASE built from 677840b (main before the branch) and FINAL from the branch, alternating
# per round. Build each with `cargo bench -p met-kernels --bench cpu --no-run` and pass
# the two executables as BASE and FINAL.
set -euo pipefail
OUT="$(dirname "$0")"
FILTER='layer_q4_1|matmul_quant/q4_1/(exact|int8)/m(1|64)_|matmul_f32|prefill_1x256'
for round in ${ROUNDS:-1 2 3}; do
  for b in BASE FINAL; do
    "${!b}" --bench "$FILTER" --warm-up-time 0.3 --measurement-time 2 --noplot > "$OUT/$b-r$round.txt" 2>&1
  done
done
