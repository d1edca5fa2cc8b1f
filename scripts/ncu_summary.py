#!/usr/bin/env python3
"""Sorted GPU time per kernel from an `ncu --print-summary per-kernel --metrics gpu__time_duration.sum` log.

Usage: ncu_summary.py LOG [SKIP_REGEX]. Prints total microseconds, launches, the mean and the grid per
kernel name and grid, largest first, and the sum; kernels whose name matches SKIP_REGEX (default: the
random-weight set-up's fill, quantize and probe kernels) are left out of the table and the sum.
"""
import re
import sys

UNIT = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def main():
    text = open(sys.argv[1]).read()
    skip = re.compile(sys.argv[2] if len(sys.argv) > 2 else r"fill_kernel|quantize|probe_kernel|to_bf16")
    pat = re.compile(r"\n  (\S.*?) \((\d+, \d+, \d+)\)x\((\d+, \d+, \d+)\), .*?Invocations (\d+)\n"
                     r".*?gpu__time_duration.sum\s+(\w+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", re.S)
    rows = []
    for name, grid, _block, inv, unit, _mn, _mx, avg in pat.findall(text):
        if skip.search(name):
            continue
        a = float(avg) * UNIT.get(unit, 1.0)
        rows.append((int(inv) * a, int(inv), a, grid, re.sub(r"\(.*", "", name)[:80]))
    rows.sort(reverse=True)
    for total, inv, a, grid, name in rows:
        print(f"{total:9.1f} us  {inv:5d} x {a:7.2f} us  grid {grid:>12}  {name}")
    print(f"{sum(r[0] for r in rows):9.1f} us  in all")


if __name__ == "__main__":
    main()
