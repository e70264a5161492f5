#!/usr/bin/env bash
# The spinning pool before and after chunks are claimed dynamically: batch-1 decode of the
# default model on 2 threads, alone and beside one busy loop (another program wanting a
# core), old and new binaries interleaved. Usage: run.sh OUT_DIR OLD_MET NEW_MET [ROUNDS]
set -eu
OUT=$1; OLD=$2; NEW=$3; ROUNDS=${4:-3}
mkdir -p "$OUT"
export RAYON_NUM_THREADS=2
for r in $(seq 1 "$ROUNDS"); do
  for load in quiet busy; do
    for b in old new; do
      met=$OLD; [ $b = new ] && met=$NEW
      hog=
      if [ $load = busy ]; then sh -c 'while :; do :; done' & hog=$!; fi
      uptime >> "$OUT/load.txt"
      "$met" bench latency --device cpu --batch-size 1 --input-len 128 --output-len 128 --num-iters 2 \
        --output "$OUT/lat-$load-$b-r$r.json" > "$OUT/lat-$load-$b-r$r.log" 2>&1
      [ -n "$hog" ] && kill $hog
      grep -h "^latency:" "$OUT/lat-$load-$b-r$r.log" | sed "s/^/$load $b r$r: /"
    done
  done
done
