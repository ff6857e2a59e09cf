"""Summarises an Nsight Compute CSV of kiln steps (tools/gpu/profile.sh):
the kernels are cut into steps (each starts at the embedding gather), the
steps are grouped by kind (prefill when a prefill attention kernel ran,
else decode), and for the last step of each kind the time per kernel name
is printed with its share, largest first.

    python3 tools/gpu/ncu_steps.py FILE.csv
"""
import csv
import re
import sys
from collections import OrderedDict, defaultdict


def rows(path):
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") == "gpu__time_duration.sum":
            yield r["Kernel Name"], float(r["Metric Value"].replace(",", ""))


def short(name):
    name = re.sub(r"\(.*", "", name)
    if "gemm" in name.lower() or "sm90" in name or "cutlass" in name.lower() or "xmma" in name:
        return "cublasLt " + (name[:60])
    return name


def main():
    steps = []
    for name, ns in rows(sys.argv[1]):
        if name.startswith("embed") or not steps:
            steps.append([])
        steps[-1].append((short(name), ns))
    kinds = OrderedDict()
    for st in steps:
        kind = "prefill" if any(n.startswith("prefill") for n, _ in st) else "decode"
        kinds[kind] = st  # the last step of each kind
    for kind, st in kinds.items():
        total = sum(ns for _, ns in st)
        by = defaultdict(lambda: [0, 0.0])
        for n, ns in st:
            by[n][0] += 1
            by[n][1] += ns
        print(f"== {kind} step: {len(st)} kernels, {total/1e3:.1f} µs of kernel time "
              f"({sum(1 for s in steps if ('prefill' if any(n.startswith('prefill') for n, _ in s) else 'decode') == kind)} such steps)")
        for n, (c, ns) in sorted(by.items(), key=lambda kv: -kv[1][1]):
            print(f"{ns/1e3:10.1f} µs {100*ns/total:5.1f}%  {c:4d} × {ns/c/1e3:8.2f} µs  {n}")


if __name__ == "__main__":
    main()
