"""CPU time of the calling thread for one `allreduce_async` of a 2.5 MB tensor on a 2-rank loopback
ring, each call after a 10 ms idle gap (as between collectives; GAP_MS=0: back to back): median and
quartiles of 399 calls. Rank 1 runs as a subprocess of this script.

    PYTHONPATH=. [GAP_MS=0] .venv/bin/python docs/data/linerate/lead17-call-cpu.py
"""
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from geryon.transport.allreduce import AllreduceGroup
from geryon.transport.config import TransportConfig
from tests.transport_support import free_ports

CALLS = 400
GAP_S = float(os.environ.get("GAP_MS", "10")) / 1e3


def group(rank: int, ports: list[int]) -> AllreduceGroup:
    peers = [("127.0.0.1", p) for p in ports]
    return AllreduceGroup(rank, 2, peers, TransportConfig(secret="x"), listen=peers[rank])


if len(sys.argv) > 1:        # rank 1: follow rank 0's collectives
    with group(1, json.loads(sys.argv[1])) as ring:
        tensor = torch.ones(625_000)
        for _ in range(CALLS):
            ring.allreduce([tensor])
    sys.exit(0)

ports = free_ports(2)
child = subprocess.Popen([sys.executable, __file__, json.dumps(ports)])
cpu_us = []
with group(0, ports) as ring:
    tensor = torch.ones(625_000)
    ring.allreduce([tensor])
    for _ in range(CALLS - 1):
        time.sleep(GAP_S)
        started = time.thread_time_ns()
        work = ring.allreduce_async([tensor])
        cpu_us.append((time.thread_time_ns() - started) / 1e3)
        work.wait()
child.wait()
quartiles = statistics.quantiles(cpu_us, n=4)
print(f"gap {GAP_S * 1e3:g} ms: allreduce_async CPU per call, us: median {quartiles[1]:.0f}, "
      f"quartiles {quartiles[0]:.0f}-{quartiles[2]:.0f}")
