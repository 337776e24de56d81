"""A bench ring with per-rank traces (tenth session): 8 ranks x 10 MB at 100 Mbit/s, reno, 3 timed collectives.

    flock /tmp/gy-cpu.lock .venv/bin/python docs/data/linerate/lead10-ring-trace.py RANKS SIZE OUT_DIR

Runs the `bench allreduce` ring roles (geryon only) on an emulated cluster, each rank with `--trace`,
and writes OUT_DIR/records.json and OUT_DIR/rankR.jsonl; read them with lead10-ring-tail.py.
"""
import json
import os
import shutil
import sys

from geryon.bench.emulated import ring_placements, run_roles
from geryon.emulate import EmulatedCluster

ranks, size, out = int(sys.argv[1]), int(float(sys.argv[2])), sys.argv[3]
shutil.rmtree(out, ignore_errors=True)
os.makedirs(out)
hosts = [f"h{i + 1}" for i in range(ranks)]
with EmulatedCluster("tr" + str(os.getpid())[-4:], hosts=ranks, bw="100mbit", tcp_congestion="reno") as cluster:
    placements = ring_placements(cluster, hosts, ranks, "--sizes", size, "--iters", 3, "--policy", "geryon",
                                 "--timeout", 120, "--congestion", "reno")
    placements = [(h, argv + ["--trace", f"{out}/rank{r}.jsonl"]) for r, (h, argv) in enumerate(placements)]
    records = run_roles(cluster, placements)
with open(f"{out}/records.json", "w") as handle:
    json.dump(records, handle)
