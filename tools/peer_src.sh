#!/bin/bash
# Run here (not on the device, which has no internet): writes .devcarry/llama-src.tgz, the
# llama.cpp tree vendored by PyPI's llama-cpp-python sdist, without the parts llama-bench does
# not build (models, docs, media, benches, tests, examples, the web UI: 176 MB -> ~8 MB packed),
# and copies ../shared/peers/gen_gptoss_gguf.py beside it. tools/device_peer.sh uses both.
set -euo pipefail
VER=${1:-0.3.36}
cd "$(dirname "$0")/.."
mkdir -p .devcarry
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
URL=$(curl -sf --max-time 60 https://pypi.org/simple/llama-cpp-python/ \
  | grep -o "https://[^\"#]*llama_cpp_python-$VER.tar.gz" | head -1)
[ -n "$URL" ] || { echo "no sdist of llama-cpp-python $VER on PyPI's simple index" >&2; exit 1; }
curl -sf --max-time 600 -o "$T/src.tar.gz" "$URL"
tar xzf "$T/src.tar.gz" -C "$T"
L="$T/llama_cpp_python-$VER/vendor/llama.cpp"
rm -rf "$L"/{models,docs,media,benches,tests,examples,tools/ui}
tar czf .devcarry/llama-src.tgz -C "$(dirname "$L")" llama.cpp
cp ../shared/peers/gen_gptoss_gguf.py .devcarry/
ls -la .devcarry/llama-src.tgz .devcarry/gen_gptoss_gguf.py
