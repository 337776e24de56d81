"""One line per (record, link, workers): the simulator's error per policy, from run.sh's JSON lines.

    python docs/data/simval-fifteenth/summarize.py docs/data/simval-fifteenth/*.jsonl
"""

import json
import sys
from collections import defaultdict
from pathlib import Path

POLICIES = ("vanilla", "slicing", "endhost", "geryon")


def main(paths):
    print("| record | model | link | cc | workers | layout | " + " | ".join(POLICIES) + " | other variants |")
    print("|---" * (7 + len(POLICIES)) + "|")
    worst = []
    for path in paths:
        cells = defaultdict(dict)
        for line in Path(path).read_text().splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                key = (r["model"], r.get("link"), r.get("congestion"), r["workers"], r["layout"])
                cells[key][r["policy"]] = r["error"]
                worst.append((abs(r["error"]), r["error"], f"{Path(path).stem} {r['model']} {r.get('link')}",
                              r["policy"], r["workers"]))
        for (model, link, cc, workers, layout), errors in cells.items():
            main_cells = [f"{100 * errors[p]:+.1f}%" if p in errors else "–" for p in POLICIES]
            others = ", ".join(f"{p} {100 * e:+.1f}%" for p, e in errors.items() if p not in POLICIES)
            print(f"| {Path(path).stem} | {model} | {link} | {cc} | {workers} | {layout} | " + " | ".join(main_cells)
                  + f" | {others or '–'} |")
    worst.sort(reverse=True)
    print("\nlargest |error|: " + "; ".join(f"{e * 100:+.1f}% {rec} {pol} w{w}" for _, e, rec, pol, w in worst[:8]))


if __name__ == "__main__":
    main(sys.argv[1:])
