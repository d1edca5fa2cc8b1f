# session 45: the fp8 attention's parts at 64 rows (kernel sweep), then the LM step with the best against the plan's
set -u
mkdir -p /tmp/devrun; tar -xJf devpkg/devrun.tar.xz -C /tmp/devrun
export LD_LIBRARY_PATH=/tmp/devrun/lib; B=/tmp/devrun/bin
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $OUT/gpu.txt 2>&1; cat $OUT/gpu.txt
timeout 150 $B/personaplex-bench-kernels --only attention-batch --attention-batches 64 32 --attention-keys 3000 1000 \
  --attention-parts ${PARTS:-0 1 2 3 4 5 6 7 8 10 12 16 24 47} --out $OUT/attn_parts.json > $OUT/attn_parts.log 2>&1; echo "sweep rc=$?"
grep "B=64 keys=3000" $OUT/attn_parts.log
best=$(python3 -c "
import json;d=json.load(open('$OUT/attn_parts.json'))['temporal_attention_batch']
r=[x for x in d if x['B']==64 and x['keys']==3000 and x['policy']==0]
print(min(r,key=lambda x:x['fp8_us'])['parts'])")
echo "best parts $best"
lm() { timeout 100 $B/personaplex-bench --device cuda --random-weights --fast --kv-fp8 --lm-batch 64 --prefill 2999 --frames ${FR:-60} --warmup 5 $2 --out $OUT/lm_$1.json > $OUT/lm_$1.log 2>&1; echo "$1 rc=$?"
  python3 -c "import json,sys;d=json.load(open(sys.argv[1]));s=d['batches'][0]['step_ms'];print(sys.argv[1].split('/')[-1],s['p50'],s['p99'])" $OUT/lm_$1.json; }
lm plan_a ""
lm best_a "--attention-parts $best"
lm plan_b ""
lm best_b "--attention-parts $best"
