"""Prints the table of kiln bench model runs written as model-NAME.json under
a directory (tools/gpu/tp-bench.sh, tp-peer.sh): prefill, decode at batches
1/64/128/256/512, and the roofline fractions at batches 1 and 64 (of the group's
copy bandwidth under tensor parallelism).

    python3 tools/gpu/tp_table.py DIR NAME...
"""
import json
import os
import sys


def main():
    w, names = sys.argv[1], sys.argv[2:]
    print("| run | prefill 2048 tok/s | decode b1 | b64 | b128 | b256 | b512 | roofline b1 / b64 |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        try:
            r = json.load(open(os.path.join(w, f"model-{name}.json")))
        except Exception as e:
            print(f"| {name} | failed: {e} |")
            continue
        pp = [x for x in r["results"] if x.get("test", "").startswith("pp")]
        tg = {x["batch"]: x for x in r["results"] if x.get("test", "").startswith("tg")}
        cells = [f"{pp[0]['tokens_per_s']:.0f}" if pp else "-"]
        cells += [f"{tg[b]['tokens_per_s']:.1f}" if b in tg else "-" for b in (1, 64, 128, 256, 512)]
        roof = " / ".join(f"{tg[b].get('roofline_fraction', 0):.3f}" for b in (1, 64) if b in tg)
        print(f"| {name} | " + " | ".join(cells) + f" | {roof} |")


if __name__ == "__main__":
    main()
