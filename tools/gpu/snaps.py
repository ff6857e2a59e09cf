"""Reads the counter snapshots tools/gpu/serve-bench.sh and serve-bounds.sh
append to WORK/snaps.txt: one line a snapshot, its name and then the kiln
serve metrics it read (empty ones as 0)."""
import os


def load(work):
    snaps = {}
    for line in open(os.path.join(work, "snaps.txt")):
        f = line.split()
        snaps[f[0]] = [float(x) if x else 0.0 for x in f[1:]]
    return snaps
