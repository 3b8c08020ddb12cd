#!/bin/bash
# Nsight Compute on one kernel of a synthetic decode step, on the device, from the repository
# root with the binary in .devcarry/mxtune:
#   run(command="bash tools/device_ncu.sh -k gemv_tc_fp4_t8_r128 -n lm \
#       -w 'gpt-oss-120b --mxfp4-layers moe,qkv,o,lm_head'", carry=[".devcarry"])
# -k: the kernel's name (a regular expression; its -s-th launch is profiled, default 3: after
# the warm-up's first steps), -n: a name for the files, -w: `engine profile --synthetic`'s
# arguments (`--steps 2` added). One eager launch under `ncu --clock-control none` (the GPU's
# own clocks; ncu replays the kernel once a section set, so a long kernel may run at a lower
# clock than in a graph step). Writes $OUT/NAME.ncu-rep, NAME.txt (every section's details),
# NAME_src.csv (the SASS source page) and prints the headline figures and
# tools/ncu_stalls.py's summary (where the warps stall, instruction by instruction).
set -u
skip=3
name=ncu
kernel=""
workload=""
while getopts "k:n:s:w:" opt; do
  case $opt in
    k) kernel=$OPTARG ;;
    n) name=$OPTARG ;;
    s) skip=$OPTARG ;;
    w) workload=$OPTARG ;;
    *) echo "usage: $0 -k KERNEL_REGEX -w WORKLOAD [-n NAME] [-s LAUNCHES_SKIPPED]" >&2; exit 2 ;;
  esac
done
if [ -z "$kernel" ] || [ -z "$workload" ]; then
  echo "$0: give the kernel (-k) and the workload (-w)" >&2
  exit 2
fi
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ -z "$NCU" ]; then
  echo "$0: no ncu on this machine (PATH or /usr/local/cuda*/bin)" >&2
  exit 1
fi
M=${MXTUNE_BIN:-.devcarry/mxtune}
OUT=${OUT:-.}
export MXTUNE_KERNEL_CACHE=${MXTUNE_KERNEL_CACHE:-/tmp/kc}
sections="--section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
--section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
--section ComputeWorkloadAnalysis --section SourceCounters"
# shellcheck disable=SC2086 # the sections and the workload are lists of arguments
"$NCU" --clock-control none -k "regex:$kernel" --launch-skip "$skip" -c 1 $sections -f -o "$OUT/$name" \
  "$M" engine profile --synthetic $workload --steps 2 > "$OUT/${name}_run.txt" 2>&1
rc=$?
if [ $rc -ne 0 ] || [ ! -f "$OUT/$name.ncu-rep" ]; then
  echo "$0: ncu exited $rc without a report; the last lines of its run:" >&2
  tail -20 "$OUT/${name}_run.txt" >&2
  exit 1
fi
"$NCU" -i "$OUT/$name.ncu-rep" --print-details all > "$OUT/$name.txt" 2>&1
"$NCU" -i "$OUT/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/${name}_src.csv" 2>&1
grep -E "^  [a-z_0-9]+ \(|Duration|DRAM Throughput|SM Frequency|Issued Warp Per Scheduler|Active Warps Per Scheduler|Eligible Warps|Registers Per Thread|Achieved Active Warps" "$OUT/$name.txt" | sort -u
python3 "$(dirname "$0")/ncu_stalls.py" "$OUT/${name}_src.csv"
