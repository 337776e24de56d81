"""When the ranks of an 8 x 10 MB collective wake from the common start, and when their first byte
leaves (twenty-second session). 100 Mbit/s, reno, one emulated cluster for the whole run.

Needs the bench roles with lead22-wake-first-byte.patch applied (each rank's wake after
`start_together`'s sleep, and the wire ring's first `sendall`). In a worktree of the code to
measure, with the patch applied, from the worktree's root:

    flock /tmp/gy-cpu.lock env PYTHONPATH=$PWD /work/main/.venv/bin/python \
        docs/data/linerate/lead22-wake-first-byte.py RANKS SIZE ITERS ROUNDS OUT_DIR SYSTEMS

SYSTEMS: a comma-separated list of geryon, gloo, wire (plain TCP's ring), run in turn ROUNDS times,
ITERS timed collectives per launch. Prints one JSON line per collective (system, seconds, every
rank's wake and first byte in ms after the common start; gloo's first byte is not seen: 0) and a
summary line on stderr. geryon's first byte is its first `send_start` (traced with --trace).
"""
import json
import os
import statistics
import sys

from geryon.bench.emulated import gloo_placements, ring_placements, run_roles, wire_ring_placements
from geryon.emulate import EmulatedCluster

ranks, size, iters, rounds, out = (int(sys.argv[1]), int(float(sys.argv[2])), int(sys.argv[3]),
                                   int(sys.argv[4]), sys.argv[5])
systems = sys.argv[6].split(",")
os.makedirs(out, exist_ok=True)
GLOO_ENV = {"GLOO_SOCKET_IFNAME": "eth0"}


def first(events, kind, start):
    return 1e3 * (min(e["t"] for e in events if e["kind"] == kind and e["t"] >= start) - start)


def placements(cluster, hosts, system):
    common = ("--sizes", size, "--iters", iters)
    if system == "geryon":
        ring = ring_placements(cluster, hosts, ranks, *common, "--policy", "geryon", "--congestion", "reno")
        return [(h, argv + ["--trace", f"{out}/rank{r}.jsonl"]) for r, (h, argv) in enumerate(ring)], None
    if system == "gloo":
        return gloo_placements(cluster, hosts, ranks, *common), GLOO_ENV
    return wire_ring_placements(cluster, hosts, ranks, *common), GLOO_ENV


with EmulatedCluster("wk" + str(os.getpid())[-4:], hosts=ranks, bw="100mbit", tcp_congestion="reno") as cluster:
    hosts = [f"h{i + 1}" for i in range(ranks)]
    for round_ in range(rounds):
        for system in systems:
            for name in os.listdir(out):
                os.remove(os.path.join(out, name))
            roles, env = placements(cluster, hosts, system)
            results = [[x for x in rec if x.get("event") == "result"][-1] for rec in run_roles(cluster, roles, env=env)]
            if system == "geryon":
                traces = [[json.loads(line) for line in open(f"{out}/rank{r}.jsonl")] for r in range(ranks)]
            for i, start in enumerate(results[0]["all_starts"]):
                woke = [1e3 * (r["woke"][i] - start) for r in results]
                if system == "geryon":
                    first_byte = [first(events, "send_start", start) for events in traces]
                elif system == "gloo":
                    first_byte = [0.0]
                else:    # the wire ring's warm-up stream wrote first
                    first_byte = [1e3 * (r["first"][i + 1] - start) for r in results]
                seconds = max(r["all_seconds"][i] for r in results)
                print(json.dumps({"round": round_, "system": system, "seconds": seconds, "woke": woke,
                                  "first": first_byte}), flush=True)
                print(f"{system:6s} {seconds:.4f} s  woke median {statistics.median(woke):5.2f} max "
                      f"{max(woke):5.2f}  first byte median {statistics.median(first_byte):5.2f} max "
                      f"{max(first_byte):5.2f} ms", file=sys.stderr, flush=True)
