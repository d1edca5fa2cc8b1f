# session 46, short call (little device time left): the attention kernel old/new, the CUDA tests on both
# patches, then the 64-row step old/both; the archive rewritten after each part.
set -u
T=${T:-300}
OUT0=$OUT; OUT=/tmp/res46; rm -rf $OUT; mkdir -p $OUT
pack() { tar -czf $OUT0/res46.tgz --exclude="*.ncu-rep" -C /tmp res46; }
left() { [ $SECONDS -lt $1 ]; }
mkdir -p /tmp/devrun; [ -x /tmp/devrun/bin_gemm/personaplex-bench ] || tar -xJf devpkg/devrun.tar.xz -C /tmp/devrun
export LD_LIBRARY_PATH=/tmp/devrun/lib; B=/tmp/devrun/bin; O=/tmp/devrun/bin_old; G=/tmp/devrun/bin_gemm
export PPX_TEST_DATA_DIR=$PWD/tests/data PPX_TEST_CONFIG_DIR=$PWD/configs
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $OUT/gpu.txt 2>&1; cat $OUT/gpu.txt
for v in O B; do d=${!v}
  timeout 40 $d/personaplex-bench-kernels --only attention-batch --attention-batches 64 16 --attention-keys 3000 300 --out $OUT/attn_$v.json > $OUT/attn_$v.log 2>&1; echo "attn $v rc=$? t=$SECONDS"
  grep -E "policy 0 B" $OUT/attn_$v.log
done
pack
timeout 150 $G/ppx_cuda_tests --gtest_filter='CudaLm*:CudaScheduler.*:CudaGemv8.*' > $OUT/cuda_tests_both.log 2>&1; echo "cuda tests (bin_gemm) rc=$? t=$SECONDS"; grep -E "PASSED|FAILED|tests ran" $OUT/cuda_tests_both.log | tail -6
pack
lm() { timeout $((T-SECONDS)) $1 --device cuda --random-weights --fast --kv-fp8 --lm-batch 64 --prefill 2999 --frames 60 --warmup 5 --out $OUT/lm_$2.json > $OUT/lm_$2.log 2>&1; echo "$2 rc=$? t=$SECONDS"
  python3 -c "import json,sys;d=json.load(open(sys.argv[1]));s=d['batches'][0]['step_ms'];print(sys.argv[1].split('/')[-1],s['p50'],s['p99'])" $OUT/lm_$2.json; pack; }
left $((T-40)) && lm $O/personaplex-bench old_a; left $((T-40)) && lm $G/personaplex-bench both_a
left $((T-40)) && lm $O/personaplex-bench old_b; left $((T-40)) && lm $G/personaplex-bench both_b
pack; ls -la $OUT0; echo "t=$SECONDS done"
