"""What reducing one received slice costs (twenty-third session): `AllreduceGroup._reduce` adds a
256 KiB float32 slice from a flow's scratch buffer into a 100 MB bucket, at a different place each
time, after a 20 ms sleep (a slice lands about every 21 ms per flow at 100 Mbit/s) and straight
after another. "torch" is the path every slice took before (it is kept for bfloat16), "numpy" the
path float32 takes now; the two alternate call by call. Medians and 10th-90th percentiles in
microseconds.

    .venv/bin/python docs/data/linerate/lead23-cold-reduce.py
"""
import statistics
import time

import torch

from geryon.transport.allreduce import AllreduceGroup, _BucketRun, _Inbox
from geryon.transport.buckets import plan_buckets

ELEMENTS = 25_000_000          # 100 MB of float32
SLICE = 65_536                 # 256 KiB
CALLS = 300

acc = torch.randn(ELEMENTS)
(bucket,) = plan_buckets([acc], [(0, 0)], bucket_bytes=acc.numel() * 4)
runs = {}
for path in ("torch", "numpy"):
    runs[path] = _BucketRun(bucket, acc, [0], expect_rs=0, expect_ag=0, expect_sent=0)
runs["torch"].acc_array = None             # the torch path, as a bfloat16 bucket takes
inbox = _Inbox()
inbox.landing(SLICE * 4)
inbox.scratch.view(torch.float32).copy_(torch.randn(SLICE))


def reduce(path: str, call: int) -> float:
    offset = (call * 7919 * SLICE) % (ELEMENTS - SLICE)
    start = time.perf_counter()
    AllreduceGroup._reduce(runs[path], inbox, offset, SLICE, SLICE * 4, None)
    return (time.perf_counter() - start) * 1e6


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    tenth, ninetieth = ordered[len(ordered) // 10], ordered[9 * len(ordered) // 10]
    return f"median {statistics.median(values):6.1f} us ({tenth:5.1f}-{ninetieth:5.1f})"


after_gap = {"torch": [], "numpy": []}
straight = {"torch": [], "numpy": []}
for call in range(CALLS):
    for path in ("torch", "numpy"):
        time.sleep(0.02)
        after_gap[path].append(reduce(path, call))
        straight[path].append(reduce(path, call + CALLS))
for path in ("torch", "numpy"):
    print(f"{path}: after a 20 ms sleep {summary(after_gap[path])}; straight after {summary(straight[path])}")
