#!/usr/bin/env python3
"""Summarizes Nsight Compute's source page of one kernel (the CSV that
`SOURCE=1 tools/gpu/wg-ncu.sh` writes: ncu -i REPORT --page source --csv
--print-source sass): the warps' stall samples by reason, the instructions
that hold the most samples, and the samples by region of the code (a region
starts at each barrier, wgmma wait, wgmma issue, copy, shuffle, MUFU or
pack run), each with its share of all samples. Runs here (no GPU needed):

    python3 tools/gpu/ncu_stalls.py ncu-wg128-sass.csv [--top N] [--regions]
"""
import argparse
import collections
import csv
import re


def load(path):
    rows = list(csv.reader(open(path)))
    # Row 0 names the kernel, row 1 the columns.
    hdr = rows[1]
    ix = {h: i for i, h in enumerate(hdr)}
    data = [r for r in rows[2:] if len(r) >= len(hdr)]

    def num(r, col):
        v = r[ix[col]] if col in ix else ''
        return int(v) if v not in ('', '-') else 0

    stalls = [h for h in hdr if h.startswith('stall_') and '(Not Issued)' not in h]
    insts = []
    for r in data:
        insts.append({
            'src': r[ix['Source']].strip(),
            'executed': num(r, 'Instructions Executed'),
            'samples': num(r, 'Warp Stall Sampling (All Samples)'),
            'stalls': {c: num(r, c) for c in stalls if num(r, c)},
        })
    return rows[0][1] if len(rows[0]) > 1 else '?', insts


MARK = re.compile(r'(DEPBAR|BAR\.|WARPGROUP\.ARRIVE|SYNCS|MUFU\.EX2|F2FP|SHFL|LDGSTS|HGMMA|UTMALDG)')


def regions(insts):
    out, name, samples, count, prev = [], 'start', 0, 0, None
    for i in insts:
        m = MARK.search(i['src'])
        kind = m.group(1) if m else None
        if kind in ('DEPBAR', 'BAR.', 'WARPGROUP.ARRIVE', 'SYNCS') or (kind and kind != prev):
            out.append((name, count, samples))
            name, samples, count = '%s (executed %d)' % (i['src'][:50], i['executed']), 0, 0
        if kind:
            prev = kind
        samples += i['samples']
        count += 1
    out.append((name, count, samples))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('csv')
    ap.add_argument('--top', type=int, default=20)
    ap.add_argument('--regions', action='store_true')
    a = ap.parse_args()
    kernel, insts = load(a.csv)
    total = sum(i['samples'] for i in insts) or 1
    print('%s: %d stall samples, %d instructions executed' % (kernel, total, sum(i['executed'] for i in insts)))
    reasons = collections.Counter()
    for i in insts:
        reasons.update(i['stalls'])
    for c, v in reasons.most_common():
        print('  %-26s %6.1f%%' % (c, 100 * v / total))
    print('instructions with the most samples:')
    for i in sorted(insts, key=lambda i: -i['samples'])[:a.top]:
        top = ', '.join('%s %d' % kv for kv in sorted(i['stalls'].items(), key=lambda kv: -kv[1])[:3])
        print('  %5.1f%% %9d  %-58s %s' % (100 * i['samples'] / total, i['executed'], i['src'][:58], top))
    if a.regions:
        print('regions (share of samples, instructions, first instruction):')
        for name, n, s in regions(insts):
            if s > total * 0.004:
                print('  %5.1f%% %5d  %s' % (100 * s / total, n, name))


if __name__ == '__main__':
    main()
