"""Summarises a kernel trace written by ktrace.c (tools/gpu/ktrace.sh): the
kernels of one device cut into steps (each starts at the embedding gather),
the steps of the most common kernel count among the last --last (default
40) kept, and for them, per kernel name: launches a step, the mean
duration (start to end on the GPU), and the mean exposed time, the part of
the step's wall time that the kernel alone accounts for: its end past the
latest end before it, so that time hidden under an earlier kernel's run
(programmatic dependent launches, graph replays) is not counted. Idle time
between kernels is its own line; exposed and idle times add up to the
step. With --layer, the kernels of one step's middle layer in order.
With --skew (a trace of several devices, whose CUPTI timestamps share one
clock): each device's steps against device 0's, paired in order: the
median offset of each step's start (its embedding gather) and end, how
long its first collective (the first kernel named peer_… or nccl…) ran,
which is where a device that started early waits, and the device's idle
time between its steps (the host's turn: the step's results read, the
next step's batch uploaded and its graph launched).

    python3 ktrace.py FILE.csv [--device N] [--last N] [--layer]
    python3 ktrace.py FILE.csv --skew N   (N devices)
"""
import sys
from collections import Counter, OrderedDict, defaultdict


def records(path, device):
    out = []
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                print(line.strip())
                continue
            parts = line.rstrip("\n").split(",", 4)
            if len(parts) != 5 or int(parts[0]) != device:
                continue
            out.append((int(parts[2]), int(parts[3]), parts[4]))
    out.sort()
    return out


def steps_of(recs):
    steps = []
    for r in recs:
        if r[2].startswith("embed") or not steps:
            steps.append([])
        steps[-1].append(r)
    return steps


def account(step):
    """Yields (name, start offset, duration, exposed, idle before) a kernel."""
    t0 = step[0][0]
    frontier = t0
    for start, end, name in step:
        idle = max(0, start - frontier)
        exposed = max(0, end - max(frontier, start))
        frontier = max(frontier, end)
        yield name, start - t0, end - start, exposed, idle


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


def skew(path, devices, last):
    """Prints each device's step starts and ends against device 0's."""
    per = [steps_of(records(path, d))[-last:] for d in range(devices)]
    n = min(len(p) for p in per)
    if n == 0:
        print("no steps")
        return
    print(f"{n} steps paired in order on {devices} devices (µs; offsets against device 0's step)")
    print("| device | start offset | end offset | first collective's run | its name | idle between steps |")
    print("|---|---|---|---|---|---|")
    for d, steps in enumerate(per):
        starts, ends, waits, names = [], [], [], set()
        gaps = [b[0][0] - a[-1][1] for a, b in zip(steps, steps[1:])]
        for a, b in zip(per[0][-n:], steps[-n:]):
            starts.append(b[0][0] - a[0][0])
            ends.append(b[-1][1] - a[-1][1])
            first = next((r for r in b if r[2].startswith(("peer_", "nccl", "ncclDevKernel"))), None)
            if first:
                waits.append(first[1] - first[0])
                names.add(first[2][:40])
        print(f"| {d} | {median(starts) / 1e3:.1f} | {median(ends) / 1e3:.1f} | {median(waits) / 1e3:.1f} | {', '.join(sorted(names))} "
              f"| {median(gaps) / 1e3:.1f} |")


def main():
    args = sys.argv[1:]
    path = args[0]
    opt = lambda k, d: int(args[args.index(k) + 1]) if k in args else d
    if "--skew" in args:
        skew(path, opt("--skew", 2), opt("--last", 40))
        return
    recs = records(path, opt("--device", 0))
    steps = steps_of(recs)[-opt("--last", 40):]
    if not steps:
        print("no kernels")
        return
    n = Counter(len(s) for s in steps).most_common(1)[0][0]
    kept = [s for s in steps if len(s) == n]
    walls = sorted(s[-1][1] - s[0][0] for s in kept)
    print(f"{len(kept)} steps of {n} kernels; wall median {walls[len(walls) // 2] / 1e3:.1f} µs "
          f"(min {walls[0] / 1e3:.1f}, max {walls[-1] / 1e3:.1f})")
    tot = OrderedDict()
    idle = 0
    for s in kept:
        for name, _, dur, exp, gap in account(s):
            t = tot.setdefault(name, [0, 0, 0])
            t[0] += 1
            t[1] += dur
            t[2] += exp
            idle += gap
    k = len(kept)
    wall = sum(walls) / k
    print(f"| kernel | a step | mean µs | exposed µs a step | share |")
    print("|---|---|---|---|---|")
    for name, (c, d, e) in sorted(tot.items(), key=lambda x: -x[1][2]):
        print(f"| {name[:60]} | {c / k:.0f} | {d / c / 1e3:.2f} | {e / k / 1e3:.1f} | {e / k / wall:.1%} |")
    print(f"| idle between kernels | | | {idle / k / 1e3:.1f} | {idle / k / wall:.1%} |")
    if "--layer" in args:
        s = kept[len(kept) // 2]
        per = max(1, (n - 8) // 32)
        mid = len(s) // 2
        print("\none step's kernels around its middle (name, start µs, duration, exposed, idle before):")
        for name, off, dur, exp, gap in list(account(s))[mid - per: mid + per + 2]:
            print(f"  {name[:60]:60s} {off / 1e3:9.2f} {dur / 1e3:7.2f} {exp / 1e3:7.2f} {gap / 1e3:6.2f}")


if __name__ == "__main__":
    main()
