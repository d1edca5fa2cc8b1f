#!/usr/bin/env bash
# Profiles one persistent depformer step on the GPU machine (after scripts/device_pack.sh): the
# kernel bench's depformer section, then Nsight Compute on one launch of the persistent kernel
# (warp stalls, per-instruction sampling) and the kernel's SASS. Results in $OUT.
set -u
cd "$(dirname "$0")/.."
. scripts/device_common.sh
export PATH=$PATH:/usr/local/cuda/bin
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/nsight-compute*/ncu 2>/dev/null | head -1)
$B/personaplex-bench-kernels --only depformer > "$OUT/kernels.log" 2>&1
echo "kernel bench rc=$?"
grep -E "depformer step|sums" "$OUT/kernels.log"
if [ -n "$NCU" ]; then
  timeout 400 "$NCU" --kernel-name regex:depformer_kernel --launch-skip 20 --launch-count 1 --set full \
    --import-source no -o "$OUT/dep" $B/personaplex-bench-kernels --only depformer > "$OUT/ncu_run.log" 2>&1
  echo "ncu rc=$?"
  "$NCU" --import "$OUT/dep.ncu-rep" --page details > "$OUT/ncu_details.txt" 2>&1
  "$NCU" --import "$OUT/dep.ncu-rep" --page source --print-source sass --csv > "$OUT/ncu_sass.csv" 2>&1
  grep -E "Duration|Warp Cycles Per Issued|Stall|Issue Slot|Eligible|Active Warps|No Eligible|L1/TEX Hit|L2 Hit|Memory Throughput" "$OUT/ncu_details.txt" | head -40
else
  echo "no ncu on this machine"
fi
CUOBJ=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
"$CUOBJ" -sass $B/personaplex-bench-kernels 2>/dev/null | awk '/Function : .*depformer_kernelILi1E/{on=1} /Function : /{if(!/depformer_kernelILi1E/)on=0} on' > "$OUT/dep_sass.txt"
wc -l "$OUT/dep_sass.txt"
(cd "$OUT" && tar -czf /tmp/prof.tar.gz . && find . -type f -delete && mv /tmp/prof.tar.gz .)
