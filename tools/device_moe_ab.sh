#!/bin/bash
# Run on the device from the repository root with the binary in .devcarry/mxtune:
#   run(command="bash tools/device_moe_ab.sh", carry=[".devcarry"])
# The decode MoE's loops A/B: the selftest, then `engine profile` with MXTUNE_MOE_LOOP=slots
# against grouped (each in its own process, same call) at the batches the scheduler uses,
# 120b and 20b; extra `MXTUNE_MOE_UNITS` variants of the grouped loop at batch 16.
export MXTUNE_KERNEL_CACHE=/tmp/kc
M=.devcarry/mxtune
echo "== selftest"; $M engine selftest --device cuda > $OUT/selftest.txt 2>&1
grep -E "FAIL|checks, " $OUT/selftest.txt | tail -8; grep -E "grouped|by expert" $OUT/selftest.txt | head -4
P="$M engine profile --synthetic"
row() { echo "== $*" | tee -a $OUT/ab.txt; $P "$@" 2>&1 | tee -a $OUT/ab.txt | grep -E "graphs on|^  moe" ; }
for b in 1 4 8 16; do
  for lp in slots grouped; do MXTUNE_MOE_LOOP=$lp row gpt-oss-120b --steps 32 --batch $b; done
done
for lp in slots grouped; do MXTUNE_MOE_LOOP=$lp row gpt-oss-20b --steps 32 --batch 16; done
for lp in slots grouped; do MXTUNE_MOE_LOOP=$lp row gpt-oss-20b --steps 32 --batch 4; done
for un in 8/8 16/8 8/4; do MXTUNE_MOE_UNITS=$un MXTUNE_MOE_LOOP=grouped row gpt-oss-120b --steps 32 --batch 16; done
