"""Where each rank's time goes in the timed collectives of a traced bench ring (tenth session).

    python lead10-ring-tail.py DIR RANKS FLOOR_S

DIR holds records.json (every rank's JSON records, from lead10-ring-trace.py) and rankR.jsonl[.gz]
(that rank's TransferEvents). Per timed collective and rank, in ms after the common start instant:
first piece queued, first send_start, first and last recv_done, last send_done, and the rank's end
(its `all_seconds`); FLOOR_S is the header floor (1.4638 s for 8 ranks x 10 MB at 100 Mbit/s).
"""
import gzip
import json
import os
import sys

folder, ranks, floor_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
records = json.load(open(f"{folder}/records.json"))
result = {r: [x for x in records[r] if x.get("event") == "result"][0] for r in range(ranks)}


def events(rank):
    path = f"{folder}/rank{rank}.jsonl"
    opener = (lambda: gzip.open(path + ".gz", "rt")) if not os.path.exists(path) else (lambda: open(path))
    with opener() as handle:
        return [json.loads(line) for line in handle]


traced = {r: events(r) for r in range(ranks)}
timed = sorted({e["iteration"] for e in traced[0] if e["nbytes"] > 1000})[-3:]
for i, seq in enumerate(timed):
    start = result[0]["all_starts"][i]
    print(f"collective {seq}: floor {floor_s * 1e3:.1f} ms")
    for r in range(ranks):
        mine = [e for e in traced[r] if e["iteration"] == seq]

        def at(kind, pick):
            return (pick(e["t"] for e in mine if e["kind"] == kind) - start) * 1e3
        end = result[r]["all_seconds"][i] * 1e3
        last_recv = at("recv_done", max)
        print(f"  rank {r}: queued {at('queued', min):6.1f}  send_start {at('send_start', min):6.1f}  "
              f"first recv {at('recv_done', min):7.1f}  last send_done {at('send_done', max):7.1f}  "
              f"last recv_done {last_recv:7.1f}  end {end:7.1f}  (end-lastrecv {end - last_recv:.1f})")
