#!/usr/bin/env bash
# Runs on the GPU machine (through the `device` tool) after scripts/device_pack.sh: CUDA tests,
# golden checks and benchmarks. Everything lands in $OUT (JSON and logs); a summary prints last.
set -u
cd "$(dirname "$0")/.."
. scripts/device_common.sh
D=tests/data
frames=${FRAMES:-500}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.sm --format=csv > "$OUT/gpu.txt" 2>&1
$B/ppx_cuda_tests > "$OUT/cuda_tests.log" 2>&1; echo "cuda tests rc=$?" >> "$OUT/summary.txt"
grep -E "teacher-forced|PASSED|FAILED|SKIPPED|OK \]" "$OUT/cuda_tests.log" | head -40 >> "$OUT/summary.txt"
{
  echo "verify mimi cuda: $($B/personaplex-verify mimi --device cuda --config $D/tiny_config_a.json --mimi $D/mimi_tiny_a.safetensors --io $D/mimi_tiny_a_io.safetensors 2>&1)"
  echo "verify session cuda tf (vs cpu fp32): $($B/personaplex-verify session --device cuda --teacher-forced --config $D/tiny_config_a.json --mimi $D/mimi_tiny_a.safetensors --lm $D/lm_tiny_a.safetensors --session $D/session_tiny_a_cpu_fp32.safetensors 2>&1)"
  echo "verify session cuda tf (vs upstream bf16): $($B/personaplex-verify session --device cuda --teacher-forced --config $D/tiny_config_a.json --mimi $D/mimi_tiny_a.safetensors --lm $D/lm_tiny_a.safetensors --session $D/session_tiny_a_cuda_bf16.safetensors 2>&1)"
} >> "$OUT/summary.txt"
$B/personaplex-bench-kernels --out "$OUT/kernels.json" > "$OUT/kernels.log" 2>&1; cat "$OUT/kernels.log" >> "$OUT/summary.txt"
for v in stock skip-other-mimi; do
  extra=""; [ $v = skip-other-mimi ] && extra="--skip-other-mimi"
  $B/personaplex-bench --device cuda --random-weights --frames "$frames" $extra --out "$OUT/frame_cuda_$v.json" > "$OUT/bench_$v.log" 2>&1
  echo "bench $v rc=$?" >> "$OUT/summary.txt"
done
# A long run: the temporal ring fills to its 3000-token context.
$B/personaplex-bench --device cuda --random-weights --frames 3000 --out "$OUT/frame_cuda_stock_3000.json" > "$OUT/bench_3000.log" 2>&1
$B/personaplex-bench --device cuda --random-weights --frames 200 --skip-other-mimi --dep-q-exit 8 --out "$OUT/frame_cuda_dep8.json" > "$OUT/bench_dep8.log" 2>&1
$B/personaplex-bench-mimi --device cuda --frames 200 --out "$OUT/mimi_cuda.json" > "$OUT/bench_mimi.log" 2>&1
python3 - "$OUT" <<'PY' >> "$OUT/summary.txt" 2>&1
import json, sys, os
d = sys.argv[1]
for f in sorted(os.listdir(d)):
    if f.startswith("frame_cuda") and f.endswith(".json"):
        j = json.load(open(os.path.join(d, f)))
        st = j["stages_ms"]
        print(f, "total p50 %.2f p99 %.2f max %.2f | enc p50 %.2f lm p50 %.2f p99 %.2f dec p50 %.2f | over %d" % (
            j["total_ms"]["p50"], j["total_ms"]["p99"], j["total_ms"]["max"], st["mimi_encode"]["p50"],
            st["lm_step"]["p50"], st["lm_step"]["p99"], st["mimi_decode"]["p50"], j["frames_over_budget"]))
    if f == "mimi_cuda.json":
        j = json.load(open(os.path.join(d, f)))
        print(f, "encode p50", j.get("encode_ms", {}).get("p50"), "decode p50", j.get("decode_ms", {}).get("p50"))
PY
# The tool returns at most 8 files: keep the summary and one archive of everything.
(cd "$OUT" && tar -czf /tmp/results.tar.gz --exclude=summary.txt . ; find . -type f ! -name summary.txt -delete; mv /tmp/results.tar.gz .)
cat "$OUT/summary.txt"
