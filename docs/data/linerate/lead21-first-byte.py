"""Where a traced geryon ring's first byte waits (twenty-first session): per timed collective and rank,
the first slice's `queued` (the calling thread handed it to the flow) and `send_start` (the flow's
writer took it) after the common start, 100 Mbit/s, reno.

    flock /tmp/gy-cpu.lock .venv/bin/python docs/data/linerate/lead21-first-byte.py RANKS SIZE ITERS OUT_DIR

Runs the `bench allreduce` ring roles (geryon only), each rank with `--trace`; prints per collective the
time, the ranks' first queued and first send_start (max / median, ms) and the hand-off between them.
"""
import json
import os
import statistics
import sys

from geryon.bench.emulated import ring_placements, run_roles
from geryon.emulate import EmulatedCluster

ranks, size, iters, out = int(sys.argv[1]), int(float(sys.argv[2])), int(sys.argv[3]), sys.argv[4]
os.makedirs(out, exist_ok=True)
for name in os.listdir(out):
    os.remove(os.path.join(out, name))
with EmulatedCluster("fb" + str(os.getpid())[-4:], hosts=ranks, bw="100mbit", tcp_congestion="reno") as cluster:
    hosts = [f"h{i + 1}" for i in range(ranks)]
    placements = ring_placements(cluster, hosts, ranks, "--sizes", size, "--iters", iters,
                                 "--policy", "geryon", "--congestion", "reno")
    placements = [(h, argv + ["--trace", f"{out}/rank{r}.jsonl"]) for r, (h, argv) in enumerate(placements)]
    records = run_roles(cluster, placements)
results = [[x for x in rec if x.get("event") == "result"][-1] for rec in records]
events = [[json.loads(line) for line in open(f"{out}/rank{r}.jsonl")] for r in range(ranks)]


def first(ev, kind, start):
    return 1e3 * (min(e["t"] for e in ev if e["kind"] == kind and e["t"] >= start) - start)


every = {"queued": [], "send_start": [], "hand_off": []}
for i, start in enumerate(results[0]["all_starts"]):
    queued = [first(ev, "queued", start) for ev in events]
    began = [first(ev, "send_start", start) for ev in events]
    hand = [b - q for q, b in zip(queued, began)]
    for pooled, values in zip(every.values(), (queued, began, hand)):
        pooled.extend(values)
    seconds = max(r["all_seconds"][i] for r in results)
    print(f"{ranks} x {size:.0e}: {seconds:.4f} s  first queued max {max(queued):5.2f} median "
          f"{statistics.median(queued):5.2f}  first send_start max {max(began):5.2f} median "
          f"{statistics.median(began):5.2f}  hand-off median {statistics.median(hand):5.2f} ms")
print("over every rank and collective (ms): " + "  ".join(
    f"{name} median {statistics.median(v):.2f} max {max(v):.2f}" for name, v in every.items()))
