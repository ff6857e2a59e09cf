#!/usr/bin/env python3
"""Prints, for each round of tools/gpu/fp8-bench.sh (files VARIANT-ROUND.json
under DIR, kiln bench model's reports), each variant's tokens/s in each test
and its ratio to bf16's in the same round (bf16-base's for a variant named
...-base when that ran), then the ratios' range over the rounds.

    python3 tools/gpu/ratio_table.py DIR
"""
import glob
import json
import os
import re
import sys


def load(d):
    runs = {}
    for f in sorted(glob.glob(os.path.join(d, "*-*.json"))):
        m = re.match(r"(.+)-(\d+)\.json$", os.path.basename(f))
        if not m:
            continue
        try:
            rep = json.load(open(f))
        except (OSError, ValueError):
            continue
        rates = {}
        for r in rep.get("results", []):
            rates["%s b%d" % (r["test"], r["batch"])] = r["tokens_per_s"]
        runs.setdefault(int(m.group(2)), {})[m.group(1)] = rates
    return runs


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    runs = load(sys.argv[1])
    spans = {}
    for rnd in sorted(runs):
        variants = runs[rnd]
        for v in sorted(variants):
            if v in ("bf16", "bf16-base"):
                ref = None
            else:
                ref = variants.get("bf16-base") if v.endswith("-base") and "bf16-base" in variants else variants.get("bf16")
            cells = []
            for test, rate in sorted(variants[v].items()):
                cell = "%s %.0f" % (test, rate)
                if ref and ref.get(test):
                    ratio = rate / ref[test]
                    cell += " (%.3f)" % ratio
                    spans.setdefault((v, test), []).append(ratio)
                cells.append(cell)
            print("round %d %-12s %s" % (rnd, v, ", ".join(cells)))
    for (v, test), rs in sorted(spans.items()):
        print("%-12s %-12s ÷ bf16: %.3f–%.3f over %d rounds" % (v, test, min(rs), max(rs), len(rs)))


if __name__ == "__main__":
    main()
