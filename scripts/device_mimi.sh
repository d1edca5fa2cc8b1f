#!/usr/bin/env bash
# Runs on the GPU machine (through the `device` tool) after scripts/device_pack.sh with
# personaplex-bench-mimi (and optionally personaplex-bench) in the pack: the batched codec
# (`personaplex-bench-mimi --batch`), then, where Nsight Compute reads the counters, every kernel
# of one batched encode and decode with its grid and time, then optionally `--lm-batch` runs.
# Output in $OUT: mimi_batch.json/.log, ncu_kernels.txt, lm_batch_*.json, summary.txt.
#
# Environment (defaults in brackets):
#   BATCHES ["1 8 32 64 128"]   batch sizes of the codec bench
#   NCU_BATCH [128]             batch size of the per-kernel profile; 0 skips it
#   LM_RUNS [""]                ';'-separated "NAME:FLAGS" personaplex-bench --lm-batch runs
#   LM_BATCH ["64 128"]         their batch sizes
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/device_common.sh
summary=$OUT/summary.txt
: >"$summary"
# shellcheck disable=SC2086
timeout 240 "$B/personaplex-bench-mimi" --device cuda --batch ${BATCHES:-1 8 32 64 128} --frames 20 --warmup 3 \
  --out "$OUT/mimi_batch.json" >"$OUT/mimi_batch.log" 2>&1
echo "mimi batch rc=$?" >>"$summary"
grep '^batch' "$OUT/mimi_batch.log" >>"$summary"
nb=${NCU_BATCH:-128}
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ "$nb" != 0 ] && [ -n "$ncu_bin" ]; then
  timeout 240 "$ncu_bin" --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    "$B/personaplex-bench-mimi" --device cuda --batch "$nb" --frames 1 --warmup 0 >/tmp/ncu.csv 2>/tmp/ncu.err
  echo "ncu rc=$? ($ncu_bin)" >>"$summary"
  tail -3 /tmp/ncu.err >>"$summary"
  grep -m3 -n '"ID"\|Metric' /tmp/ncu.csv | cut -c1-300 >>"$summary"
  python3 - /tmp/ncu.csv >"$OUT/ncu_kernels.txt" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10 and not r[0].startswith("{")]
if not rows:
    sys.exit(0)
h = rows[0]
ix = {k: h.index(k) for k in ("ID", "Kernel Name", "Grid Size", "Block Size", "Metric Value")}
total, by = 0.0, {}
print("%4s %10s %-40s %-16s %s" % ("id", "us", "kernel", "grid", "block"))
for r in rows[1:]:
    try:
        ns = float(r[ix["Metric Value"]].replace(",", ""))
    except ValueError:
        continue
    name = r[ix["Kernel Name"]].split("(")[0].split("<")[0][-40:]
    total += ns
    by[name] = by.get(name, 0) + ns
    print("%4s %10.1f %-40s %-16s %s" % (r[ix["ID"]], ns / 1e3, name, r[ix["Grid Size"]], r[ix["Block Size"]]))
print("total %.1f us" % (total / 1e3))
for k, v in sorted(by.items(), key=lambda kv: -kv[1]):
    print("  %-40s %10.1f us" % (k, v / 1e3))
PY
  tail -12 "$OUT/ncu_kernels.txt" >>"$summary"
fi
IFS=';' read -r -a lm_runs <<<"${LM_RUNS:-}"
for e in "${lm_runs[@]}"; do
  [ -n "$e" ] || continue
  IFS=':' read -r name flags <<<"$e"
  # shellcheck disable=SC2086
  timeout 300 "$B/personaplex-bench" --device cuda --random-weights $flags --lm-batch ${LM_BATCH:-64 128} \
    --frames 20 --warmup 3 --out "$OUT/lm_batch_$name.json" >"$OUT/lm_batch_$name.log" 2>&1
  echo "lm_batch $name rc=$?" >>"$summary"
  python3 -c "
import json,sys
j=json.load(open('$OUT/lm_batch_$name.json'))
for b in j['batches']: print('  B=%d step p50 %.2f p99 %.2f' % (b['batch'], b['step_ms']['p50'], b['step_ms']['p99']))
" >>"$summary" 2>&1
done
cat "$summary"
