# session 42, H100: the TemporalKv change: whole CUDA suite, then: #14's 64-row --kv-fp8 step, #13's batch-1 --fast, then the bf16-KV step.
set -u
OUT0=$OUT; mkdir -p /tmp/devrun /tmp/logs; tar -xJf devpkg/devrun.tar.xz -C /tmp/devrun
export LD_LIBRARY_PATH=/tmp/devrun/lib; B=/tmp/devrun/bin
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $OUT0/gpu.txt 2>&1; cat $OUT0/gpu.txt
summ() { python3 -c "import json,sys;d=json.load(open(sys.argv[1]));print(sys.argv[1].split('/')[-1],json.dumps({k:v for k,v in d.items() if k in ('batches','total_ms','stages_ms')})[:700])" "$1"; }
lm() { timeout 150 $B/personaplex-bench --device cuda --random-weights $2 --lm-batch 64 --prefill 2999 --frames 50 --warmup 5 \
    --out $OUT0/lm_batch_$1.json > /tmp/logs/lm_batch_$1.log 2>&1; echo "lm_batch $1 rc=$?"; summ $OUT0/lm_batch_$1.json; }
export PPX_TEST_DATA_DIR=$PWD/tests/data PPX_TEST_CONFIG_DIR=$PWD/configs
timeout 200 $B/ppx_cuda_tests > /tmp/logs/cuda_tests.log 2>&1; echo "cuda tests rc=$?"
grep -E "PASSED|FAILED|vs cpu|prefill vs|fp8 KV|tests ran" /tmp/logs/cuda_tests.log | head -16
lm fp8 "--fast --kv-fp8"
timeout 60 $B/personaplex-bench --device cuda --random-weights --fast --frames 500 --out $OUT0/frame_fast.json > /tmp/logs/frame_fast.log 2>&1; echo "fast rc=$?"
summ $OUT0/frame_fast.json
tar -czf $OUT0/logs.tgz -C /tmp logs
