#!/usr/bin/env bash
# A/B of bench flag sets on the GPU machine (after scripts/device_pack.sh): the CUDA LM tests once,
# then the stock frame bench with each set of extra flags. Usage: device_ab.sh "" "--no-mimi-pdl"
# ["--w8a16 --dep-q-exit 8" ...] (an empty string is the default configuration; the CUDA backend
# reads no environment switches). FRAMES (default 500) sets the bench length; TESTS=none skips the
# CUDA LM tests. KERNELS=SECTION[,SECTION] first runs personaplex-bench-kernels --only SECTION for
# each. Results and summary.txt in $OUT.
set -u
cd "$(dirname "$0")/.."
. scripts/device_common.sh
frames=${FRAMES:-500}
log() { echo "$@" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.sm --format=csv > "$OUT/gpu.txt" 2>&1
kernels=${KERNELS:-}
for k in ${kernels//,/ }; do
  timeout 120 $B/personaplex-bench-kernels --only "$k" --out "$OUT/kernels_$k.json" > "$OUT/kernels_$k.log" 2>&1
  log "kernels [$k] rc=$?"; cat "$OUT/kernels_$k.log" >> "$OUT/summary.txt"
done
if [ "${TESTS:-all}" != none ]; then
  timeout 300 $B/ppx_cuda_tests --gtest_filter='CudaLm*' > "$OUT/tests.log" 2>&1
  log "tests rc=$? $(grep -E 'PASSED|FAILED' "$OUT/tests.log" | tr '\n' ' ')"
  grep -E "rel L2|teacher-forced" "$OUT/tests.log" >> "$OUT/summary.txt"
fi
for v in "$@"; do
  tag=${v:-default}; tag=${tag//--/}; tag=${tag// /+}
  # $v unquoted: a set of flags splits into words.
  timeout 200 $B/personaplex-bench --device cuda --random-weights --frames "$frames" $v --out "$OUT/frame_$tag.json" > "$OUT/frame_$tag.log" 2>&1
  log "bench [$tag] rc=$?"
  python3 - "$OUT/frame_$tag.json" "[$tag]" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
j = json.load(open(sys.argv[1])); t = j['total_ms']; st = j['stages_ms']; l = st['lm_step']
line = '%s total p50 %.2f p99 %.2f max %.2f | enc p50 %.2f lm p50 %.2f p99 %.2f dec p50 %.2f | over %d' % (
    sys.argv[2], t['p50'], t['p99'], t['max'], st['mimi_encode']['p50'], l['p50'], l['p99'],
    st['mimi_decode']['p50'], j['frames_over_budget'])
d = st.get('lm_deferred_depformer_device')
if d: line += ' | deferred depformer (device) p50 %.2f p99 %.2f' % (d['p50'], d['p99'])
print(line)
PY
done
# The tool returns at most 8 files: keep the summary and one archive of everything.
(cd "$OUT" && tar -czf /tmp/results.tar.gz --exclude=summary.txt . && find . -type f ! -name summary.txt -delete && mv /tmp/results.tar.gz .)
