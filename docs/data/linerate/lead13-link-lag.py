"""Per ring link of a traced bench ring (thirteenth session): how far each received piece lags an
always-busy wire, and the long gaps between pieces.

    python lead13-link-lag.py DIR RANKS SIZE FLOOR_S [GAP_MS]

DIR is lead10-ring-trace.py's output (records.json and rankR.jsonl). For each timed collective and
link (left neighbour -> rank), with t_k the k-th recv_done after the common start and B_k the
payload bytes received by then: lag_k = t_k - B_k / rate, where rate = the link's payload bytes /
FLOOR_S (the header floor). Printed: the first piece's lag, the last piece's lag, and the full pieces
whose recv_done came more than GAP_MS (default 23.5) after the full piece before (a piece of 256 KiB
takes 21.9 ms at 100 Mbit/s; gaps around the short last piece of each ring step are not listed).
"""
import json
import sys

from geryon.bench.transport_roles import ring_link_bytes

folder, ranks, size, floor_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
gap_ms = float(sys.argv[5]) if len(sys.argv) > 5 else 23.5
records = json.load(open(f"{folder}/records.json"))
start_of = [x for x in records[0] if x.get("event") == "result"][0]["all_starts"]
rate = ring_link_bytes(int(size), ranks) / floor_s
traced = {r: [json.loads(line) for line in open(f"{folder}/rank{r}.jsonl")] for r in range(ranks)}
timed = sorted({e["iteration"] for e in traced[0] if e["nbytes"] > 1000})[-len(start_of):]
for i, seq in enumerate(timed):
    start = start_of[i]
    print(f"collective {seq}")
    for r in range(ranks):
        pieces = sorted((e["t"], e["nbytes"]) for e in traced[r] if e["iteration"] == seq and e["kind"] == "recv_done")
        received, lags, gaps = 0, [], []
        for k, (t, nbytes) in enumerate(pieces):
            received += nbytes
            lags.append(((t - start) - received / rate) * 1e3)
            gap = (t - pieces[k - 1][0]) * 1e3 if k else 0.0
            if gap > gap_ms and nbytes == pieces[k - 1][1] == pieces[0][1]:
                gaps.append(f"{(t - start) * 1e3:.0f}:{gap:.1f}")
        print(f"  link {(r - 1) % ranks}->{r}: lag first {lags[0]:5.1f} last {lags[-1]:5.1f} ms; "
              f"gaps (ms after start: gap) {' '.join(gaps)}")
