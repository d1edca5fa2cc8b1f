#!/usr/bin/env bash
# Runs on the GPU machine after scripts/device_pack.sh (ppx_cuda_tests, personaplex-bench): the
# CUDA tests (w8a16 golden included), then the speed-flag ladder of personaplex-bench with random
# full-size weights: stock, --w8a16, + --dep-q-exit 8, + --skip-other-mimi (= --fast), FRAMES
# frames each (default 500), and --fast over 3000 frames (the context full); the GEMV table
# (personaplex-bench-kernels --only gemv8) and the w8a16-vs-bf16 drift study
# (personaplex-bench-quality, QFRAMES frames, default 500; 0 skips it) when those binaries were
# packed. RUNS picks ladder rows (default the first five; also fast_int8, fast_fp8 (--w8-format),
# fast_kv8 and fast_3000_kv8 (--kv-fp8)); GEMV_GRIDS the kernel bench's --gemv-grid values (default 0); QFORMATS the 8-bit types
# of the drift study (default int8; e.g. "int8 fp8").
# Output in $OUT: summary.txt and results.tar.gz (the device tool brings back at most 8 files).
set -u
cd "$(dirname "$0")/.."
. scripts/device_common.sh
frames=${FRAMES:-500}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.sm --format=csv > "$OUT/gpu.txt" 2>&1
$B/ppx_cuda_tests > "$OUT/cuda_tests.log" 2>&1; echo "cuda tests rc=$?" >> "$OUT/summary.txt"
grep -E "teacher-forced|w8a16|PASSED|FAILED|SKIPPED" "$OUT/cuda_tests.log" | head -40 >> "$OUT/summary.txt"
run() {  # name, flags...
  local name=$1; shift
  $B/personaplex-bench --device cuda --random-weights "$@" --out "$OUT/frame_$name.json" > "$OUT/bench_$name.log" 2>&1
  echo "bench $name rc=$?" >> "$OUT/summary.txt"
}
for r in ${RUNS:-stock w8a16 w8a16_dep8 fast fast_3000}; do
  case $r in
    stock) run stock --frames "$frames" ;;
    w8a16) run w8a16 --frames "$frames" --w8a16 ;;
    w8a16_dep8) run w8a16_dep8 --frames "$frames" --w8a16 --dep-q-exit 8 ;;
    fast) run fast --frames "$frames" --fast ;;
    fast_3000) run fast_3000 --frames 3000 --fast ;;
    fast_int8) run fast_int8 --frames "$frames" --fast --w8-format int8 ;;
    fast_fp8) run fast_fp8 --frames "$frames" --fast --w8-format fp8 ;;
    fast_kv8) run fast_kv8 --frames "$frames" --fast --kv-fp8 ;;
    fast_3000_kv8) run fast_3000_kv8 --frames 3000 --fast --kv-fp8 ;;
  esac
done
if [ -x $B/personaplex-bench-kernels ]; then
  for g in ${GEMV_GRIDS:-0}; do  # --gemv-grid 1: the one-warp-per-row-unit grid, for comparison
    $B/personaplex-bench-kernels --only gemv8 --gemv-grid "$g" --out "$OUT/kernels_gemv8_grid$g.json" > "$OUT/kernels_gemv8_grid$g.log" 2>&1
    echo "kernels gemv8 --gemv-grid $g rc=$?" >> "$OUT/summary.txt"
    grep -E "temporal|text head|depformer" "$OUT/kernels_gemv8_grid$g.log" | head -40 >> "$OUT/summary.txt"
  done
  $B/personaplex-bench-kernels --only depformer --out "$OUT/kernels_depformer.json" > "$OUT/kernels_depformer.log" 2>&1
  echo "kernels depformer rc=$?" >> "$OUT/summary.txt"
  grep -E "^depformer" "$OUT/kernels_depformer.log" >> "$OUT/summary.txt"
fi
if [ -x $B/personaplex-bench-quality ] && [ "${QFRAMES:-500}" != 0 ]; then
  for f in ${QFORMATS:-int8}; do  # the candidates compared with bf16: int8, fp8 (w8a16), kv8 (--kv-fp8 alone)
    n=quality_w8a16_$f
    args="--w8-format $f"
    [ "$f" = kv8 ] && { n=quality_kv_fp8; args="--no-w8 --kv-fp8"; }
    $B/personaplex-bench-quality --frames "${QFRAMES:-500}" $args --out "$OUT/$n.json" > "$OUT/$n.log" 2>&1
    echo "quality $f rc=$?" >> "$OUT/summary.txt"
    grep "^frame" "$OUT/$n.log" >> "$OUT/summary.txt"
  done
fi
python3 - "$OUT" <<'PY' >> "$OUT/summary.txt" 2>&1
import json, sys, os
d = sys.argv[1]
for f in sorted(os.listdir(d)):
    if f.startswith("frame_") and f.endswith(".json"):
        j = json.load(open(os.path.join(d, f)))
        st = j["stages_ms"]; t = j["total_ms"]
        print("%-22s total p50 %.2f p99 %.2f p99.9 %s | enc %.2f lm p50 %.2f p99 %.2f dec %.2f | over %d | %s" % (
            f, t["p50"], t["p99"], t.get("p99_9"), st["mimi_encode"]["p50"],
            st["lm_step"]["p50"], st["lm_step"]["p99"], st["mimi_decode"]["p50"], j["frames_over_budget"],
            j.get("flags")))
PY
cat "$OUT/summary.txt"
(cd "$OUT" && tar -czf results.tar.gz --exclude=results.tar.gz --exclude=summary.txt * && find . -maxdepth 1 -type f ! -name results.tar.gz ! -name summary.txt -delete)
