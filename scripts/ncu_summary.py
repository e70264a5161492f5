#!/usr/bin/env python3
"""Summarises an `ncu --csv --page raw` kernel log: time and DRAM traffic per kernel name.

Usage: ncu_summary.py LOG [STEPS] [--by-step]. LOG holds ncu's CSV rows (one per kernel
launch, with the gpu__time_duration.sum and dram__bytes_read.sum / dram__bytes_write.sum
metrics). Totals are divided into per-step figures by the number of sampling launches (one
per decode step), or by STEPS when the log has none. Prints one line per kernel name,
largest total time first: launches, total and mean microseconds, share of the time, and the
achieved DRAM bandwidth (bytes read + written over the kernel's time).

With --by-step the launches are cut into engine steps (a step ends with its last sampling
kernel: `argmax_merge` or `sample_rows`), each step is called decode when it ran the decode
attention kernel and prefill otherwise, and each kind gets its own table, per step of that
kind. Launches before the first step that ran attention (weight loading) are left out.
"""

import csv
import sys
from collections import defaultdict

STEP_END = ("argmax_merge", "sample_rows")


def rows(path):
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    reader = csv.reader(lines)
    header = next(reader)
    for row in reader:
        if len(row) != len(header) or not row[0] or not row[0][0].isdigit():
            continue  # the units row, or noise
        yield dict(zip(header, row))


def number(text):
    return float(text.replace(",", "")) if text not in ("", "n/a") else 0.0


def launches(path):
    for r in rows(path):
        name = r.get("Kernel Name", "?").split("(")[0][:60]
        us = number(r.get("gpu__time_duration.sum", "0")) / 1e3  # ns -> us
        dram = number(r.get("dram__bytes_read.sum", "0")) + number(r.get("dram__bytes_write.sum", "0"))
        yield name, us, dram


def table(items, steps, title=None):
    total = defaultdict(lambda: [0, 0.0, 0.0])
    for name, us, dram in items:
        t = total[name]
        t[0] += 1
        t[1] += us
        t[2] += dram
    grand = sum(t[1] for t in total.values()) or 1.0
    if title:
        print(f"-- {title}")
    print(f"per step (÷{steps:g}): {grand / steps:.1f} us of kernel time in {sum(t[0] for t in total.values()) / steps:.0f} launches")
    print(f"{'kernel':60} {'launches':>8} {'us/step':>9} {'mean us':>8} {'share':>6} {'GB/s':>7}")
    for name, (n, us, dram) in sorted(total.items(), key=lambda kv: -kv[1][1]):
        gbs = dram / (us * 1e-6) / 1e9 if us > 0 else 0.0
        print(f"{name:60} {n / steps:8.1f} {us / steps:9.1f} {us / n:8.2f} {100 * us / grand:5.1f}% {gbs:7.0f}")


def by_step(items):
    steps, current = [], []
    for item in items:
        current.append(item)
        if item[0].startswith(STEP_END):
            steps.append(current)
            current = []
    kinds = defaultdict(list)
    for step in steps:
        names = [name for name, _, _ in step]
        if any(n.startswith(("decode_attention", "flash_decode")) for n in names):
            kinds["decode"].append(step)
        elif any("attention" in n or n.startswith("flash_prefill") for n in names):
            kinds["prefill"].append(step)
    for kind in ("prefill", "decode"):
        if kinds[kind]:
            flat = [item for step in kinds[kind] for item in step]
            table(flat, float(len(kinds[kind])), f"{kind}: {len(kinds[kind])} steps")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    items = list(launches(args[0]))
    if "--by-step" in sys.argv:
        by_step(items)
        return
    steps = float(args[1]) if len(args) > 1 else 1.0
    sampled = sum(1 for name, _, _ in items if name.startswith("sample_rows"))
    table(items, float(sampled) if sampled else steps)


if __name__ == "__main__":
    main()
