"""Per-collective cost of geryon's ring on loopback, 2 ranks, per policy: a tiny collective's latency (one at a
time) and the cost per collective when ResNet-50's 107 tensors at size scale 0.01 are queued back to back.

    .venv/bin/python probe_collective_cost.py [vanilla endhost geryon]
"""
import multiprocessing as mp
import statistics
import sys
import time

import torch


def rank_main(rank, policy, port, out):
    from geryon.categorize.profiles import resolve_profile
    from geryon.transport import AllreduceGroup
    from geryon.transport.config import TransportConfig

    torch.set_num_threads(1)
    sys.setswitchinterval(0.0002)      # as the replayed roles run
    config = TransportConfig(secret="s" * 32, policy=policy, class_dscp=(0, 0), rto_min_us=None, rto_max_ms=None)
    peers = [("127.0.0.1", port), ("127.0.0.1", port + 1)]
    group = AllreduceGroup(rank, 2, peers, config, listen=("127.0.0.1", peers[rank][1]))
    profile = resolve_profile("resnet50", batch=32)
    sizes = [max(1, round(layer.param_bytes / 4 * 0.01)) for layer in profile.layers if layer.param_bytes > 0]
    tensors = [torch.ones(n) for n in sizes]
    priorities = [(0 if i < len(sizes) // 2 else 1, 0) for i in range(len(sizes))]
    tiny = torch.ones(10)
    for _ in range(50):
        group.allreduce([tiny], [(0, 0)])
    latency = []
    for _ in range(300):
        began = time.perf_counter()
        group.allreduce([tiny], [(0, 0)])
        latency.append(time.perf_counter() - began)
    rounds, calls = [], []
    for index in range(23):     # the first 3 warm up
        began = time.perf_counter()
        works = []
        for i in reversed(range(len(sizes))):      # backward order, as a backward pass with no compute
            called = time.perf_counter()
            works.append(group.allreduce_async([tensors[i]], [priorities[i]]))
            calls.append(time.perf_counter() - called)
        for work in works:
            work.wait()
        if index >= 3:
            rounds.append(time.perf_counter() - began)
    group.close()
    out.put((rank, policy, statistics.median(latency), min(latency), statistics.median(rounds),
             statistics.median(calls), len(sizes)))


def main() -> None:
    mp.set_start_method("spawn")
    port = 47300
    for policy in sys.argv[1:] or ["vanilla", "endhost", "geryon"]:
        results = mp.Queue()
        ranks = [mp.Process(target=rank_main, args=(rank, policy, port, results)) for rank in range(2)]
        for process in ranks:
            process.start()
        rows = sorted(results.get(timeout=120) for _ in ranks)
        for process in ranks:
            process.join()
        port += 10
        for rank, name, latency, fastest, per_round, call, count in rows:
            print(f"{name:8} rank {rank}: tiny collective {latency * 1e6:.0f} us (min {fastest * 1e6:.0f});"
                  f" {count} ResNet-50 collectives back to back {per_round * 1e3:.2f} ms ="
                  f" {per_round / count * 1e6:.0f} us each; allreduce_async call {call * 1e6:.0f} us", flush=True)


if __name__ == "__main__":
    main()
