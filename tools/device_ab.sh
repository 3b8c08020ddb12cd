#!/bin/bash
# A/B of settings on the device, from the repository root with the binary in .devcarry/mxtune:
#   run(command="bash tools/device_ab.sh -n 2 -s 'X=0' \
#       -s 'MXTUNE_KERNEL_DEFINES=TCG_SQ_XPOSE=0' -w 'gpt-oss-120b --batch 8' -w 'gpt-oss-20b'",
#       carry=[".devcarry"])
# Each workload (-w: the arguments of `engine profile --synthetic` after it, `--steps 24` unless
# given) runs under each setting (-s: environment assignments, several separated by `|`, so a
# value may hold spaces: 'MXTUNE_KERNEL_DEFINES=A=1 B=2|MXTUNE_TCG_PLAIN=off'), each in its own
# process, the settings in turn, all of it -n times (default 2); one line per workload and
# round with the graph step's median ms under each setting, in -s order, each after the
# first with its change against the first. Whole outputs go to $OUT/ab-full.txt, the table to
# $OUT/ab.txt. Every setting's first process compiles the kernels for its defines (~30 s for
# a new MXTUNE_KERNEL_DEFINES); the cache stays in /tmp/kc for the call.
set -u
n=2
settings=()
workloads=()
while getopts "n:s:w:" opt; do
  case $opt in
    n) n=$OPTARG ;;
    s) settings+=("$OPTARG") ;;
    w) workloads+=("$OPTARG") ;;
    *) echo "usage: $0 [-n rounds] -s SETTING [-s SETTING …] -w WORKLOAD [-w WORKLOAD …]" >&2; exit 2 ;;
  esac
done
if [ ${#settings[@]} -lt 1 ] || [ ${#workloads[@]} -lt 1 ]; then
  echo "$0: give at least one -s setting and one -w workload" >&2
  exit 2
fi
export MXTUNE_KERNEL_CACHE=${MXTUNE_KERNEL_CACHE:-/tmp/kc}
M=${MXTUNE_BIN:-.devcarry/mxtune}
OUT=${OUT:-.}
# The graph step's median under one setting ("-" where the run printed none: see ab-full.txt).
median() {
  local setting=$1 workload=$2 kv
  IFS='|' read -ra kv <<< "$setting"
  local steps="--steps 24"
  case " $workload " in *" --steps "*) steps="" ;; esac
  local out
  # shellcheck disable=SC2086 # the workload is a list of arguments
  out=$(env "${kv[@]}" $M engine profile --synthetic $workload $steps 2>&1)
  printf '== [%s] %s\n%s\n' "$setting" "$workload" "$out" >> "$OUT/ab-full.txt"
  local m
  m=$(printf '%s\n' "$out" | grep 'graphs on' | sed -E 's/.*median ([0-9.]+) ms.*/\1/' | head -1)
  echo "${m:--}"
}
{
  echo "settings: $(printf '[%s] ' "${settings[@]}")"
  for ((r = 1; r <= n; r++)); do
    for w in "${workloads[@]}"; do
      line="round $r, $w:"
      first=""
      for s in "${settings[@]}"; do
        m=$(median "$s" "$w")
        line="$line $m"
        if [ -z "$first" ]; then
          first=$m
        elif [ "$first" != "-" ] && [ "$m" != "-" ]; then
          line="$line ($(awk -v a="$first" -v b="$m" 'BEGIN { printf "%+.1f %%", (b / a - 1) * 100 }'))"
        fi
      done
      echo "$line"
    done
  done
} | tee "$OUT/ab.txt"
