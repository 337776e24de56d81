"""Traced geryon ring on the emulated cluster (100 Mbit/s, reno): per timed collective, its time, and
the ranks' first send_start after the common start (max / median). argv: ranks size iters outdir"""
import json
import os
import statistics
import sys
from geryon.emulate import EmulatedCluster
from geryon.bench.emulated import ring_placements, run_roles

ranks, size, iters, out = int(sys.argv[1]), int(float(sys.argv[2])), int(sys.argv[3]), sys.argv[4]
os.makedirs(out, exist_ok=True)
for f in os.listdir(out):
    os.remove(os.path.join(out, f))
with EmulatedCluster("tab12", hosts=ranks, bw="100mbit", tcp_congestion="reno") as cluster:
    hosts = [f"h{i + 1}" for i in range(ranks)]
    placements = ring_placements(cluster, hosts, ranks, "--sizes", size, "--iters", iters,
                                 "--policy", "geryon", "--congestion", "reno")
    placements = [(h, argv + ["--trace", f"{out}/rank{r}.jsonl"]) for r, (h, argv) in enumerate(placements)]
    records = run_roles(cluster, placements)
results = [[x for x in rec if x.get("event") == "result"][-1] for rec in records]
events = [[json.loads(line) for line in open(f"{out}/rank{r}.jsonl")] for r in range(ranks)]
for i, start in enumerate(results[0]["all_starts"]):
    firsts = [1e3 * (min(e["t"] for e in ev if e["kind"] == "send_start" and e["t"] >= start) - start)
              for ev in events]
    seconds = max(r["all_seconds"][i] for r in results)
    print(f"{ranks} x {size:.0e}: {seconds:.4f} s  first send max {max(firsts):5.2f} ms  "
          f"median {statistics.median(firsts):5.2f} ms")
