#!/usr/bin/env bash
# Depformer diagnosis on the GPU machine (after scripts/device_pack.sh): depformer tests, compute-
# sanitizer on the persistent kernel, the kernel bench's depformer section, and the frame bench with
# each depformer path. Results in $OUT.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/devrun
tar -xJf devpkg/devrun.tar.xz -C /tmp/devrun
export LD_LIBRARY_PATH=/tmp/devrun/lib:${LD_LIBRARY_PATH:-}
B=/tmp/devrun/bin
timeout 300 $B/ppx_cuda_tests --gtest_filter='CudaLmDepformer.*:CudaLmGolden.*' > "$OUT/tests.log" 2>&1
grep -E "Failure|actual|rel L2|teacher|OK \]|FAILED \]" "$OUT/tests.log" | head -40
CS=$(ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$CS" ]; then
  for tool in memcheck racecheck; do
    timeout 240 "$CS" --tool $tool $B/ppx_cuda_tests --gtest_filter='CudaLmDepformer.PersistentBatchRowsTiny' > "$OUT/$tool.log" 2>&1
    echo "== $tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|hazard|PASSED|FAILED" "$OUT/$tool.log" | head -8
  done
fi
timeout 300 $B/personaplex-bench-kernels --out "$OUT/kernels.json" > "$OUT/kernels.log" 2>&1
grep -A100 "depformer step, per-op" "$OUT/kernels.log"
for v in v2 v1 perop; do
  env=""; [ $v = v1 ] && env="PPX_DEP_KERNEL=1"; [ $v = perop ] && env="PPX_DEP_PERSISTENT=0"
  env $env timeout 200 $B/personaplex-bench --device cuda --random-weights --frames 300 --out "$OUT/frame_$v.json" > "$OUT/frame_$v.log" 2>&1
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); t=j['total_ms']; l=j['stages_ms']['lm_step']; print(sys.argv[2], 'total p50 %.2f p99 %.2f | lm p50 %.2f p99 %.2f' % (t['p50'], t['p99'], l['p50'], l['p99']))" "$OUT/frame_$v.json" $v
done
