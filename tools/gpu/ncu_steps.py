"""Summarises an Nsight Compute CSV of kiln steps (tools/gpu/profile.sh):
the kernels are cut into steps (each starts at the embedding gather), the
steps are grouped by kind (prefill when a prefill attention kernel ran,
else decode), and for the last step of each kind the time per kernel name
is printed with its share, largest first; with --bytes (a profile that
also collected dram__bytes_read.sum and dram__bytes_write.sum) each kernel's
DRAM traffic and rate too.

    python3 tools/gpu/ncu_steps.py FILE.csv [--bytes]
"""
import csv
import re
import sys
from collections import OrderedDict, defaultdict


def rows(path):
    """Yields (kernel name, ns, DRAM bytes) a launch, in order."""
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    launches = OrderedDict()
    for r in csv.DictReader(lines):
        m = launches.setdefault(r["ID"], {"name": r["Kernel Name"]})
        m[r.get("Metric Name")] = float(r["Metric Value"].replace(",", ""))
    for m in launches.values():
        if "gpu__time_duration.sum" in m:
            dram = m.get("dram__bytes_read.sum", 0) + m.get("dram__bytes_write.sum", 0)
            yield m["name"], m["gpu__time_duration.sum"], dram


def short(name):
    name = re.sub(r"\(.*", "", name)
    if "gemm" in name.lower() or "sm90" in name or "cutlass" in name.lower() or "xmma" in name:
        return "cublasLt " + (name[:60])
    return name


def main():
    steps = []
    bytes_ = "--bytes" in sys.argv[2:]
    for name, ns, dram in rows(sys.argv[1]):
        if name.startswith("embed") or not steps:
            steps.append([])
        steps[-1].append((short(name), ns, dram))
    kinds = OrderedDict()
    for st in steps:
        kind = "prefill" if any(n.startswith("prefill") for n, _, _ in st) else "decode"
        kinds[kind] = st  # the last step of each kind
    for kind, st in kinds.items():
        total = sum(ns for _, ns, _ in st)
        by = defaultdict(lambda: [0, 0.0, 0.0])
        for n, ns, dram in st:
            by[n][0] += 1
            by[n][1] += ns
            by[n][2] += dram
        print(f"== {kind} step: {len(st)} kernels, {total/1e3:.1f} µs of kernel time "
              f"({sum(1 for s in steps if ('prefill' if any(n.startswith('prefill') for n, _, _ in s) else 'decode') == kind)} such steps)")
        for n, (c, ns, dram) in sorted(by.items(), key=lambda kv: -kv[1][1]):
            traffic = f"  {dram/c/1e6:8.1f} MB {dram/ns/1e3:6.2f} TB/s" if bytes_ else ""
            print(f"{ns/1e3:10.1f} µs {100*ns/total:5.1f}%  {c:4d} × {ns/c/1e3:8.2f} µs{traffic}  {n}")


if __name__ == "__main__":
    main()
