"""Where a cold allreduce call's time before its first byte goes, per function (twenty-second
session; run on the code before prepared allreduces, 10d8055): two ranks as threads over loopback,
10 MB, 20 ms idle before each of 40 calls; each function of the path is wrapped with a timer.
Medians in microseconds (the wrappers add a little to each).

    (in a worktree of 10d8055)  PYTHONPATH=$PWD .venv/bin/python docs/data/linerate/lead22-call-parts.py
"""
import statistics
import time

import geryon.transport.allreduce as allreduce_module
from lead22_loopback_pair import first_piece_clock, warm_pair

CALLS = 40
spent: dict[str, list[float]] = {}


def timed(owner, name: str) -> None:
    function = getattr(owner, name)

    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent.setdefault(name, []).append((time.perf_counter() - started) * 1e6)

    setattr(owner, name, wrapper)


groups, x = warm_pair()
for name in ("normalize_priorities", "plan_buckets", "plan_digest", "chunk_bounds", "pieces", "encode_header"):
    timed(allreduce_module, name)
for name in ("_flatten", "_start", "_own_chunk", "_send_key"):
    timed(allreduce_module.AllreduceGroup, name)
timed(allreduce_module, "_BucketRun")
first_send = first_piece_clock(groups[0])
to_first = []
for _ in range(CALLS):
    first_send.clear()
    time.sleep(0.02)
    started = time.perf_counter()
    work = groups[0].allreduce_async([x[0]])
    spent_here = {name: len(values) for name, values in spent.items()}
    groups[1].allreduce([x[1].clone()])
    work.wait()
    to_first.append((first_send[0] - started) * 1e6)
    for name, count in spent_here.items():       # rank 0's own calls only
        del spent[name][count:]
print(f"call to first piece queued: median {statistics.median(to_first):.0f} us")
for name, values in spent.items():
    print(f"  {name:22s} {len(values) / CALLS:4.1f} calls, median {statistics.median(values):6.1f} us each")
for group in groups:
    group.close()
