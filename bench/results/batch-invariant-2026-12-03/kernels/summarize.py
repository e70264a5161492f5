"""Medians over rounds of each bench's criterion estimate, BASE against FINAL, from the
`*-r*.txt` files `run.sh` writes next to this script."""
import glob, os, re, statistics, sys

UNIT = {"ns": 1e-3, "µs": 1.0, "us": 1.0, "ms": 1e3, "s": 1e6}

def estimates(path):
    name, out = None, {}
    for line in open(path, encoding="utf-8"):
        head = re.match(r"^([a-z_0-9]+/\S+)", line)
        if head:
            name = head.group(1)
        t = re.search(r"time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]", line)
        if t and name:
            out[name] = float(t.group(1)) * UNIT[t.group(2)]
            name = None
    return out

here = os.path.dirname(os.path.abspath(__file__))
runs = {b: [estimates(p) for p in sorted(glob.glob(f"{here}/{b}-r*.txt"))] for b in ("BASE", "FINAL")}
names = sorted({n for r in runs["BASE"] + runs["FINAL"] for n in r})
print(f"{'bench':52s} {'base µs':>10s} {'final µs':>10s} {'final/base':>10s}  rounds")
for n in names:
    b = [r[n] for r in runs["BASE"] if n in r]
    f = [r[n] for r in runs["FINAL"] if n in r]
    if b and f:
        mb, mf = statistics.median(b), statistics.median(f)
        print(f"{n:52s} {mb:10.1f} {mf:10.1f} {mf / mb:10.3f}  {len(b)}/{len(f)}")
