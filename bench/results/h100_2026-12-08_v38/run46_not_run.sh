# session 46, one call: both pending patches (bin_gemm/: attention stages + GEMM rows aligned to 128-byte
# lines), the attention fix alone (bin/) and the shipped kernels of 97d08b7 (bin_old/); most important first,
# the archive rewritten after each part so that a cut call still brings back what ran.
set -u
T=${T:-560}  # seconds this call may use (the device budget may be less than the call limit)
OUT0=$OUT; OUT=/tmp/res46; rm -rf $OUT; mkdir -p $OUT
pack() { tar -czf $OUT0/res46.tgz --exclude="*.ncu-rep" -C /tmp res46; }
left() { [ $SECONDS -lt $1 ]; }
mkdir -p /tmp/devrun; [ -x /tmp/devrun/bin_gemm/personaplex-bench ] || tar -xJf devpkg/devrun.tar.xz -C /tmp/devrun
export LD_LIBRARY_PATH=/tmp/devrun/lib; B=/tmp/devrun/bin; O=/tmp/devrun/bin_old; G=/tmp/devrun/bin_gemm
N=/usr/local/cuda/bin/ncu
export PPX_TEST_DATA_DIR=$PWD/tests/data PPX_TEST_CONFIG_DIR=$PWD/configs
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $OUT/gpu.txt 2>&1; cat $OUT/gpu.txt
echo "t=$SECONDS extracted"
for v in O B; do d=${!v}
  timeout 60 $d/personaplex-bench-kernels --only attention-batch --attention-batches 64 16 --attention-keys 3000 300 --out $OUT/attn_$v.json > $OUT/attn_$v.log 2>&1; echo "attn $v rc=$?"
  grep -E "policy 0 B" $OUT/attn_$v.log
done
pack; echo "t=$SECONDS"
lm() { timeout 100 $1 --device cuda --random-weights --fast --kv-fp8 --lm-batch 64 --prefill 2999 --frames 60 --warmup 5 --out $OUT/lm_$2.json > $OUT/lm_$2.log 2>&1; echo "$2 rc=$? t=$SECONDS"
  python3 -c "import json,sys;d=json.load(open(sys.argv[1]));s=d['batches'][0]['step_ms'];print(sys.argv[1].split('/')[-1],s['p50'],s['p99'])" $OUT/lm_$2.json; }
lm $O/personaplex-bench old_a; lm $G/personaplex-bench both_a; lm $B/personaplex-bench attn_a
pack
left $((T-260)) && { lm $O/personaplex-bench old_b; lm $G/personaplex-bench both_b; }
pack
left $((T-120)) && { timeout $((T-SECONDS)) $G/ppx_cuda_tests --gtest_filter='-CudaMimiFullSize.*' > $OUT/cuda_tests_both.log 2>&1; echo "cuda tests (bin_gemm) rc=$? t=$SECONDS"; grep -E "PASSED|FAILED|tests ran" $OUT/cuda_tests_both.log | tail -6; }
pack
left $((T-60)) && { timeout 50 $N --kernel-name regex:attention_fp8_mma_kernel --launch-skip 2 --launch-count 1 --metrics lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum,smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldgsts.sum,gpu__time_duration.sum,dram__bytes_read.sum $B/personaplex-bench-kernels --only attention-batch --attention-batches 64 --attention-keys 3000 --attention-parts 0 > $OUT/ncu_attn_new.log 2>&1; echo "ncu rc=$? t=$SECONDS"; grep -E "sectors|requests|wavefronts|duration|bytes_read" $OUT/ncu_attn_new.log | head; }
left $((T-30)) && for v in B G; do d=${!v}; timeout 20 $d/personaplex-bench-kernels --only gemm --gemm-batches 64 --out $OUT/gemm_$v.json > $OUT/gemm_$v.log 2>&1; echo "gemm $v rc=$? t=$SECONDS"; done
pack; ls -la $OUT0; echo "t=$SECONDS done"
