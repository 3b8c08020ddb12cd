#!/bin/bash
# Run on the device from the repository root with the binary in .devcarry/mxtune:
#   run(command="bash tools/device_rows.sh", carry=[".devcarry"])  (writes $OUT/<gpu>.json)
# Rows of record: engine profile rows, then served rows; all appended to $OUT/<gpu>.json,
# <gpu> the lent GPU's model (h100, h200; docs/perf/ keeps one file per model).
export MXTUNE_KERNEL_CACHE=/tmp/kc
M=.devcarry/mxtune
source tools/device_gpu.sh  # GPU: the lent GPU's model, its rows file's name
echo "== rows for $GPU"
J="--json-out $OUT/$GPU.json"
echo "== selftest"; $M engine selftest --device cuda > $OUT/selftest.txt 2>&1; grep -E "FAIL|checks, " $OUT/selftest.txt | tail -5
P="$M engine profile --synthetic"
# Each row's whole output goes to $OUT/rows.txt (the call's printed tail is cut at 12 000
# characters); the summary lines, the served step and the per-kernel table are printed.
row() { echo "== $*" | tee -a $OUT/rows.txt; $P "$@" $J 2>&1 | tee -a $OUT/rows.txt | grep -E "graphs on|served step|prefill of|^  moe|^  rmsnorm|^  gemv|^  router|^  attn" ; }
row gpt-oss-120b --steps 32 --batch 1
row gpt-oss-120b --steps 32 --batch 4
row gpt-oss-120b --steps 32 --batch 8
row gpt-oss-120b --steps 32 --batch 16
row gpt-oss-120b --steps 32 --batch 1 --mxfp4-layers moe,qkv,o,lm_head
row gpt-oss-120b --steps 32 --batch 16 --mxfp4-layers moe,qkv,o,lm_head
row gpt-oss-20b --steps 32 --batch 1
row gpt-oss-20b --steps 32 --batch 16
row gpt-oss-120b --steps 32 --depth 4096 --max-model-len 8192
row gpt-oss-120b --steps 32 --depth 32768 --max-model-len 33000
# The fp8 cache halves the KV bytes a deep step reads (#17's depth rows).
row gpt-oss-120b --steps 32 --depth 4096 --max-model-len 8192 --kv-dtype fp8
row gpt-oss-120b --steps 32 --depth 32768 --max-model-len 33000 --kv-dtype fp8
row gpt-oss-120b --steps 32 --batch 4 --depth 4096 --max-model-len 8192
row gpt-oss-120b --steps 32 --batch 16 --depth 4096 --max-model-len 8192
row gpt-oss-120b --steps 32 --batch 16 --depth 768 --max-model-len 4096
row gpt-oss-120b --steps 16 --prefill 2048
row gpt-oss-20b --steps 16 --prefill 2048
row gpt-oss-20b --steps 16 --prefill 2048 --depth 16384 --max-model-len 18500
serve() {
  $M serve --synthetic $1 --device cuda --max-model-len 4096 --max-num-seqs 16 --port 8000 > $OUT/serve-$1.log 2>&1 &
  SP=$!
  for i in $(seq 1 240); do curl -sf http://127.0.0.1:8000/v1/models >/dev/null && break; sleep 1; done
}
B="$M bench --url http://127.0.0.1:8000 --endpoint completions --no-cache --runs 1 --json $J"
serve gpt-oss-120b
for c in 1 4 16; do echo "== served 120b pp512 tg512 c$c"; $B --pp 512 --tg 512 --concurrency $c 2>&1 | tail -3 | cut -c1-400; done
for c in 4 16; do echo "== served 120b pp2048 tg128 c$c"; $B --pp 2048 --tg 128 --concurrency $c 2>&1 | tail -3 | cut -c1-400; done
kill $SP; wait $SP 2>/dev/null
serve gpt-oss-20b
echo "== served 20b c16"; $B --pp 512 --tg 512 --concurrency 16 2>&1 | tail -3 | cut -c1-400
kill $SP; wait $SP 2>/dev/null
