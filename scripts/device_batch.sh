#!/usr/bin/env bash
# Runs on the GPU machine (through the `device` tool) after scripts/device_pack.sh with
# ppx_cuda_tests, personaplex-bench and personaplex-bench-kernels in the pack: the CUDA suite, the
# batched kernels alone (GEMM against cuBLAS at B = 8..128, temporal attention at batch 1/16/64),
# then the batched LM step (`--lm-batch`) at several batch sizes and `--sessions` runs.
# Output in $OUT: summary.txt and one archive of every JSON and log.
#
# Environment (defaults in brackets):
#   TESTS [1]                    0 skips the CUDA suite (GTEST_FILTER narrows it)
#   KERNELS ["attention-batch gemm"]  personaplex-bench-kernels sections
#   LM_BATCH ["1 4 16 64"]       batch sizes of the --lm-batch runs
#   LM_RUNS ["fast:--fast"]      ';'-separated "NAME:FLAGS[:BIN]" --lm-batch runs (PREFILL [none]: steps first)
#   SESSION_RUNS [""]            ';'-separated "NAME:N:FLAGS" --sessions runs
#   FRAMES [50], WARMUP [5]      timed and warm-up steps
#   TIME_BUDGET_S [540]          a run that would start past this is skipped
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/device_common.sh
t0=$(date +%s)
budget=${TIME_BUDGET_S:-540}
frames=${FRAMES:-50}
warmup=${WARMUP:-5}
summary=$OUT/summary.txt
raw=$(mktemp -d /tmp/raw.XXXXXX)  # fresh per call: a warm machine keeps /tmp
mkdir -p "$raw"
: >"$summary"
note() { echo "$* ($(( $(date +%s) - t0 )) s)" | tee -a "$summary"; }
late() { [ $(( $(date +%s) - t0 )) -gt "$budget" ]; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >"$raw/gpu.txt" 2>&1
if [ "${TESTS:-1}" = 1 ]; then
  timeout 300 "$B/ppx_cuda_tests" ${GTEST_FILTER:+--gtest_filter="$GTEST_FILTER"} >"$raw/cuda_tests.log" 2>&1
  note "cuda tests rc=$?"
  grep -E "PASSED|FAILED|prefill vs|batched teacher" "$raw/cuda_tests.log" | head -20 >>"$summary"
fi
for k in ${KERNELS-attention-batch gemm}; do
  late && { note "kernels $k skipped (time budget)"; continue; }
  timeout 240 "$B/personaplex-bench-kernels" --only "$k" --out "$raw/kernels_$k.json" >"$raw/kernels_$k.log" 2>&1
  note "kernels $k rc=$?"
  grep -E "^attention|B= *64|B=128" "$raw/kernels_$k.log" | head -60 >>"$summary"
done
lm_batch_runs "1 4 16 64"
IFS=';' read -r -a s_runs <<<"${SESSION_RUNS:-}"
for e in "${s_runs[@]}"; do
  [ -n "$e" ] || continue
  IFS=':' read -r name n flags <<<"$e"
  late && { note "sessions $name skipped (time budget)"; continue; }
  # shellcheck disable=SC2086
  timeout 300 "$B/personaplex-bench" --device cuda --random-weights $flags --sessions "$n" --frames "$frames" \
    --warmup "$warmup" --out "$raw/sessions_$name.json" >"$raw/sessions_$name.log" 2>&1
  note "sessions $name rc=$?"
done
python3 - "$raw" <<'PY' >>"$summary" 2>&1
import json, os, sys
d = sys.argv[1]
for f in sorted(os.listdir(d)):
    if not f.endswith(".json"):
        continue
    j = json.load(open(os.path.join(d, f)))
    if f.startswith("lm_batch_"):
        for b in j["batches"]:
            s = b["step_ms"]
            print("%-28s B=%3d step p50 %6.2f p99 %6.2f  per session %.3f" % (f, b["batch"], s["p50"], s["p99"],
                  b["ms_per_session_p50"]))
    elif f.startswith("sessions_"):
        s, l = j["batch_step_ms"], j["added_latency_ms"]
        print("%-28s N=%3d step p50 %6.2f p99 %6.2f | latency p50 %6.1f p99 %6.1f | over %d of %d" % (
              f, j["sessions"], s["p50"], s["p99"], l["p50"], l["p99"], j["frames_over_budget"], j["frames"]))
PY
tar -czf "$OUT/raw.tar.gz" -C "$raw" .
