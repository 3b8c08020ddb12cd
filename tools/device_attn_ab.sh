#!/bin/bash
# Run on the device from the repository root with the binary in .devcarry/mxtune:
#   run(command="bash tools/device_attn_ab.sh", carry=[".devcarry"])
# The decode-attention A/B of docs/perf.md session 16: the selftest (which checks
# attn_split_gqa_tc beside the other split kernels), then MXTUNE_ATTN=gqa (CUDA cores) against
# gqa-tc (tensor cores) and auto in the same call, at depth 4096 and 32768 and at batch 4 and 16.
# Every row's whole output goes to $OUT/rows.txt.
export MXTUNE_KERNEL_CACHE=/tmp/kc
M=.devcarry/mxtune
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
echo "== selftest"; $M engine selftest --device cuda > $OUT/selftest.txt 2>&1
grep -E "FAIL|checks, " $OUT/selftest.txt | tail -5
echo "tensor-core attention checks: $(grep -c GqaTc $OUT/selftest.txt)"
P="$M engine profile --synthetic gpt-oss-120b --steps 32"
row() { echo "== MXTUNE_ATTN=$MXTUNE_ATTN $*" | tee -a $OUT/rows.txt; $P "$@" 2>&1 | tee -a $OUT/rows.txt | grep -E "graphs on|^  attention" ; }
for A in gqa gqa-tc auto; do
  export MXTUNE_ATTN=$A
  row --depth 4096 --max-model-len 8192
  row --depth 32768 --max-model-len 33000
  row --batch 4 --depth 4096 --max-model-len 8192
  row --batch 16 --depth 768 --max-model-len 4096
  row --batch 16 --depth 4096 --max-model-len 8192
done
