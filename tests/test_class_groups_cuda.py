"""NCCL process groups per priority class, on one GPU (world size 1): created with their traffic classes,
and DDP's buckets passing through each. Skipped, with the reason, where no GPU is visible.

With one rank NCCL moves nothing over a network, so these tests check what geryon controls (each
class's group exists, was made with its class's traffic class and stream priority, is not split from
a parent, and carries its class's buckets to the right result), not what the fabric does with the
marks: docs/nccl.md says what to check on a real RoCE or InfiniBand fabric. scripts/gpu-check.sh runs them.
"""

import copy
import logging

import pytest
import torch
import torch.distributed as dist

from geryon.collectives import parse_collectives
from geryon.errors import CollectivesUnavailable
from geryon.runtime.class_groups import ClassGroups, check_nccl_traffic_classes
from geryon.runtime.env import RankEnv


def _support_problem() -> str | None:
    try:
        check_nccl_traffic_classes()
    except CollectivesUnavailable as exc:
        return str(exc)
    return None


PROBLEM = _support_problem() if torch.cuda.is_available() else None
pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available())")]
needs_traffic_classes = pytest.mark.skipif(PROBLEM is not None, reason=f"this machine's PyTorch/NCCL: {PROBLEM}")

SECRET = "class-groups-cuda"
DSCPS = (46, 26, 0)   # three classes: EF, AF31, best effort


@pytest.fixture
def world_of_one():
    """A gloo default group of one rank (what geryon.init() makes), removed after the test."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def nccl_backend(group):
    return group._get_backend(torch.device("cuda"))


@needs_traffic_classes
@pytest.mark.parametrize("choice, expected", [("nccl", (184, 104, 0)), ("nccl-ib:5,3,0", (5, 3, 0))])
def test_each_class_gets_its_own_nccl_group_with_its_traffic_class(world_of_one, choice, expected):
    groups = ClassGroups(parse_collectives(choice), DSCPS, 1)
    assert groups.traffic_classes == expected
    assert len({id(g) for g in groups.groups}) == 3
    for index, group in enumerate(groups.groups):
        options = nccl_backend(group).options
        assert options.config.traffic_class == expected[index]
        assert options.is_high_priority_stream == (index == 0)   # the urgent class's stream first
        assert getattr(options, "split_from", None) is None          # made, not split from a parent
        tensor = torch.full((1024,), float(index + 1), device="cuda")
        dist.all_reduce(tensor, group=group)
        torch.cuda.synchronize()
        assert torch.equal(tensor, torch.full_like(tensor, float(index + 1)))


@needs_traffic_classes
def test_ddp_buckets_pass_through_every_class_group(world_of_one):
    from torch.distributed import TCPStore
    from torch.nn.parallel import DistributedDataParallel as DDP

    from geryon.runtime.ddp_sync import attach_geryon_hook

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    job = RankEnv(master_addr="127.0.0.1", master_port=store.port, secret=SECRET, collectives="nccl",
                  classes="high:46,low:0", launcher="geryon", role="worker")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 8 * 8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3)).cuda()
    alone = copy.deepcopy(model)
    hooked = DDP(model, bucket_cap_mb=0.001)
    groups = attach_geryon_hook(hooked, job, optimizer=None)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (hooked, alone)]
    generator = torch.Generator().manual_seed(1)
    for _ in range(4):
        x = torch.randn(8, 1, 8, 8, generator=generator).cuda()
        y = torch.randint(0, 3, (8,), generator=generator).cuda()
        for net, optimizer in zip((hooked, alone), optimizers):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            optimizer.step()
    torch.cuda.synchronize()
    counts = groups.log.counts
    assert len(counts) == 2 and all(c > 0 for c in counts), counts   # both classes' groups carried buckets
    # one rank: the average is the gradient itself, so DDP over the class groups trains as one process
    for a, b in zip(hooked.module.parameters(), alone.parameters()):
        assert torch.equal(a, b)


@needs_traffic_classes
def test_nccl_ib_tc_in_the_environment_is_reported(world_of_one, monkeypatch, caplog):
    monkeypatch.setenv("NCCL_IB_TC", "106")
    with caplog.at_level(logging.WARNING, logger="geryon.runtime.class_groups"):
        ClassGroups(parse_collectives("nccl"), DSCPS, 1)
    assert "NCCL_IB_TC=106 (environment) overrides the traffic class of every NCCL communicator" in caplog.text


@needs_traffic_classes
def test_a_default_group_bound_to_a_device_is_refused():
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    try:
        with pytest.raises(CollectivesUnavailable, match="split each class's NCCL group"):
            ClassGroups(parse_collectives("nccl"), DSCPS, 1)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(PROBLEM is None, reason="this machine's PyTorch and NCCL have per-communicator traffic classes")
def test_without_traffic_classes_the_error_names_what_is_needed(world_of_one):
    with pytest.raises(CollectivesUnavailable, match=r"NCCL >= 2\.26|traffic_class"):
        ClassGroups(parse_collectives("nccl"), DSCPS, 1)
