#!/usr/bin/env bash
# Runs on the GPU machine after scripts/device_pack.sh with ppx_cuda_tests, personaplex-bench-mimi
# and personaplex-bench in the pack: --mimi-fp16 (issue #13) measured. The Mimi CUDA tests (the
# fp16-against-fp32 agreement on speech among them), then personaplex-bench-mimi at batch 1 (graph
# replays) and batched (BATCHES, default 1,8,16,32,64,128) in fp32, with --mimi-fp16 and with
# --mimi-fp16 --mimi-fp16-always, then personaplex-bench FRAMES frames (default 500) with the speed
# flags before --mimi-fp16 joined --fast and with --fast (LADDER=0 skips them).
# Output in $OUT: summary.txt and results.tar.gz (the device tool brings back few files).
set -u
cd "$(dirname "$0")/.."
. scripts/device_common.sh
raw=/tmp/mimi16
mkdir -p "$raw"
summary=$OUT/summary.txt
: >"$summary"
t0=$(date +%s)
note() { echo "$* ($(( $(date +%s) - t0 )) s)" | tee -a "$summary"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >"$raw/gpu.txt" 2>&1
timeout 240 "$B/ppx_cuda_tests" --gtest_filter="${GTEST_FILTER:-CudaMimi*:CudaCodec*}" >"$raw/cuda_tests.log" 2>&1
note "cuda tests rc=$?"
grep -E "PASSED|FAILED|mimi fp16" "$raw/cuda_tests.log" >>"$summary"
for mode in fp32 fp16 fp16_always; do
  flags=""
  [ "$mode" = fp16 ] && flags="--mimi-fp16"
  [ "$mode" = fp16_always ] && flags="--mimi-fp16 --mimi-fp16-always"
  # shellcheck disable=SC2086
  timeout 120 "$B/personaplex-bench-mimi" --device cuda --frames 100 --warmup 10 $flags \
    --out "$raw/mimi_b1_$mode.json" >"$raw/mimi_b1_$mode.log" 2>&1
  note "mimi batch-1 graphs $mode rc=$?"
  # shellcheck disable=SC2086
  timeout 200 "$B/personaplex-bench-mimi" --device cuda --batch "${BATCHES:-1,8,16,32,64,128}" --frames 30 \
    --warmup 5 $flags --out "$raw/mimi_batch_$mode.json" >"$raw/mimi_batch_$mode.log" 2>&1
  note "mimi batched $mode rc=$?"
  grep -E "^batch" "$raw/mimi_batch_$mode.log" >>"$summary"
done
if [ "${LADDER:-1}" = 1 ]; then
  frames=${FRAMES:-500}
  for e in "fast_before_fp16:--w8a16 --dep-q-exit 8 --skip-other-mimi" "fast:--fast"; do
    name=${e%%:*}
    # shellcheck disable=SC2086
    timeout 200 "$B/personaplex-bench" --device cuda --random-weights ${e#*:} --frames "$frames" \
      --out "$raw/frame_$name.json" >"$raw/frame_$name.log" 2>&1
    note "bench $name rc=$?"
  done
fi
python3 - "$raw" <<'PY' >>"$summary" 2>&1
import json, os, sys
d = sys.argv[1]
for f in sorted(os.listdir(d)):
    if not f.endswith(".json"):
        continue
    j = json.load(open(os.path.join(d, f)))
    if f.startswith("mimi_b1_"):
        print("%-24s encode p50 %.3f p99 %.3f | decode p50 %.3f p99 %.3f ms" % (
            f, j["encode_ms"]["p50"], j["encode_ms"]["p99"], j["decode_ms"]["p50"], j["decode_ms"]["p99"]))
    elif f.startswith("frame_"):
        t = j["total_ms"]
        print("%-24s total p50 %.3f p99 %.3f ms" % (f, t["p50"], t["p99"]))
PY
tar -czf "$OUT/results.tar.gz" -C "$raw" .
cat "$summary"
