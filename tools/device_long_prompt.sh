#!/bin/bash
# Run on the device from the repository root with the binary in .devcarry/mxtune:
#   run(command="bash tools/device_long_prompt.sh", carry=[".devcarry"])
# #18's chunked-prefill check: the ITL of 8 decoding streams alone, then with a ~30k-token
# prompt arriving 4 s in (20b). Output in $OUT/bench.txt and $OUT/long.txt.
export MXTUNE_KERNEL_CACHE=/tmp/kc
M=.devcarry/mxtune
$M serve --synthetic gpt-oss-20b --device cuda --max-model-len 34000 --max-num-seqs 9 --port 8000 > $OUT/serve-long.log 2>&1 &
SP=$!
for i in $(seq 1 240); do curl -sf http://127.0.0.1:8000/v1/models >/dev/null && break; sleep 1; done
B="$M bench --url http://127.0.0.1:8000 --endpoint completions --no-cache --runs 1"
echo "== 8 streams alone"; $B --pp 128 --tg 2048 --concurrency 8 2>&1 | tee -a $OUT/bench.txt | grep -E "tg2048 +\| +8" | cut -c1-220
echo "== 8 streams with a long prompt 4 s in"
( sleep 4; python3 tools/device_long_prompt.py 30500 > $OUT/long.txt 2>&1 ) &
LP=$!
$B --pp 128 --tg 2048 --concurrency 8 2>&1 | tee -a $OUT/bench.txt | grep -E "tg2048 +\| +8" | cut -c1-220
# Wait for the long prompt only: a bare `wait` would also wait for the server, which never exits.
wait $LP; cat $OUT/long.txt
kill $SP; wait $SP 2>/dev/null
