# Sourced by the device scripts (tools/device_rows.sh, tools/device_peer.sh): GPU is the lent
# GPU's model in lower case (h100, h200, b200, gb10; "gpu" for any other), the name of its
# rows file under docs/perf/.
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h100|h200|b200|gb10' | head -1 | tr 'A-Z' 'a-z')
GPU=${GPU:-gpu}
