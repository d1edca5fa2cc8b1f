# session 45 call 2: the fp8 attention's stages aligned to 128-byte lines (new) against 97d08b7 (old)
set -u
OUT0=$OUT; OUT=/tmp/res_b; rm -rf $OUT; mkdir -p $OUT  # the tool returns few files: all go back as one archive
mkdir -p /tmp/devrun; [ -x /tmp/devrun/bin_gemm/personaplex-bench ] || tar -xJf devpkg/devrun.tar.xz -C /tmp/devrun
export LD_LIBRARY_PATH=/tmp/devrun/lib; B=/tmp/devrun/bin; O=/tmp/devrun/bin_old
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $OUT/gpu.txt 2>&1; cat $OUT/gpu.txt
timeout 120 $B/personaplex-bench-kernels --only attention-batch --attention-batches 64 16 --attention-keys 3000 300 --out $OUT/attn.json > $OUT/attn.log 2>&1; echo "attn rc=$?"; grep -E "policy [03] B" $OUT/attn.log
N=/usr/local/cuda/bin/ncu
timeout 120 $N --kernel-name regex:attention_fp8_mma_kernel --launch-skip 2 --launch-count 1 --set full --export $OUT/attn_new --force-overwrite $B/personaplex-bench-kernels --only attention-batch --attention-batches 64 --attention-keys 3000 --attention-parts 0 > $OUT/ncu.log 2>&1; echo "ncu rc=$?"
$N --import $OUT/attn_new.ncu-rep --page raw --csv > $OUT/attn_new_raw.csv 2>&1
python3 - <<'P'
import csv,os
rows=list(csv.reader(open(os.environ['OUT']+'/attn_new_raw.csv')));h,u,v=rows[0],rows[1],rows[2];d={k:(u[i],v[i]) for i,k in enumerate(h)}
for k in ['gpu__time_duration.sum','dram__bytes_read.sum','dram__throughput.avg.pct_of_peak_sustained_elapsed','lts__throughput.avg.pct_of_peak_sustained_elapsed','lts__t_sectors_srcunit_tex_op_read.sum','lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum','lts__t_requests_srcunit_tex_op_read.sum','smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldgsts.sum','sm__sass_l1tex_t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_bypass.sum','smsp__inst_executed.sum']: print(k,*d.get(k,('-','-')))
P
lm() { timeout 100 $1 --device cuda --random-weights --fast --kv-fp8 --lm-batch 64 --prefill 2999 --frames 60 --warmup 5 --out $OUT/lm_$2.json > $OUT/lm_$2.log 2>&1; echo "$2 rc=$?"
  python3 -c "import json,sys;d=json.load(open(sys.argv[1]));s=d['batches'][0]['step_ms'];print(sys.argv[1].split('/')[-1],s['p50'],s['p99'])" $OUT/lm_$2.json; }
lm $O/personaplex-bench old_a; lm $B/personaplex-bench new_a; lm $O/personaplex-bench old_b; lm $B/personaplex-bench new_b
export PPX_TEST_DATA_DIR=$PWD/tests/data PPX_TEST_CONFIG_DIR=$PWD/configs
timeout 150 $B/ppx_cuda_tests --gtest_filter="CudaLm*:CudaScheduler.*" > $OUT/cuda_tests.log 2>&1; echo "cuda tests rc=$?"
grep -E "PASSED|FAILED|tests ran" $OUT/cuda_tests.log | tail -4
tar -czf $OUT0/res_b.tgz --exclude="*.ncu-rep" -C /tmp res_b; ls -la $OUT0
