"""Per ring link, when the last four pieces of a large collective were handed to the kernel (send_start,
send_done) and received (recv_done), in ms from the collective's first event, for each large
collective of a traced allreduce bench (TransferEvents as JSON lines, gzip), and each link's gap
between its last send_done and its last recv_done.

    python docs/data/linerate/lead31-last-pieces.py lead31-trace-1gbit-8x100mb.jsonl.gz
"""
import collections
import gzip
import json
import pathlib
import re
import sys

path = pathlib.Path(sys.argv[1])
path = path if path.exists() else pathlib.Path(__file__).parent / path
events = [json.loads(line) for line in gzip.open(path, "rt")]
world = 1 + max(int(re.match(r"rank (\d+)", e["peer"]).group(1)) for e in events)
collectives = collections.defaultdict(list)
for event in events:
    collectives[event["iteration"]].append(event)


def at(evs, t0):
    return [round(1000 * (e["t"] - t0), 1) for e in evs]


for number, evs in sorted(collectives.items()):
    if sum(e["nbytes"] for e in evs if e["kind"] == "send_done") < 10**7:
        continue          # the barriers and starts between timed collectives
    t0 = min(e["t"] for e in evs)
    print(f"collective {number}: last event at {1000 * (max(e['t'] for e in evs) - t0):.1f} ms")
    for k in range(world):
        left = (k - 1) % world

        def of(kind, peer):
            return sorted((e for e in evs if e["kind"] == kind and e["peer"].startswith(f"rank {peer} ")),
                          key=lambda e: e["t"])
        starts, dones, recvs = of("send_start", k), of("send_done", k), of("recv_done", left)
        print(f"  link {left}->{k}: send_start {at(starts[-4:], t0)} send_done {at(dones[-4:], t0)} "
              f"recv_done {at(recvs[-4:], t0)}  last done->recv {1000 * (recvs[-1]['t'] - dones[-1]['t']):.1f} ms")
