#!/usr/bin/env python3
"""Summarise an Nsight Compute source-page export of one kernel: where its warps stall.

Input: the CSV of `ncu -i REPORT.ncu-rep --page source --csv --print-source sass` (one
profiled kernel). Output: the kernel's stall reasons as shares of all samples, the opcode mix
(share of stall samples against share of executed instructions), the shared-memory wavefronts
against their ideal, and the instructions holding the most samples with their top reasons.

    python3 tools/ncu_stalls.py lm_src.csv [--top 12]
"""
import argparse
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def number(text):
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return 0.0


def opcode(source):
    """The SASS instruction's opcode without its predicate and modifiers."""
    words = [w for w in source.split() if not w.startswith("@")]
    return words[0].split(".")[0] if words else "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=12, help="instructions to list (default 12)")
    args = ap.parse_args()
    with open(args.csv, newline="") as f:
        rows = list(csv.reader(f))
    # The export starts with a "Kernel Name" line, then the header.
    start = next((i for i, r in enumerate(rows) if "Address" in r and "Source" in r), None)
    if start is None:
        sys.exit(f"{args.csv}: no header with Address and Source: not an ncu source-page CSV "
                 "(export with --page source --csv --print-source sass)")
    head, data = rows[start], [r for r in rows[start + 1:] if len(r) == len(rows[start])]
    col = {h: i for i, h in enumerate(head)}
    for need in (SAMPLES, EXECUTED):
        if need not in col:
            sys.exit(f"{args.csv}: no column '{need}': profile with --section SourceCounters")
    name = rows[0][1] if rows and len(rows[0]) > 1 else "?"
    get = lambda r, k: number(r[col[k]]) if k in col else 0.0
    total = sum(get(r, SAMPLES) for r in data)
    executed = sum(get(r, EXECUTED) for r in data)
    if total == 0:
        sys.exit(f"{args.csv}: no stall samples")
    reasons = [h for h in head if h.startswith("stall_") and "Not Issued" not in h]
    print(f"kernel {name}: {int(total)} samples, {int(executed)} warp instructions executed")
    by_reason = collections.Counter({h[6:]: sum(get(r, h) for r in data) for h in reasons})
    print("stall reasons (share of samples): " + ", ".join(
        f"{k} {v / total * 100:.1f} %" for k, v in by_reason.most_common(8) if v))
    samples, execs = collections.Counter(), collections.Counter()
    for r in data:
        op = opcode(r[col["Source"]])
        samples[op] += get(r, SAMPLES)
        execs[op] += get(r, EXECUTED)
    print("opcode      samples  executed")
    for op, v in samples.most_common(12):
        print(f"{op:10s} {v / total * 100:6.1f} % {execs[op] / max(executed, 1) * 100:6.1f} %")
    shared, ideal = "L1 Wavefronts Shared", "L1 Wavefronts Shared Ideal"
    if shared in col and ideal in col:
        w, i = sum(get(r, shared) for r in data), sum(get(r, ideal) for r in data)
        if i:
            print(f"shared-memory wavefronts {int(w)} against {int(i)} ideal ({w / i:.2f}x)")
    print(f"top {args.top} instructions by samples:")
    for r in sorted(data, key=lambda r: -get(r, SAMPLES))[: args.top]:
        top = sorted(((get(r, h), h[6:]) for h in reasons), reverse=True)[:3]
        why = ", ".join(f"{h} {int(v)}" for v, h in top if v)
        print(f"  {get(r, SAMPLES) / total * 100:5.1f} %  {r[col['Source']][:58]:58s} {why}")


if __name__ == "__main__":
    main()
