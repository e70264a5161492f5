#!/usr/bin/env python3
"""Per-launch table of an `ncu --csv --page raw` log gathered with the SpeedOfLight,
WarpStateStats, Occupancy and LaunchStats sections: time, DRAM throughput, achieved
occupancy, issue-slot use, registers, grid, and the four largest stall reasons (warps
stalled per issued instruction). Usage: ncu_table.py LOG.csv.gz ..."""
import csv, gzip, sys
for path in sys.argv[1:]:
    lines=[l for l in gzip.open(path,"rt") if l.startswith('"')]
    r=list(csv.reader(lines)); h=r[0]; ix={n:i for i,n in enumerate(h)}
    def v(row,n):
        try: return float(row[ix[n]].replace(",",""))
        except: return float('nan')
    stalls=[n for n in h if n.startswith("smsp__average_warps_issue_stalled_") and n.endswith("_per_issue_active.ratio")]
    print("==", path)
    for row in r[2:]:
        name=row[ix["Kernel Name"]][:26]
        t=v(row,"gpu__time_duration.sum")/1e3
        dram=v(row,"gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed")
        bps=v(row,"dram__bytes.sum.per_second")/2**30
        occ=v(row,"sm__warps_active.avg.pct_of_peak_sustained_active")
        iss=v(row,"smsp__issue_active.avg.pct_of_peak_sustained_active")
        regs=v(row,"launch__registers_per_thread"); grid=v(row,"launch__grid_size")
        top=sorted(stalls,key=lambda n:-v(row,n))[:4]
        print(f"{name:26s} {t:7.1f}us dram {dram:5.1f}% {bps:6.0f}GiB/s occ {occ:4.1f} issue {iss:4.1f} regs {regs:.0f} grid {grid:.0f} |",
              " ".join(f"{n[34:-23]}={v(row,n):.2f}" for n in top))
