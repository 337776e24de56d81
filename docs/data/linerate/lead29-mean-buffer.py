"""The PS server's mean gradient: a fresh tensor per update (before the twenty-ninth session) against
one buffer reused (after), on one thread as a server's receive thread computes it, 8 workers' float32
gradients. Prints per-update minor page faults, wall ms and CPU ms for shard sizes around glibc's
32 MiB mmap threshold. Run from the repository root:

    python docs/data/linerate/lead29-mean-buffer.py > docs/data/linerate/lead29-mean-buffer.txt
"""
import resource
import threading
import time

import torch

from geryon.transport import elementwise

torch.set_num_threads(1)


def measure(nbytes: int, reuse: bool, updates: int, workers: int = 8) -> dict:
    out = {}

    def body():
        grads = [torch.randn(nbytes // 4) for _ in range(workers)]
        buffer = torch.empty_like(grads[0])
        for _ in range(5):
            elementwise.mean_(buffer if reuse else torch.empty_like(grads[0]), grads)
        r0, t0 = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter()
        for _ in range(updates):
            mean = elementwise.mean_(buffer if reuse else torch.empty_like(grads[0]), grads)
            del mean
        r1, t1 = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter()
        out.update(faults=(r1.ru_minflt - r0.ru_minflt) / updates, ms=(t1 - t0) / updates * 1e3,
                   cpu_ms=(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / updates * 1e3)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    return out


print("shard         fresh: faults   ms      cpu ms   reused: faults   ms      cpu ms")
for nbytes in (256 << 10, 4 << 20, 16 << 20, 32 << 20, 48 << 20, 64 << 20, 256 << 20):
    updates = 200 if nbytes <= 4 << 20 else 30
    fresh, reused = measure(nbytes, False, updates), measure(nbytes, True, updates)
    print(f"{nbytes >> 10:>7} KiB   {fresh['faults']:>13.1f} {fresh['ms']:>7.2f} {fresh['cpu_ms']:>9.2f}"
          f"   {reused['faults']:>14.1f} {reused['ms']:>7.2f} {reused['cpu_ms']:>9.2f}")
