#!/usr/bin/env python3
"""Summarises an Nsight Compute source page (SASS, CSV) made by dev/scripts/device_ncu_source.sh:
the executed-instruction mix by opcode, stall reasons, and the hottest straight-line blocks
(runs of instructions with one execution count), to see where a kernel's issue slots and
stalls go. Usage: dev/scripts/ncu_source_summary.py KERNEL.csv [--blocks N]"""
import argparse
import collections
import csv


def load(path):
    rows = list(csv.reader(open(path, newline="")))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    hdr, data = rows[head], rows[head + 1:]
    col = {name: hdr.index(name) for name in ("Source", "Instructions Executed",
                                              "Warp Stall Sampling (All Samples)")}
    stalls = [(i, h[len("stall_"):]) for i, h in enumerate(hdr)
              if h.startswith("stall_") and "Not Issued" not in h]
    out = []
    for r in data:
        try:
            executed = int(r[col["Instructions Executed"]])
            samples = int(r[col["Warp Stall Sampling (All Samples)"]])
        except (ValueError, IndexError):
            continue
        src = r[col["Source"]].strip()
        toks = src.split()
        op = (toks[1] if toks and toks[0].startswith("@") else toks[0] if toks else "?").split(".")[0]
        why = {name: int(r[i]) for i, name in stalls if r[i] not in ("", "0")}
        out.append((src, op, executed, samples, why))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--blocks", type=int, default=15, help="hottest blocks to list")
    args = ap.parse_args()
    recs = load(args.csv)
    executed = sum(r[2] for r in recs) or 1
    samples = sum(r[3] for r in recs) or 1
    by_op, op_samples, by_stall = collections.Counter(), collections.Counter(), collections.Counter()
    for _, op, ex, sm, why in recs:
        by_op[op] += ex
        op_samples[op] += sm
        by_stall.update(why)
    print(f"{executed} instructions executed, {samples} stall samples")
    print("\nopcode       executed  share  samples")
    for op, n in by_op.most_common(20):
        print(f"{op:10s} {n:10d} {100 * n / executed:5.1f}% {100 * op_samples[op] / samples:6.1f}%")
    total = sum(by_stall.values()) or 1
    print("\nstall reason        share")
    for why, n in by_stall.most_common(10):
        print(f"{why:18s} {100 * n / total:5.1f}%")
    blocks, cur = [], None
    for i, (_, _, ex, sm, _) in enumerate(recs):
        if cur and cur["ex"] == ex:
            cur["n"] += 1
            cur["sm"] += sm
        else:
            cur = {"first": i, "n": 1, "ex": ex, "sm": sm}
            blocks.append(cur)
    print("\nblock (source lines)   instrs  executions  instr share  sample share")
    for b in sorted(blocks, key=lambda b: -b["ex"] * b["n"])[:args.blocks]:
        print(f"{b['first']:6d}-{b['first'] + b['n'] - 1:<6d} {b['n']:12d} {b['ex']:11d} "
              f"{100 * b['ex'] * b['n'] / executed:10.1f}% {100 * b['sm'] / samples:12.1f}%")


if __name__ == "__main__":
    main()
