# Next H200 call (prepared in session 46): the shipped code of v0.38 (whole-line stages and rows) against
# issue #14's bars, the fixed attention's L2 counts, the whole CUDA suite, batch 1 (#13); most important
# first, the archive ($OUT/res47.tgz) rewritten after each part. TIME_BUDGET_S: no part starts past it.
set -u
. scripts/device_common.sh  # B, the library path, the test binaries' data paths
t0=$(date +%s)
budget=${TIME_BUDGET_S:-500}
frames=100 warmup=5 PREFILL=2999 LM_BATCH=64
raw=/tmp/res47; rm -rf "$raw"; mkdir -p "$raw"
summary=$raw/summary.txt
note() { echo "$* ($(( $(date +%s) - t0 )) s)" | tee -a "$summary"; }
late() { [ $(( $(date +%s) - t0 )) -gt "$budget" ]; }
pack() { tar -czf "$OUT/res47.tgz" --exclude="*.ncu-rep" -C /tmp res47; }
steps() {  # the step figures of the --lm-batch runs so far
  python3 - "$raw" <<'PY' | tee -a "$summary"
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/lm_batch_*.json")):
    s = json.load(open(f))["batches"][0]["step_ms"]
    print(f.split("/")[-1], s["p50"], s["p99"], s["p99_9"])
PY
}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >"$raw/gpu.txt" 2>&1; cat "$raw/gpu.txt"
LM_RUNS="fp8_a:--fast --kv-fp8;fp8_b:--fast --kv-fp8" lm_batch_runs 64; steps; pack
late || { timeout 60 /usr/local/cuda/bin/ncu --kernel-name regex:attention_fp8_mma_kernel --launch-skip 2 --launch-count 1 \
  --metrics lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum,smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldgsts.sum,gpu__time_duration.sum,dram__bytes_read.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed \
  "$B/personaplex-bench-kernels" --only attention-batch --attention-batches 64 --attention-keys 3000 --attention-parts 0 >"$raw/ncu_attn.log" 2>&1
  note "ncu rc=$?"; grep -E "lts__|smsp__|gpu__|dram__" "$raw/ncu_attn.log" | tee -a "$summary"; pack; }
late || { timeout 40 "$B/personaplex-bench-kernels" --only attention-batch --attention-batches 64 32 16 --attention-keys 3000 300 \
  --attention-parts 0 1 2 4 8 --out "$raw/attn.json" >"$raw/attn.log" 2>&1; note "attention sweep rc=$?"; }
LM_RUNS="bf16_a:--fast;fp8_c:--fast --kv-fp8" lm_batch_runs 64; steps; pack
late || { timeout 240 "$B/ppx_cuda_tests" >"$raw/cuda_tests.log" 2>&1; note "cuda tests rc=$?"
  grep -E "PASSED|FAILED|tests ran" "$raw/cuda_tests.log" | tee -a "$summary"; pack; }
late || { timeout 120 "$B/personaplex-bench" --device cuda --random-weights --fast --frames 500 --out "$raw/frame_fast_500.json" \
  >"$raw/frame_fast_500.log" 2>&1; note "fast 500 rc=$?"; }
pack; note done
