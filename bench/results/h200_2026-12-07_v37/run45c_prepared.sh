# session 45 call 3 (after run45b.sh on the same machine): the wgmma GEMM's weight rows at a 128-byte
# pitch (bin_gemm/: gemm-wg-row-align.patch and fp8-stage-align.patch) against bin/ (the attention fix only)
set -u
OUT0=$OUT; OUT=/tmp/res_c; rm -rf $OUT; mkdir -p $OUT  # the tool returns few files: all go back as one archive
mkdir -p /tmp/devrun; [ -x /tmp/devrun/bin_gemm/personaplex-bench ] || tar -xJf devpkg/devrun.tar.xz -C /tmp/devrun
export LD_LIBRARY_PATH=/tmp/devrun/lib; B=/tmp/devrun/bin; G=/tmp/devrun/bin_gemm; N=/usr/local/cuda/bin/ncu
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $OUT/gpu.txt 2>&1; cat $OUT/gpu.txt
export PPX_TEST_DATA_DIR=$PWD/tests/data PPX_TEST_CONFIG_DIR=$PWD/configs
for v in B G; do d=${!v}
  timeout 90 $d/personaplex-bench-kernels --only gemm --gemm-batches 64 128 --out $OUT/gemm_$v.json > $OUT/gemm_$v.log 2>&1; echo "gemm bench $v rc=$?"
  grep -E "temporal|depformer" $OUT/gemm_$v.log | awk '{print}' | head -24
  timeout 90 $N --kernel-name regex:wg_kernel --launch-skip 2 --launch-count 1 --set full --export $OUT/wg_$v --force-overwrite $d/personaplex-bench-kernels --only gemm --gemm-batches 64 --gemm-shapes "temporal ffn in" > $OUT/ncu_wg_$v.log 2>&1; echo "ncu wg $v rc=$?"
  $N --import $OUT/wg_$v.ncu-rep --page raw --csv > $OUT/wg_${v}_raw.csv 2>&1
  python3 - $OUT/wg_${v}_raw.csv <<'P'
import csv,sys
rows=list(csv.reader(open(sys.argv[1])));h,u,v=rows[0],rows[1],rows[2];d={k:(u[i],v[i]) for i,k in enumerate(h)}
for k in ['gpu__time_duration.sum','dram__bytes_read.sum','dram__throughput.avg.pct_of_peak_sustained_elapsed','lts__throughput.avg.pct_of_peak_sustained_elapsed','lts__t_sectors_srcunit_tex_op_read.sum','lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum','lts__t_requests_srcunit_tex_op_read.sum','smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldgsts.sum','sm__sass_l1tex_t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_bypass.sum','smsp__inst_executed_op_ldgsts.sum']: print(k,*d.get(k,('-','-')))
P
done
lm() { timeout 100 $1 --device cuda --random-weights --fast --kv-fp8 --lm-batch 64 --prefill 2999 --frames 60 --warmup 5 --out $OUT/lm_$2.json > $OUT/lm_$2.log 2>&1; echo "$2 rc=$?"
  python3 -c "import json,sys;d=json.load(open(sys.argv[1]));s=d['batches'][0]['step_ms'];print(sys.argv[1].split('/')[-1],s['p50'],s['p99'])" $OUT/lm_$2.json; }
lm $B/personaplex-bench attn_c; lm $G/personaplex-bench gemm_c; lm $G/personaplex-bench gemm_d
timeout 200 $G/ppx_cuda_tests --gtest_filter='CudaGemv8.*' > $OUT/cuda_gemv8_gemm.log 2>&1; echo "gemv8 tests (bin_gemm) rc=$?"
grep -E "PASSED|FAILED|tests ran" $OUT/cuda_gemv8_gemm.log | tail -4
tar -czf $OUT0/res_c.tgz --exclude="*.ncu-rep" -C /tmp res_c; ls -la $OUT0
