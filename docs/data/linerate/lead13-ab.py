"""geryon's ring alone on the emulated cluster (100 Mbit/s, reno, no trace), for A/B runs of its
settings (thirteenth session). Prints one JSON line: per timed collective, the slowest rank's seconds.

    flock /tmp/gy-cpu.lock python lead13-ab.py RANKS SIZE ITERS LABEL [role flags...]

e.g. `lead13-ab.py 8 1e8 5 piece1m --slice-bytes 1048576 --max-slice-bytes 1048576`.
"""
import json
import os
import sys

from geryon.bench.emulated import ring_placements, run_roles
from geryon.bench.transport import _iteration_seconds, _median
from geryon.emulate import EmulatedCluster

ranks, size, iters = int(sys.argv[1]), int(float(sys.argv[2])), int(sys.argv[3])
label, extra = sys.argv[4], sys.argv[5:]
with EmulatedCluster("ab" + str(os.getpid())[-4:], hosts=ranks, bw="100mbit", tcp_congestion="reno") as cluster:
    hosts = [f"h{i + 1}" for i in range(ranks)]
    placements = ring_placements(cluster, hosts, ranks, "--sizes", size, "--iters", iters, "--policy", "geryon",
                                 "--timeout", 120, "--congestion", "reno", *extra)
    records = run_roles(cluster, placements)
seconds = _iteration_seconds(records)          # the bench's own: per collective, the slowest rank
print(json.dumps({"label": label, "extra": extra, "seconds": seconds, "median": _median(seconds)}))
