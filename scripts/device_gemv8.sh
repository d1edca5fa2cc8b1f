#!/usr/bin/env bash
# Runs on the GPU machine after scripts/device_pack.sh: the CUDA tests (fp8 GEMV included), the
# server suite on the CUDA backend, and the kernel bench's bf16 vs fp8 GEMV section. Output in $OUT.
set -u
cd "$(dirname "$0")/.."
. scripts/device_common.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.sm --format=csv > "$OUT/gpu.txt" 2>&1
$B/ppx_cuda_tests > "$OUT/cuda_tests.log" 2>&1; echo "cuda tests rc=$?" >> "$OUT/summary.txt"
grep -E "teacher-forced|rel_l2|PASSED|FAILED|SKIPPED|OK \]" "$OUT/cuda_tests.log" | head -60 >> "$OUT/summary.txt"
PPX_TEST_DEVICE=cuda timeout 400 $B/ppx_server_tests --gtest_brief=1 > "$OUT/server_tests_cuda.log" 2>&1
echo "server tests on cuda rc=$?" >> "$OUT/summary.txt"
grep -E "PASSED|FAILED" "$OUT/server_tests_cuda.log" | head -20 >> "$OUT/summary.txt"
$B/personaplex-bench-kernels --only gemv8 --out "$OUT/kernels_gemv8.json" > "$OUT/kernels_gemv8.log" 2>&1
echo "bench gemv8 rc=$?" >> "$OUT/summary.txt"
cat "$OUT/kernels_gemv8.log" >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
