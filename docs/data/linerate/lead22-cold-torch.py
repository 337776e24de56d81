"""What one torch call costs after a gap (twenty-second session): `x.view(-1)` timed right after
sleeping or spinning in Python for a while, and once more straight after; then a small pure-Python
function after a 20 ms sleep, twice. Medians in microseconds.

    .venv/bin/python docs/data/linerate/lead22-cold-torch.py
"""
import statistics
import time

import torch

x = torch.randn(2_500_000)


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


for name, wait in (("spin", spin), ("sleep", time.sleep)):
    for gap in (0.0001, 0.001, 0.005, 0.02, 0.1):
        first, again = [], []
        for _ in range(40):
            wait(gap)
            t0 = time.perf_counter()
            x.view(-1)
            t1 = time.perf_counter()
            x.view(-1)
            t2 = time.perf_counter()
            first.append((t1 - t0) * 1e6)
            again.append((t2 - t1) * 1e6)
        print(f"after {name} {gap * 1e3:6.1f} ms: first view {statistics.median(first):6.1f} us, "
              f"the next {statistics.median(again):5.1f} us")


def small() -> int:
    return sum(range(50))


first, again = [], []
for _ in range(40):
    time.sleep(0.02)
    t0 = time.perf_counter()
    small()
    t1 = time.perf_counter()
    small()
    t2 = time.perf_counter()
    first.append((t1 - t0) * 1e6)
    again.append((t2 - t1) * 1e6)
print(f"after sleep   20.0 ms: sum(range(50)) {statistics.median(first):5.1f} us, "
      f"the next {statistics.median(again):5.1f} us")
