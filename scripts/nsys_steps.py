#!/usr/bin/env python3
"""Per-step GPU timeline of `personaplex-bench --lm-batch ... --profile-steps N` under Nsight Systems.

Usage: nsys_steps.py TRACE_CSV [BENCH_JSON]
TRACE_CSV: `nsys stats --report cuda_gpu_trace --format csv` of the capture (graph nodes traced).
The capture holds N steps, each one graph replay plus its copies; the host waits between steps, so
the N - 1 widest gaps between consecutive GPU operations separate them (N from BENCH_JSON's
"profile_steps" when given, else the count of gaps above 50 us, plus one). Prints, per step: the span from
its first operation's start to its last one's end, the time some kernel or copy ran (the union of
their intervals), the sum of their durations, the count, and the widest idle gap inside it; then,
for the step with the median span, the GPU time per kernel name (in-graph times, not serialized as
under Nsight Compute); and the bench's wall-clock step times for comparison.
"""
import csv
import json
import re
import statistics
import sys


def load(path):
    ops = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            start = row.get("Start (ns)") or row.get("Start")
            dur = row.get("Duration (ns)") or row.get("Duration")
            name = row.get("Name") or ""
            if not start or not dur:
                continue
            ops.append((int(float(start)), int(float(dur)), name))
    ops.sort()
    return ops


def main():
    ops = load(sys.argv[1])
    bench = None
    if len(sys.argv) > 2:
        try:
            bench = json.load(open(sys.argv[2]))
        except (OSError, ValueError):
            bench = None
    if not ops:
        print("no GPU operations in the trace")
        return
    gaps = []  # (gap ns, index of the op after it)
    end = ops[0][0] + ops[0][1]
    for i in range(1, len(ops)):
        gaps.append((ops[i][0] - end, i))
        end = max(end, ops[i][0] + ops[i][1])
    n = None
    if bench is not None:
        n = bench.get("profile_steps") or bench.get("frames")
    if not isinstance(n, int) or n < 1:
        n = 1 + sum(1 for g, _ in gaps if g > 50_000)
    cuts = sorted(i for _, i in sorted(gaps, reverse=True)[: max(0, n - 1)])
    bounds = [0] + cuts + [len(ops)]
    steps = []
    for a, b in zip(bounds, bounds[1:]):
        seg = ops[a:b]
        first = seg[0][0]
        last = max(s + d for s, d, _ in seg)
        busy, cur_s, cur_e, widest = 0, seg[0][0], seg[0][0] + seg[0][1], 0
        for s, d, _ in seg[1:]:
            if s > cur_e:
                busy += cur_e - cur_s
                widest = max(widest, s - cur_e)
                cur_s, cur_e = s, s + d
            else:
                cur_e = max(cur_e, s + d)
        busy += cur_e - cur_s
        steps.append((last - first, busy, sum(d for _, d, _ in seg), len(seg), widest, seg))
    print("step  span_ms  busy_ms  sum_ms  ops  widest_gap_us")
    for k, (span, busy, total, count, widest, _) in enumerate(steps):
        print(f"{k:4d}  {span / 1e6:7.3f}  {busy / 1e6:7.3f}  {total / 1e6:6.3f}  {count:4d}  {widest / 1e3:8.1f}")
    med = sorted(steps, key=lambda s: s[0])[len(steps) // 2]
    per = {}
    for _, d, name in med[5]:
        key = re.sub(r"\(.*", "", name)[:90]
        t, c = per.get(key, (0, 0))
        per[key] = (t + d, c + 1)
    print(f"median step ({med[0] / 1e6:.3f} ms span): GPU time per kernel name")
    for key, (t, c) in sorted(per.items(), key=lambda kv: -kv[1][0])[:30]:
        print(f"  {t / 1e3:9.1f} us  {c:5d} x {t / c / 1e3:7.2f} us  {key}")
    print(f"  {sum(t for t, _ in per.values()) / 1e3:9.1f} us  in all")
    if bench is not None:
        for e in bench.get("batches", []):
            if "step_ms" in e:
                sm = e["step_ms"]
                print(f"bench wall step (batch {e.get('batch')}): p50 {sm.get('p50')} ms, p99 {sm.get('p99')} ms")
    spans = [s[0] / 1e6 for s in steps]
    print(f"span p50 {statistics.median(spans):.3f} ms over {len(spans)} steps")


if __name__ == "__main__":
    main()
