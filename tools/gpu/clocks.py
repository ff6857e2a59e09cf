"""Summarizes nvidia-smi samples (timestamp, SM clock MHz, memory clock MHz,
power W, temperature C, clock event reasons as a hex mask), as
tools/gpu/clocks.sh writes them: over the samples where power is above
half its maximum (the busy part of a run), the SM clock's and power's
median, minimum and maximum, and how often each clock event reason was
active."""
import statistics
import sys

REASONS = {
    0x1: "idle",
    0x2: "applications clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake slowdown",
    0x100: "display clock setting",
}


def main(path):
    rows = []
    for line in open(path):
        f = [x.strip() for x in line.split(",")]
        if len(f) < 6:
            continue
        try:
            rows.append((float(f[1]), float(f[2]), float(f[3]), float(f[4]), int(f[5], 16)))
        except ValueError:
            continue
    if not rows:
        print(f"{path}: no samples")
        return
    top = max(r[2] for r in rows)
    busy = [r for r in rows if r[2] > top / 2]
    sm = [r[0] for r in busy]
    pw = [r[2] for r in busy]
    print(f"{path}: {len(rows)} samples, {len(busy)} busy; SM clock MHz median {statistics.median(sm):.0f} "
          f"(min {min(sm):.0f}, max {max(sm):.0f}); memory clock {statistics.median(r[1] for r in busy):.0f}; "
          f"power W median {statistics.median(pw):.0f} (max {max(pw):.0f}); temperature max {max(r[3] for r in busy):.0f} C")
    for bit, name in REASONS.items():
        n = sum(1 for r in busy if r[4] & bit)
        if n:
            print(f"  {name}: {100 * n / len(busy):.0f}% of busy samples")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        main(p)
