#!/usr/bin/env bash
# A/B of environment switches on the GPU machine (after scripts/device_pack.sh): the CUDA tests
# with each switch, then the stock frame bench with each. Usage: device_ab.sh "VAR=1" ["VAR2=1" ...]
# (an empty string is the default configuration). Results in $OUT.
set -u
cd "$(dirname "$0")/.."
. scripts/device_common.sh
frames=${FRAMES:-500}
for v in "$@"; do
  tag=${v:-default}; tag=${tag//=/_}
  env $v timeout 200 $B/ppx_cuda_tests --gtest_filter='CudaLm*' > "$OUT/tests_$tag.log" 2>&1
  echo "tests [$tag] rc=$? $(grep -E 'PASSED|FAILED' "$OUT/tests_$tag.log" | tr '\n' ' ')"
  env $v timeout 200 $B/personaplex-bench --device cuda --random-weights --frames "$frames" --out "$OUT/frame_$tag.json" > "$OUT/frame_$tag.log" 2>&1
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); t=j['total_ms']; l=j['stages_ms']['lm_step']; print(sys.argv[2], 'total p50 %.2f p99 %.2f | lm p50 %.2f p99 %.2f' % (t['p50'], t['p99'], l['p50'], l['p99']))" "$OUT/frame_$tag.json" "[$tag]"
done
