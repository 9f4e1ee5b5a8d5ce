#!/usr/bin/env python3
"""Averages the phase-timer lines of a TPF_EXPERIMENT_PHASES build (common/phase_timer.cuh) that
`tpf bench` printed into FILE, per (role, key tile, warp), over every call of the kernel.
Usage: dev/scripts/phase_summary.py FILE [KEY_TILE [KEY_TILES]]   (the traced key tile to show, default 6;
the blocks print their linear index, whose key tile is index % KEY_TILES: default 12, N = 768)"""
import collections
import re
import sys

path = sys.argv[1]
want = int(sys.argv[2]) if len(sys.argv) > 2 else 6
key_tiles = int(sys.argv[3]) if len(sys.argv) > 3 else 12
acc = collections.defaultdict(list)
for line in open(path):
    m = re.match(r"phases (\S+) block (\d+) warp (\d+) cycles/step: (.*)", line)
    if not m or m.group(1) == "forward":
        continue
    acc[(m.group(1), int(m.group(2)) % key_tiles, int(m.group(3)))].append([int(x) for x in m.group(4).split()])
for (role, tile, warp), rows in sorted(acc.items()):
    if tile != want:
        continue
    means = [round(sum(r[i] for r in rows) / len(rows)) for i in range(len(rows[0]))]
    print(f"{role:10s} key tile {tile} warp {warp}: {len(rows)} calls, cycles/step per phase {means}")
