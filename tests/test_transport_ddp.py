"""geryon_ddp_hook on a real DistributedDataParallel model, against DDP's own gloo allreduce.

Each rank is a process (this file run as a script): gloo sets DDP up and runs the reference
model's default allreduce; a second DDP model with the same weights sends its buckets through
an AllreduceGroup on loopback. After a few SGD steps both models must agree: bit for bit with
2 ranks (x/2 + y/2 == (x + y)/2 in binary floating point), within float tolerance with more (gloo
sums in another order).
"""

from __future__ import annotations

import copy
import json
import sys

import pytest

from tests.transport_support import free_ports, run_rank_scripts

STEPS = 4


def train(rank: int, world: int, master_port: int, ports: list[int]) -> dict:
    """Train the reference and the hooked DDP model side by side; report how far apart they are."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from geryon.transport.allreduce import AllreduceGroup
    from geryon.transport.config import TransportConfig
    from geryon.transport.hooks import GeryonHookState, geryon_ddp_hook

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{master_port}", rank=rank,
                            world_size=world)
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 5))
    # small buckets: several collectives per step, in both priority classes
    reference = DDP(copy.deepcopy(base), bucket_cap_mb=0.01)
    hooked = DDP(copy.deepcopy(base), bucket_cap_mb=0.01)
    config = TransportConfig(secret="ddp", slice_bytes=4096, bucket_bytes=1 << 20, timeout=30)
    peers = [("127.0.0.1", p) for p in ports]
    group = AllreduceGroup(rank, world, peers, config, listen=peers[rank])
    buckets_seen = set()

    def priority_of_bucket(index):
        buckets_seen.add(index)
        return index % 2

    hooked.register_comm_hook(GeryonHookState(group, priority_of_bucket), geryon_ddp_hook)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (reference, hooked)]
    worst_grad = 0.0
    generator = torch.Generator().manual_seed(100 + rank)
    try:
        for _ in range(STEPS):
            inputs = torch.randn(16, 20, generator=generator)
            labels = torch.randint(0, 5, (16,), generator=generator)
            for model, optimizer in zip((reference, hooked), optimizers):
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(inputs), labels).backward()
            for a, b in zip(reference.parameters(), hooked.parameters()):
                worst_grad = max(worst_grad, (a.grad - b.grad).abs().max().item())
            for optimizer in optimizers:
                optimizer.step()
        pairs = list(zip(reference.parameters(), hooked.parameters()))
        return {"rank": rank, "buckets": len(buckets_seen), "max_grad_diff": worst_grad,
                "max_param_diff": max((a - b).abs().max().item() for a, b in pairs),
                "bit_exact": all(torch.equal(a, b) for a, b in pairs),
                "moved": max((a - b).abs().max().item()
                             for a, b in zip(base.parameters(), hooked.parameters())),
                "param_sum": sum(p.double().sum().item() for p in hooked.parameters())}
    finally:
        group.close()
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_hooked_ddp_matches_default_ddp(world):
    master, *ports = free_ports(world + 1)
    reports = run_rank_scripts(__file__, world, master, ",".join(map(str, ports)))
    for report in reports:
        assert report["buckets"] >= 2, report
        assert report["moved"] > 1e-3, report            # training really changed the weights
        assert report["max_grad_diff"] <= 1e-6, report
        assert report["max_param_diff"] <= 1e-6, report
        if world == 2:
            assert report["bit_exact"], report
    # DDP keeps replicas identical: every rank ends with the same weights
    assert len({r["param_sum"] for r in reports}) == 1, reports


if __name__ == "__main__":
    from geryon.quickexit import exit_without_collecting

    exit_without_collecting()   # a rank ends as promptly as a job's worker does
    rank_arg, world_arg, master_arg, ports_arg = sys.argv[1:5]
    result = train(int(rank_arg), int(world_arg), int(master_arg), [int(p) for p in ports_arg.split(",")])
    print(json.dumps(result), flush=True)
