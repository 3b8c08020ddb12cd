#!/bin/bash
# Run on the device from the repository root, after tools/peer_src.sh here:
#   run(command="bash tools/device_peer.sh", carry=[".devcarry"])
# Builds llama-bench (CUDA, sm_90) from .devcarry/llama-src.tgz, writes a gpt-oss-20b-shaped
# GGUF (experts MXFP4, attention Q8_0) and measures llama.cpp and mxtune's 20b decode and
# prefill side by side in this one call, then their ratios (tools/peer_ratio.awk). Every output
# goes to $OUT (peer.txt, the build log).
set -u
export MXTUNE_KERNEL_CACHE=/tmp/kc
M=.devcarry/mxtune
source tools/device_gpu.sh  # GPU: the lent GPU's model, its rows file's name
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee $OUT/peer.txt
mkdir -p /tmp/peer && tar xzf .devcarry/llama-src.tgz -C /tmp/peer
( cmake -S /tmp/peer/llama.cpp -B /tmp/peer/b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  && cmake --build /tmp/peer/b -j 16 --target llama-bench ) > $OUT/peer-build.log 2>&1 \
  || { echo "llama.cpp build failed: see peer-build.log" | tee -a $OUT/peer.txt; tail -20 $OUT/peer-build.log; exit 1; }
PYTHONPATH=/tmp/peer/llama.cpp/gguf-py python3 .devcarry/gen_gptoss_gguf.py --preset 20b --out /tmp/peer/g20.gguf \
  > $OUT/peer-gguf.log 2>&1 || { echo "GGUF generation failed: see peer-gguf.log"; tail -20 $OUT/peer-gguf.log; exit 1; }
echo "== llama.cpp" | tee -a $OUT/peer.txt
/tmp/peer/b/bin/llama-bench -m /tmp/peer/g20.gguf -ngl 99 -fa 1 -p 2048 -n 128 -r 5 -o md 2>&1 | tee -a $OUT/peer.txt
echo "== mxtune" | tee -a $OUT/peer.txt
$M engine profile --synthetic gpt-oss-20b --steps 64 --batch 1 --json-out $OUT/$GPU.json 2>&1 | tee -a $OUT/peer.txt | grep -E "graphs on|bandwidth"
$M engine profile --synthetic gpt-oss-20b --steps 16 --prefill 2048 --json-out $OUT/$GPU.json 2>&1 | tee -a $OUT/peer.txt | grep -E "prefill of"
# The ratios, computed from the lines above (tools/peer_ratio.awk), so none is worked out by hand.
echo "== ratio" | tee -a $OUT/peer.txt
awk -f tools/peer_ratio.awk $OUT/peer.txt | tee -a $OUT/peer.txt
