#!/bin/bash
# A/B of two met binaries on the default model: 128-token prompt, 128 generated, 2 threads.
IDS=$(python3 -c "print(','.join(str(100 + (i * 37) % 20000) for i in range(128)))")
M=~/.cache/met/models/SmolLM2-135M-Instruct.Q4_1.gguf
for r in $(seq 1 ${ROUNDS:-5}); do
  for dots in int8 exact; do
    for bin in "$@"; do
      t=$(RAYON_NUM_THREADS=2 MET_LOG=off $bin generate --model $M --prompt-ids $IDS --max-tokens 129 --ignore-eos --timing --cpu-dots $dots 2>&1 >/dev/null | tail -1)
      echo "$r $dots $bin $(echo $t | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print(round(d["prompt_tokens_per_s"],1), round(d["decode_tokens_per_s"],2))')"
    done
  done
done
