# Next H200 call (prepared in session 46): the shipped code of v0.38 (whole-line stages and rows) against
# issue #14's bars, the fixed attention's L2 counts, the whole CUDA suite, batch 1 (#13); most important
# first, the archive rewritten after each part. T: the seconds this call may use.
set -u
T=${T:-560}
OUT0=$OUT; OUT=/tmp/res47; rm -rf $OUT; mkdir -p $OUT
pack() { tar -czf $OUT0/res47.tgz --exclude="*.ncu-rep" -C /tmp res47; }
left() { [ $SECONDS -lt $1 ]; }
mkdir -p /tmp/devrun; [ -x /tmp/devrun/bin/personaplex-bench ] || tar -xJf devpkg/devrun.tar.xz -C /tmp/devrun
export LD_LIBRARY_PATH=/tmp/devrun/lib; B=/tmp/devrun/bin; N=/usr/local/cuda/bin/ncu
export PPX_TEST_DATA_DIR=$PWD/tests/data PPX_TEST_CONFIG_DIR=$PWD/configs
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $OUT/gpu.txt 2>&1; cat $OUT/gpu.txt
lm() { timeout $((T-SECONDS)) $B/personaplex-bench --device cuda --random-weights --fast $2 --lm-batch 64 --prefill 2999 --frames 100 --warmup 5 --out $OUT/lm_$1.json > $OUT/lm_$1.log 2>&1; echo "$1 rc=$? t=$SECONDS"
  python3 -c "import json,sys;d=json.load(open(sys.argv[1]));s=d['batches'][0]['step_ms'];print(sys.argv[1].split('/')[-1],s['p50'],s['p99'],s.get('p99_9'))" $OUT/lm_$1.json; pack; }
lm fp8_a --kv-fp8; lm fp8_b --kv-fp8
left $((T-90)) && { timeout 60 $N --kernel-name regex:attention_fp8_mma_kernel --launch-skip 2 --launch-count 1 --metrics lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum,smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldgsts.sum,gpu__time_duration.sum,dram__bytes_read.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed $B/personaplex-bench-kernels --only attention-batch --attention-batches 64 --attention-keys 3000 --attention-parts 0 > $OUT/ncu_attn.log 2>&1; echo "ncu rc=$? t=$SECONDS"; grep -E "lts__|smsp__|gpu__|dram__" $OUT/ncu_attn.log | head; pack; }
left $((T-40)) && timeout 40 $B/personaplex-bench-kernels --only attention-batch --attention-batches 64 32 16 --attention-keys 3000 300 --attention-parts 0 1 2 4 8 --out $OUT/attn.json > $OUT/attn.log 2>&1 && grep -E "policy 0 B" $OUT/attn.log | head -12
left $((T-100)) && lm bf16_a ""
left $((T-100)) && lm fp8_c --kv-fp8
left $((T-60)) && { timeout $((T-SECONDS)) $B/ppx_cuda_tests > $OUT/cuda_tests.log 2>&1; echo "cuda tests rc=$? t=$SECONDS"; grep -E "PASSED|FAILED|tests ran" $OUT/cuda_tests.log | tail -6; pack; }
left $((T-30)) && { timeout $((T-SECONDS)) $B/personaplex-bench --device cuda --random-weights --fast --frames 500 --out $OUT/frame_fast_500.json > $OUT/frame_fast_500.log 2>&1; echo "fast500 rc=$? t=$SECONDS"; }
pack; ls -la $OUT0; echo "t=$SECONDS done"
