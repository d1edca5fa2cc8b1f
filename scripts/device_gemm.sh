#!/usr/bin/env bash
# Runs on the GPU machine after scripts/device_pack.sh with ppx_cuda_tests, personaplex-bench and
# personaplex-bench-kernels in the pack: the batched GEMM (lm_gemm.cu) measured and profiled. The
# CUDA suite, `personaplex-bench-kernels --only gemm` for every policy in GEMM_POLICIES, Nsight
# Compute on one int8 launch per shape in NCU_SHAPES, then the batched LM step (`--lm-batch`).
# Output in $OUT: summary.txt and results.tar.gz.
#
# Environment (defaults in brackets):
#   TESTS [1]                 0 skips the CUDA suite (GTEST_FILTER narrows it)
#   GEMM_POLICIES ["0"]       values of --gemm-policy for the gemm section ("" skips it)
#   GEMM_BATCHES ["16 32 64 128"]
#   TIME_BUDGET_S [500]       a step that would start past this many seconds is skipped
#   NCU_SHAPES ["temporal qkv;depformer qkv"]  ';'-separated; "" skips the profiles
#   NCU_B [64]                batch of the profiled launches; NCU_POLICIES ["0"] their --gemm-policy
#   NCU_KERNEL [gemm_kernel]  regex of the profiled kernel's name (wg_kernel: policies 4-6 from 40 rows);
#   NCU_SKIP [310]            launches of it skipped first (310 passes the bf16 GEMMs of gemm_kernel)
#   LM_RUNS ["fast:--fast"]   ';'-separated "NAME:FLAGS[:BIN]" --lm-batch runs (LM_BATCH ["16 64 128"]; PREFILL
#                             [0]: steps that fill the contexts first, 2999 for issue #14's full-context step)
#   MIMI_BLAS_ROWS [""]       values of personaplex-bench-mimi --mimi-blas-rows (4: as shipped, 0: v0.20's codec),
#                             each a --mimi-fp16 --batch MIMI_BATCHES ["8 16 32 64 128"] run; "" skips
#   NCU_MIMI ["" ]            "ROWS:BLAS_ROWS" (e.g. "64:0"): per-kernel GPU time of one batched encode and
#                             decode at ROWS rows (ncu summary by kernel name); "" skips
# (personaplex-bench-mimi must be in the pack for the last two.)
#   NCU_LM [""]               "ROWS:FLAGS" (e.g. "64:--fast --kv-fp8"): GPU time per kernel name over one
#                             --lm-batch ROWS step with empty contexts (ncu summary; the set-up's kernels
#                             are listed too, their names tell them apart); "" skips
#   NCU_LM_PREFILL [0]        with NCU_LM: fill every context with this many steps first (2999: full) and
#                             profile only the last timed step (--profile-steps 1, ncu --profile-from-start off)
#   NSYS_LM [""]              "ROWS:FLAGS": an Nsight Systems timeline (graph nodes traced) of NSYS_STEPS [5]
#                             --lm-batch ROWS steps after NSYS_PREFILL [2999] fill steps (--profile-steps, the
#                             capture range); scripts/nsys_steps.py reports per step the wall span of its
#                             kernels, their summed time and the GPU's idle gaps; "" skips (nsys needed)
#   NCU_ATTN [0]              1: Nsight Compute (full set) on one launch of the shipped fp8 attention
#                             kernel at 64 rows and 3000 keys (attention_fp8_mma_kernel); NCU_ATTN_SKIP ["96"]:
#                             launches of that kernel skipped first, one profile per value (96: policy 0's
#                             first launch, 192: policy 4's, 288: policy 5's); each also writes the SASS
#                             with counts (csv)
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/device_common.sh
t0=$(date +%s)
summary=$OUT/summary.txt
raw=$(mktemp -d /tmp/raw.XXXXXX)  # fresh per call: a warm machine keeps /tmp
mkdir -p "$raw"
: >"$summary"
note() { echo "$* ($(( $(date +%s) - t0 )) s)" | tee -a "$summary"; }
budget=${TIME_BUDGET_S:-500}
late() { [ $(( $(date +%s) - t0 )) -gt "$budget" ]; }
# The archive is written however the script ends (a step past the device tool's limit included).
trap 'tar -czf "$OUT/results.tar.gz" -C "$raw" . 2>/dev/null' EXIT
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >"$raw/gpu.txt" 2>&1
if [ "${TESTS:-1}" = 1 ]; then
  timeout 300 "$B/ppx_cuda_tests" ${GTEST_FILTER:+--gtest_filter="$GTEST_FILTER"} >"$raw/cuda_tests.log" 2>&1
  note "cuda tests rc=$?"
  grep -E "PASSED|FAILED|prefill vs|batched teacher" "$raw/cuda_tests.log" | head -20 >>"$summary"
fi
for p in ${GEMM_POLICIES-0}; do
  late && { note "kernels gemm policy $p skipped (time budget)"; continue; }
  # shellcheck disable=SC2086
  timeout 240 "$B/personaplex-bench-kernels" --only gemm --gemm-policy "$p" --gemm-batches ${GEMM_BATCHES:-16 32 64 128} \
    --out "$raw/kernels_gemm_p$p.json" >"$raw/kernels_gemm_p$p.log" 2>&1
  note "kernels gemm policy $p rc=$?"
  sed "s/^gemm /p$p /" "$raw/kernels_gemm_p$p.log" | grep -E "^p$p " >>"$summary"
done
IFS=';' read -r -a ncu_shapes <<<"${NCU_SHAPES-temporal qkv;depformer qkv}"
i=0
for pol in ${NCU_POLICIES-0}; do
for sh in "${ncu_shapes[@]}"; do
  [ -n "$sh" ] || continue
  i=$((i + 1))
  late && { note "ncu policy $pol '$sh' skipped (time budget)"; continue; }
  # The bf16 kernels run first (50 launches x 6 graph replays), then the int8 ones: skip past them.
  timeout 240 ncu --clock-control none --kernel-name "regex:${NCU_KERNEL:-gemm_kernel}" --launch-skip "${NCU_SKIP:-310}" --launch-count 1 \
    --set full -o "$raw/ncu_$i" "$B/personaplex-bench-kernels" --only gemm --gemm-policy "$pol" \
    --gemm-batches "${NCU_B:-64}" --gemm-shapes "$sh" >"$raw/ncu_$i.log" 2>&1
  note "ncu policy $pol '$sh' rc=$?"
  ncu --import "$raw/ncu_$i.ncu-rep" --page details >"$raw/ncu_$i.txt" 2>&1
  ncu --import "$raw/ncu_$i.ncu-rep" --page raw >"$raw/ncu_${i}_raw.txt" 2>&1  # every metric (stall reasons)
  grep -E "smsp__average_warps_issue_stalled_[a-z_]+_per_issue_active.ratio" "$raw/ncu_${i}_raw.txt" |
    sort -k3 -g -r | head -6 | sed "s/^/  [p$pol $sh stall] /" >>"$summary"
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Active Warps Per|Eligible Warps|Shared Memory.*Throughput|L1/TEX Hit|Bank Conflicts|Warp Cycles Per Issued" \
    "$raw/ncu_$i.txt" | head -30 | sed "s/^/  [p$pol $sh] /" >>"$summary"
done
done
for r in ${MIMI_BLAS_ROWS:-}; do
  late && { note "mimi blas rows $r skipped (time budget)"; continue; }
  # shellcheck disable=SC2086
  timeout 240 "$B/personaplex-bench-mimi" --device cuda --mimi-fp16 --mimi-blas-rows "$r" \
    --batch ${MIMI_BATCHES:-8 16 32 64 128} --frames 30 --warmup 5 --out "$raw/mimi_blas$r.json" >"$raw/mimi_blas$r.log" 2>&1
  note "mimi blas rows $r rc=$?"
  sed "s/^batch /blas$r batch /" "$raw/mimi_blas$r.log" | grep -E "^blas$r " >>"$summary"
done
for spec in ${NCU_MIMI:-}; do
  late && { note "ncu mimi $spec skipped (time budget)"; continue; }
  [[ $spec == *:* ]] || { note "NCU_MIMI '$spec': not ROWS:BLAS_ROWS, skipped"; continue; }
  rows=${spec%%:*} br=${spec#*:}
  # Frame 1's batched encode and decode (graph replays; ncu profiles each kernel node).
  timeout 240 ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
    "$B/personaplex-bench-mimi" --device cuda --mimi-fp16 --mimi-blas-rows "$br" --batch "$rows" --frames 1 \
    --warmup 0 >"$raw/ncu_mimi_${rows}_$br.txt" 2>&1
  note "ncu mimi rows $rows blas $br rc=$?"
  grep -E "^  [^ ]|gpu__time_duration.sum" "$raw/ncu_mimi_${rows}_$br.txt" | head -300 |
    sed "s/^/  [mimi $rows blas $br] /" >>"$summary"
done
if [ -n "${NCU_LM:-}" ] && ! late; then
  rows=${NCU_LM%%:*} lmflags=${NCU_LM#*:}
  if [ "${NCU_LM_PREFILL:-0}" -gt 0 ]; then
    lmrange=(--prefill "$NCU_LM_PREFILL" --frames 2 --warmup 1 --profile-steps 1) ncurange=(--profile-from-start off)
  else
    lmrange=(--frames 1 --warmup 0) ncurange=()
  fi
  # shellcheck disable=SC2086
  # ncu's report in its own file: the bench's JSON on stdout would interleave with the kernel names.
  timeout 300 ncu "${ncurange[@]}" --clock-control none --cache-control none --metrics gpu__time_duration.sum \
    --print-summary per-kernel --log-file "$raw/ncu_lm.txt" "$B/personaplex-bench" --device cuda --random-weights \
    $lmflags --lm-batch "$rows" "${lmrange[@]}" --out "$raw/ncu_lm.json" >"$raw/ncu_lm_app.log" 2>&1
  note "ncu lm step ($NCU_LM) rc=$?"
  python3 scripts/ncu_summary.py "$raw/ncu_lm.txt" | sed "s/^/  [lm step] /" >>"$summary"
fi
if [ -n "${NSYS_LM:-}" ] && ! late; then
  if command -v nsys >/dev/null 2>&1; then
    rows=${NSYS_LM%%:*} lmflags=${NSYS_LM#*:} nsteps=${NSYS_STEPS:-5}
    # shellcheck disable=SC2086
    timeout 300 nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop --cuda-graph-trace=node \
      --trace=cuda -o "$raw/nsys_lm" -f true "$B/personaplex-bench" --device cuda --random-weights $lmflags \
      --lm-batch "$rows" --prefill "${NSYS_PREFILL:-2999}" --frames "$nsteps" --warmup 2 --profile-steps "$nsteps" \
      --out "$raw/nsys_lm.json" >"$raw/nsys_lm.log" 2>&1
    note "nsys lm steps ($NSYS_LM) rc=$?"
    nsys stats --report cuda_gpu_trace --format csv --output "$raw/nsys_lm" "$raw/nsys_lm.nsys-rep" >"$raw/nsys_stats.log" 2>&1
    note "nsys stats rc=$?"
    python3 scripts/nsys_steps.py "$raw"/nsys_lm*cuda_gpu_trace*.csv "$raw/nsys_lm.json" 2>&1 | sed "s/^/  [nsys] /" >>"$summary"
  else
    note "nsys not found: NSYS_LM skipped"
  fi
fi
if [ "${NCU_ATTN:-0}" = 1 ]; then
  # Policies run in the order 2 (scalar), 3 (lean, 3 stages), 0 (shipped), 4 (v0.18's), 5 (lean, 4
  # stages), each 16 launches x (1 warm-up + 5 timed replays) of the fp8 cache: 96 skips policy 3's,
  # 192 policy 0's too, 288 policy 4's, 384 policy 5's; then policy 0's and 3's over the layout by
  # position (before v0.34): 480 skips policy 0's by position.
  for skip in ${NCU_ATTN_SKIP:-96}; do
    late && { note "ncu attention (skip $skip) skipped (time budget)"; continue; }
    timeout 240 ncu --clock-control none --kernel-name regex:attention_fp8_mma --launch-skip "$skip" --launch-count 1 \
      --set full -o "$raw/ncu_attn_$skip" "$B/personaplex-bench-kernels" --only attention-batch --attention-batches 64 \
      --attention-keys 3000 >"$raw/ncu_attn_$skip.log" 2>&1
    note "ncu attention (skip $skip) rc=$?"
    ncu --import "$raw/ncu_attn_$skip.ncu-rep" --page details >"$raw/ncu_attn_$skip.txt" 2>&1
    ncu --import "$raw/ncu_attn_$skip.ncu-rep" --page raw >"$raw/ncu_attn_${skip}_raw.txt" 2>&1
    # Per-instruction executed counts and stall samples (SASS), for placing the kernel's instructions.
    ncu --import "$raw/ncu_attn_$skip.ncu-rep" --page source --print-source sass --csv >"$raw/ncu_attn_${skip}_sass.csv" 2>&1
    grep -E "smsp__average_warps_issue_stalled_[a-z_]+_per_issue_active.ratio" "$raw/ncu_attn_${skip}_raw.txt" |
      sort -k3 -g -r | head -6 | sed "s/^/  [attn $skip stall] /" >>"$summary"
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Eligible Warps|L2 Hit|L1/TEX Hit|Bank Conflicts|Warp Cycles Per Issued|Block Limit|Waves Per SM" \
      "$raw/ncu_attn_$skip.txt" | head -34 | sed "s/^/  [attn $skip] /" >>"$summary"
  done
fi
frames=${FRAMES:-30}
warmup=5
lm_batch_runs "16 64 128"
grep -hE "batch|step" "$raw"/lm_batch_*.log 2>/dev/null | tail -24 >>"$summary"
