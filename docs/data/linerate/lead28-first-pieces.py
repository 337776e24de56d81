"""When each ring link's first two pieces were handed to the kernel and arrived, per large collective
of a traced allreduce bench (TransferEvents as JSON lines, gzip), in ms from the collective's first event.

    python docs/data/linerate/lead28-first-pieces.py lead28-trace-1gbit-8x100mb.jsonl.gz
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
collectives = collections.defaultdict(list)
for event in events:
    collectives[event["iteration"]].append(event)
world = 1 + max(int(re.match(r"rank (\d+)", e["peer"]).group(1)) for e in events)


def of(kind, peer, evs):
    return sorted((e for e in evs if e["kind"] == kind and e["peer"].startswith(f"rank {peer} ")),
                  key=lambda e: e["t"])


for number, evs in sorted(collectives.items()):
    moved = sum(e["nbytes"] for e in evs if e["kind"] == "send_done")
    if moved < 10**7:
        continue          # the barriers between timed collectives
    t0 = min(e["t"] for e in evs)
    sizes = collections.Counter(e["nbytes"] for e in evs if e["kind"] == "send_done").most_common(1)[0][0]
    print(f"collective {number}: {moved / 1e6:.0f} MB sent, {(max(e['t'] for e in evs) - t0) * 1e3:.1f} ms "
          f"from first to last event, pieces mostly {sizes} B")
    for src in range(world):
        dst = (src + 1) % world
        start, done, got = of("send_start", dst, evs), of("send_done", dst, evs), of("recv_done", src, evs)
        ms = [round((e["t"] - t0) * 1e3, 1) for e in (start[0], done[0], got[0], start[1], done[1], got[1])]
        print(f"  {src}->{dst}: piece 0 sent {ms[0]}..{ms[1]} in {ms[2]}; piece 1 sent {ms[3]}..{ms[4]} in {ms[5]}")
