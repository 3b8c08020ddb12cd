#!/bin/bash
# Run on the device from the repository root with the binary in .devcarry/mxtune:
#   run(command="bash tools/device_attn_ab.sh", carry=[".devcarry"])
# The long-context attention A/B of docs/perf.md session 15: the selftest (which checks
# attn_split_gqa_pipe beside the other split kernels), then MXTUNE_ATTN=gqa against gqa-pipe
# in the same call at depth 4096 and 32768 (bf16 and fp8 caches) and at batch 16, depth 4096.
# Every row's whole output goes to $OUT/rows.txt; the rows also to $OUT/h100.json.
export MXTUNE_KERNEL_CACHE=/tmp/kc
M=.devcarry/mxtune
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
echo "== selftest"; $M engine selftest --device cuda > $OUT/selftest.txt 2>&1
grep -E "FAIL|checks, " $OUT/selftest.txt | tail -5
echo "pipe checks: $(grep -c GqaPipe $OUT/selftest.txt)"
P="$M engine profile --synthetic gpt-oss-120b --steps 32 --json-out $OUT/h100.json"
row() { echo "== MXTUNE_ATTN=$MXTUNE_ATTN $*" | tee -a $OUT/rows.txt; $P "$@" 2>&1 | tee -a $OUT/rows.txt | grep -E "graphs on|^  attn" ; }
for A in gqa gqa-pipe; do
  export MXTUNE_ATTN=$A
  row --depth 4096 --max-model-len 8192
  row --depth 32768 --max-model-len 33000
  row --depth 32768 --max-model-len 33000 --kv-dtype fp8
  row --batch 16 --depth 4096 --max-model-len 8192
done
export MXTUNE_ATTN=auto
row --kv-dtype fp8
row
