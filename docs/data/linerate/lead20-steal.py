"""Do a collective's slow moments come with steal time? (twentieth session)

    python docs/data/linerate/lead20-steal.py RUN.jsonl [RUN.jsonl ...]

For every `bench allreduce` row with `steal_all_seconds`: each single collective of geryon, gloo
and the wire ring, its excess over the fastest collective of the same system and row in all the runs
given, and the CPU seconds the hypervisor stole from this machine's two vCPUs while it ran (rank
0's /proc/stat). Prints the collectives with the most steal and the most excess, and the rank
correlation (Spearman) of steal and excess over all of them.
"""

import json
import sys

from scipy.stats import spearmanr

SYSTEMS = (("geryon", "all_seconds", "steal_all_seconds"),
           ("gloo", "gloo_all_seconds", "gloo_steal_all_seconds"),
           ("wire", "wire_ring_all_seconds", "wire_ring_steal_all_seconds"))


def collectives(paths):
    for path in paths:
        with open(path) as handle:
            for line in handle:
                row = json.loads(line)
                if row.get("bench") != "allreduce" or row.get("steal_all_seconds") is None:
                    continue
                name = f"{row['workers']} x {row['size_bytes'] / 1e6:g} MB"
                for system, times, steal in SYSTEMS:
                    for seconds, stolen in zip(row.get(times) or [], row.get(steal) or []):
                        yield {"run": path, "row": name, "system": system, "seconds": seconds,
                               "steal_ms": 1e3 * stolen, "steal_share": stolen / (2 * seconds)}


def main(paths) -> None:
    every = list(collectives(paths))
    if not every:
        sys.exit("no allreduce rows with steal_all_seconds in " + ", ".join(paths))
    fastest = {}
    for c in every:
        key = (c["row"], c["system"])
        fastest[key] = min(fastest.get(key, c["seconds"]), c["seconds"])
    for c in every:
        c["excess_ms"] = 1e3 * (c["seconds"] - fastest[c["row"], c["system"]])
    print(f"{len(every)} collectives in {len(paths)} runs")
    print("row           system  excess ms  steal ms  steal share of 2 vCPUs")
    for c in sorted(every, key=lambda c: -c["excess_ms"])[:12]:
        print(f"{c['row']:<13} {c['system']:<7} {c['excess_ms']:9.1f} {c['steal_ms']:9.1f}  {c['steal_share']:.4f}")
    rho, p = spearmanr([c["excess_ms"] for c in every], [c["steal_share"] for c in every])
    print(f"Spearman rank correlation of excess and steal share: {rho:.2f} (p = {p:.2g})")
    for row in sorted({c["row"] for c in every}):
        group = [c for c in every if c["row"] == row]
        rho, p = spearmanr([c["excess_ms"] for c in group], [c["steal_share"] for c in group])
        print(f"  {row:<13} {len(group):3d} collectives, steal {min(c['steal_ms'] for c in group):.0f}-"
              f"{max(c['steal_ms'] for c in group):.0f} ms, rho {rho:.2f} (p = {p:.2g})")


if __name__ == "__main__":
    main(sys.argv[1:])
