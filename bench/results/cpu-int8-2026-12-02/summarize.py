#!/usr/bin/env python3
"""Medians of the decode-step p50 (ms) and prefill p50 (ms) over the rounds of run.sh.

Usage: summarize.py DIR  (reads DIR/lat-b*-LEVEL-DOTS-rN.log)
"""
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

runs = defaultdict(list)
for log in sorted(Path(sys.argv[1]).glob("lat-b*-r*.log")):
    name = re.match(r"lat-b(\d+)-(\w+)-(\w+)-r(\d+)", log.stem)
    line = next(l for l in log.read_text().splitlines() if l.startswith("latency:"))
    step = float(re.search(r"decode step p50 ([\d.]+) ms", line).group(1))
    prefill = float(re.search(r"prefill p50 ([\d.]+) ms", line).group(1))
    runs[name.group(1, 2, 3)].append((int(name.group(4)), step, prefill))
print("| batch | SIMD | dots | decode step p50 per round (ms) | median | tok/s at median | prefill median (ms) |")
print("|---:|---|---|---|---:|---:|---:|")
for (batch, level, dots), rounds in sorted(runs.items(), key=lambda kv: (int(kv[0][0]), kv[0][1] != "avx512", kv[0][2])):
    rounds.sort()
    steps = [s for _, s, _ in rounds]
    med = statistics.median(steps)
    print(f"| {batch} | {level} | {dots} | {' / '.join(f'{s:.2f}' for s in steps)} | {med:.2f} | "
          f"{int(batch) * 1000 / med:.1f} | {statistics.median(p for *_, p in rounds):.0f} |")
