"""How long an allreduce call takes to hand its first piece to a flow (twenty-second session): two
ranks as threads over loopback, 10 MB, each call after a 20 ms idle gap (as the bench's collectives
are), alternating a call whose tensors are prepared (`geryon.transport.prepared`) with one whose
preparation was dropped first. Run on code without prepared allreduces (10d8055, from a worktree
with PYTHONPATH=$PWD), every call is of one kind: "before". Prints medians and quartiles in
microseconds.

    .venv/bin/python docs/data/linerate/lead22-call-to-first-send.py [CALLS]
"""
import statistics
import sys
import time

from lead22_loopback_pair import first_piece_clock, warm_pair

calls = int(sys.argv[1]) if len(sys.argv) > 1 else 200
groups, x = warm_pair()
first_send = first_piece_clock(groups[0])
cache = getattr(groups[0], "_prepared", None)
times = {"prepared": [], "first sight": []} if cache is not None else {"before": []}
for i in range(calls):
    kind = "before" if cache is None else "first sight" if i % 2 else "prepared"
    if kind == "first sight":
        cache._entries.clear()
    first_send.clear()
    time.sleep(0.02)
    started = time.perf_counter()
    work = groups[0].allreduce_async([x[0]])
    groups[1].allreduce([x[1].clone()])
    work.wait()
    times[kind].append((first_send[0] - started) * 1e6)
for kind, values in times.items():
    q1, q2, q3 = statistics.quantiles(values[5:], n=4)
    print(f"{kind:12s} call to first piece queued: median {q2:.0f} us (quartiles {q1:.0f}, {q3:.0f})")
for group in groups:
    group.close()
