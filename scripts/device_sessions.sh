#!/usr/bin/env bash
# Runs on the GPU machine (through the `device` tool) after scripts/device_pack.sh with
# ppx_cuda_tests and personaplex-bench in the pack: the CUDA suite (the batched LM against the
# batch-1 stepper among it), then `personaplex-bench --sessions N` (the frame scheduler with the
# batched CUDA LM, full-size random weights) at several N. Output in $OUT: summary.txt and one
# archive of the JSON and logs.
#
# Environment (defaults in brackets):
#   SESSIONS ["1 4 8 16 32 64"]  session counts of the --fast runs
#   FLAGS ["--fast"]             speed flags of those runs
#   EXTRA_RUNS [""]              further runs, ';'-separated "NAME:N:FLAGS" (e.g. "kvfp8_64:64:--fast --kv-fp8")
#   FRAMES [100], WARMUP [10]    timed and warm-up frames per session
#   TESTS [1]                    0 skips the CUDA suite
#   TIME_BUDGET_S [540]          a run that would start past this is skipped
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/device_common.sh
t0=$(date +%s)
budget=${TIME_BUDGET_S:-540}
frames=${FRAMES:-100}
warmup=${WARMUP:-10}
summary=$OUT/summary.txt
: >"$summary"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >"$OUT/gpu.txt" 2>&1
if [ "${TESTS:-1}" = 1 ]; then
  "$B/ppx_cuda_tests" >"$OUT/cuda_tests.log" 2>&1
  echo "cuda tests rc=$?" >>"$summary"
  grep -E "PASSED|FAILED|SKIPPED" "$OUT/cuda_tests.log" | head -20 >>"$summary"
fi
run() {  # run NAME N FLAGS...
  local name=$1 n=$2
  shift 2
  if [ $(( $(date +%s) - t0 )) -gt "$budget" ]; then
    echo "$name skipped (time budget)" >>"$summary"
    return
  fi
  # shellcheck disable=SC2068
  "$B/personaplex-bench" --device cuda --random-weights $@ --sessions "$n" --frames "$frames" --warmup "$warmup" \
    --out "$OUT/sessions_$name.json" >"$OUT/sessions_$name.log" 2>&1
  echo "$name rc=$? ($(( $(date +%s) - t0 )) s)" >>"$summary"
}
for n in ${SESSIONS:-1 4 8 16 32 64}; do run "fast_n$n" "$n" ${FLAGS:---fast}; done
IFS=';' read -r -a extra <<<"${EXTRA_RUNS:-}"
for e in "${extra[@]}"; do
  [ -n "$e" ] || continue
  IFS=':' read -r name n flags <<<"$e"
  # shellcheck disable=SC2086
  run "$name" "$n" $flags
done
python3 - "$OUT" <<'PY' >>"$summary" 2>&1
import json, os, sys
d = sys.argv[1]
for f in sorted(os.listdir(d)):
    if f.startswith("sessions_") and f.endswith(".json"):
        j = json.load(open(os.path.join(d, f)))
        s, l, b = j["batch_step_ms"], j["added_latency_ms"], j["batch_size"]
        print("%-28s N=%3d step p50 %6.2f p99 %6.2f p99.9 %6.2f | latency p50 %6.1f p99 %6.1f p99.9 %6.1f max %6.1f"
              " | batch mean %5.1f | over %d of %d" % (f, j["sessions"], s["p50"], s["p99"], s["p99_9"], l["p50"],
              l["p99"], l["p99_9"], l["max"], b["mean"], j["frames_over_budget"], j["frames"]))
PY
(cd "$OUT" && tar -czf /tmp/results.tar.gz --exclude=summary.txt . ; find . -type f ! -name summary.txt -delete; mv /tmp/results.tar.gz .)
cat "$summary"
