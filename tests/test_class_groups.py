"""Per-class process groups (--collectives): the choice, the traffic classes, the checks, and the dispatch.

The dispatch runs for real with gloo on CPU: two ranks (this file run as a script, as
tests/test_transport_ddp.py runs its ranks) attach geryon's hook with --collectives gloo-classes to a
DistributedDataParallel model and train beside a second copy under DDP's own default hook. Each
bucket must go to the group of its most urgent parameter's class, every rank must send each group
the same buckets in the same order (the digests geryon exchanges through the job's store), and the
result must be bit-equal to DDP's default hook and equal to one process training on both batches.
One job through the launcher checks that the flag reaches the ranks and that the threshold search
moves buckets between the groups while training. NCCL's groups are in
tests/test_class_groups_cuda.py.
"""

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from geryon.collectives import Collectives, parse_collectives
from geryon.errors import CollectivesUnavailable, ConfigError, ProtocolError
from geryon.launch.config import parse_launch_args
from geryon.launch.environment import job_environment
from geryon.launch.placement import RankSpec
from geryon.runtime.class_groups import (OrderLog, check_nccl_traffic_classes, check_order, class_overrides,
                                         nccl_support_problem)
from geryon.runtime.env import RankEnv

sys.path.insert(0, str(Path(__file__).parent))
import ddp_probe  # noqa: E402
from launch_support import REPO, clean_env, exit_abort_reason, launcher_exit_abort, run_launcher  # noqa: E402
from transport_support import free_ports, run_rank_scripts  # noqa: E402

SCRIPT = str(REPO / "examples" / "train_cnn.py")
PROBE = REPO / "tests" / "ddp_probe.py"
SECRET = "class-groups-test"
ORDER_KEY = "geryon/class_groups/order"


# -- the choice --------------------------------------------------------------------------------------

def test_each_choice_parses_to_its_backend_and_marks():
    dscps = (46, 26, 0)
    assert parse_collectives(None) == Collectives("geryon")
    assert parse_collectives("nccl").traffic_classes(dscps) == (184, 104, 0)   # the TOS byte, ECN bits clear
    assert parse_collectives("nccl").backend == "nccl"
    ib = parse_collectives("nccl-ib:5, 3,0")
    assert (ib.backend, ib.service_levels, ib.text()) == ("nccl", (5, 3, 0), "nccl-ib:5,3,0")
    assert ib.traffic_classes(dscps) == (5, 3, 0)
    gloo = parse_collectives("gloo-classes")
    assert (gloo.backend, gloo.traffic_classes(dscps)) == ("gloo", (None, None, None))
    assert not parse_collectives("geryon").process_groups and gloo.process_groups


@pytest.mark.parametrize("text, says", [("rdma", "choose one of"), ("nccl-ib", "one InfiniBand service level"),
                                        ("nccl-ib:3,x", "whole numbers"), ("nccl-ib:16,0", "0-15"),
                                        ("gloo-classes:3", "choose one of")])
def test_a_bad_choice_says_what_is_accepted(text, says):
    with pytest.raises(ConfigError, match=says):
        parse_collectives(text)


def test_the_launcher_validates_the_flag_and_hands_it_to_the_ranks():
    config = parse_launch_args(["--local", "--collectives", "nccl-ib:3,0", SCRIPT], {})
    assert config.collectives == "nccl-ib:3,0"
    assert parse_launch_args(["--local", SCRIPT], {"GERYON_COLLECTIVES": "gloo-classes"}).collectives == "gloo-classes"
    assert parse_launch_args(["--local", SCRIPT], {}).collectives == "geryon"
    env = job_environment(config, RankSpec("worker", 0, 0, 0), "127.0.0.1", 1, 1)
    assert RankEnv.from_environ(dict(env)).collectives == "nccl-ib:3,0"


@pytest.mark.parametrize("argv, says", [
    (["--collectives", "nccl", "--mode", "ps"], "--mode allreduce only"),
    (["--collectives", "nccl", "--policy", "slicing"], "--policy slicing"),
    (["--collectives", "gloo-classes", "--tls"], "not encrypted"),
    (["--collectives", "nccl-ib:3", "--classes", "3"], "names 1 service levels but the job has 3"),
])
def test_the_launcher_refuses_what_the_groups_cannot_honour(argv, says):
    with pytest.raises(ConfigError, match=says):
        parse_launch_args(["--local", *argv, SCRIPT], {})


# -- what NCCL needs --------------------------------------------------------------------------------

class _ConfigWithTrafficClass:
    traffic_class = -1


def test_missing_support_is_named_with_the_versions_needed():
    assert "no NCCL" in nccl_support_problem("2.13.0+cpu", False, None, ())
    old_torch = nccl_support_problem("2.5.0", True, object(), (2, 27, 3))
    assert "ProcessGroupNCCL.Options().config.traffic_class" in old_torch and "2.5.0" in old_torch
    old_nccl = nccl_support_problem("2.13.0", True, _ConfigWithTrafficClass(), (2, 21, 5))
    assert "NCCL 2.21.5" in old_nccl and ">= 2.26" in old_nccl
    assert nccl_support_problem("2.13.0", True, _ConfigWithTrafficClass(), (2, 26, 2)) is None


@pytest.mark.skipif(dist.is_nccl_available(), reason="this PyTorch has NCCL (tests/test_class_groups_cuda.py)")
def test_this_cpu_build_gets_the_typed_error():
    with pytest.raises(CollectivesUnavailable, match="has no NCCL.*gloo-classes"):
        check_nccl_traffic_classes()


def test_nccl_settings_that_override_every_class_are_found(tmp_path):
    user = tmp_path / "user.conf"
    user.write_text("NCCL_DEBUG=INFO\nNCCL_IB_SL = 4\n")
    system = tmp_path / "system.conf"
    system.write_text("NCCL_IB_TC=106\n")
    found = class_overrides({"NCCL_IB_TC": "96", "NCCL_CONF_FILE": str(user)}, system_conf=str(system))
    # the environment's NCCL_IB_TC wins over the system file's, which is not reported again
    assert found == ["NCCL_IB_TC=96 (environment)", f"NCCL_IB_SL=4 ({user})"]
    assert class_overrides({"NCCL_CONF_FILE": str(tmp_path / "none")}, system_conf=str(system)) == \
        [f"NCCL_IB_TC=106 ({system})"]
    assert class_overrides({"NCCL_CONF_FILE": str(tmp_path / "none")}, system_conf=str(tmp_path / "no")) == []


def test_nccl_groups_refuse_a_model_left_on_the_cpu():
    from torch.nn.parallel import DistributedDataParallel as DDP

    from geryon.runtime.ddp_sync import attach_geryon_hook

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ddp = DDP(torch.nn.Linear(4, 2))
        with pytest.raises(ConfigError, match="parameters on the CPU: move it to this rank's GPU"):
            attach_geryon_hook(ddp, RankEnv(collectives="nccl", secret=SECRET, launcher="geryon"))
    finally:
        dist.destroy_process_group()


# -- the order check --------------------------------------------------------------------------------

def _log(entries) -> dict:
    log = OrderLog(2)
    for group, index, numel in entries:
        log.note(group, index, torch.zeros(numel))
    return log.snapshot()


def test_ranks_that_sent_buckets_in_another_order_are_stopped():
    store = dist.HashStore()
    same = [(1, 0, 10), (0, 1, 10), (1, 2, 4)]
    store.set(f"{ORDER_KEY}/1", json.dumps(_log(same)))
    assert check_order(store, ORDER_KEY, 0, 2, _log(same))["counts"] == [1, 2]
    swapped = dist.HashStore()
    # the same sizes and counts per group, but two buckets of one group swapped: gloo would add them up
    swapped.set(f"{ORDER_KEY}/1", json.dumps(_log([(1, 2, 10), (0, 1, 10), (1, 0, 10)])))
    with pytest.raises(ProtocolError, match=r"another order than ranks \[1\]"):
        check_order(swapped, ORDER_KEY, 0, 2, _log([(1, 0, 10), (0, 1, 10), (1, 2, 10)]))


# -- the dispatch, two ranks on gloo ------------------------------------------------------------------

def train_rank(rank: int, world: int, init_port: int, store_port: int) -> dict:
    """Train ddp_probe's model under --collectives gloo-classes beside DDP's default hook; what happened."""
    import copy

    from torch.nn.parallel import DistributedDataParallel as DDP

    from geryon.runtime.ddp_sync import attach_geryon_hook

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{init_port}", rank=rank, world_size=world)
    job = RankEnv(rank=rank, world_size=world, launcher="geryon", master_addr="127.0.0.1",
                  master_port=store_port, secret=SECRET, collectives="gloo-classes")
    model, optimizer, _options = ddp_probe.build("plain")
    names = {id(p): n for n, p in model.named_parameters()}
    reference = DDP(copy.deepcopy(model), bucket_cap_mb=0.0001)
    hooked = DDP(model, bucket_cap_mb=0.0001)   # about one parameter per bucket: buckets of both classes
    groups = attach_geryon_hook(hooked, job, optimizer=optimizer)
    calls = []
    allreduce = groups.allreduce

    def recording(priority_class, bucket):   # what the hook decided, seen on the way to the group
        calls.append({"class": priority_class, "group": groups.group_of(priority_class),
                      "params": sorted(names[id(p)] for p in bucket.parameters())})
        return allreduce(priority_class, bucket)

    groups.allreduce = recording
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=ddp_probe.LR, momentum=0.9)
    for step in range(ddp_probe.STEPS):
        x, y = ddp_probe.data(step)
        for net, opt in ((hooked, optimizer), (reference, reference_optimizer)):
            opt.zero_grad()
            ddp_probe.loss_of(net, "plain", ddp_probe.chunk(x, rank, world), ddp_probe.chunk(y, rank, world),
                              step).backward()
            opt.step()
    record = {"rank": rank, "calls": calls, "order": groups.log.snapshot(), "groups": len(groups.groups),
              "params": ddp_probe.flat(hooked.module),
              "bit_exact": all(torch.equal(a, b) for a, b in zip(hooked.parameters(), reference.parameters()))}
    dist.destroy_process_group()
    return record


@pytest.mark.slow
def test_each_bucket_goes_to_its_class_group_in_the_same_order_on_every_rank():
    from torch.distributed import TCPStore

    world = 2
    init_port, store_port = free_ports(2)
    store = TCPStore("127.0.0.1", store_port, is_master=True, wait_for_workers=False)
    reports = run_rank_scripts(__file__, world, init_port, store_port)
    order = ["conv.weight", "conv.bias", "fc.weight", "fc.bias", "aux.weight", "aux.bias"]
    for report in reports:
        assert report["groups"] == 2
        calls = report["calls"]
        assert len(calls) > ddp_probe.STEPS   # DDP's first bucket holds everything, later ones are small
        for call in calls:   # --priority coarse: the convolution is class 0, the rest class 1
            assert call["class"] == min(0 if n.startswith("conv") else 1 for n in call["params"]), call
            assert call["group"] == call["class"]
        assert {c["group"] for c in calls} == {0, 1}
        assert sorted({n for c in calls for n in c["params"]}) == sorted(order)
        assert report["order"]["counts"] == [sum(c["group"] == g for c in calls) for g in (0, 1)]
        assert report["bit_exact"], "not bit-equal to DDP's default hook"
        assert report["params"] == pytest.approx(ddp_probe.reference("plain"), rel=1e-5, abs=1e-6)
    # every rank sent each group the same buckets in the same order ...
    assert reports[0]["order"] == reports[1]["order"]
    assert [c["params"] for c in reports[0]["calls"]] == [c["params"] for c in reports[1]["calls"]]
    # ... and geryon itself checked it through the job's store after the first iteration
    assert store.check([f"{ORDER_KEY}/0", f"{ORDER_KEY}/1"])


@pytest.mark.slow
def test_the_flag_reaches_the_ranks_and_the_search_switches_classes_between_groups(tmp_path):
    """A job through the launcher with --priority search probing one iteration per threshold: buckets move
    between the class groups while training, and the parameters still match one process."""
    out, run = tmp_path / "probe.json", tmp_path / "RUN.json"
    search = dict(GERYON_SEARCH_CANDIDATES="0,0.5,1", GERYON_SEARCH_ITERS="1", GERYON_SEARCH_WARMUP="0",
                  GERYON_SEARCH_BUDGET="3", GERYON_SEARCH_FIRST_ROUND="3", GERYON_SEARCH_CONFIRM="0",
                  GERYON_SEARCH_RUN=str(run))
    result = run_launcher("--local", "--workers", "2", "--collectives", "gloo-classes", "--priority", "search",
                          PROBE, "--feature", "hook_classes_static", "--out", out, timeout=120,
                          env=clean_env(**search))
    aborted = launcher_exit_abort(result)   # PyTorch's exit-time abort after the ranks wrote their results
    assert aborted or result.returncode == 0, result.stderr[-3000:]
    assert "[worker0] geryon: buckets go through gloo-classes: 2 gloo groups (class 0: unmarked, class 1: " \
           "unmarked)" in result.stdout
    chosen = json.loads(run.read_text())["chosen"]
    assert chosen in (0, 0.5, 1)
    for worker in ("worker0", "worker1"):   # every bucket in class 0 for one iteration, then split again
        assert f"[{worker}] geryon: search switch 2 before iteration 2: threshold 1, [524, 0]" in result.stderr
        # the last probe was threshold 1: the buckets move again only when the timings chose another one
        switch3 = f"[{worker}] geryon: search switch 3 before iteration 3: threshold {chosen:.4g}"
        assert (switch3 in result.stderr) == (chosen != 1), result.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["params"] == pytest.approx(ddp_probe.reference("hook_classes_static"), rel=1e-4, abs=1e-5)
    assert record["hook_calls"] == []   # geryon's transport carried nothing
    if aborted:
        pytest.xfail(exit_abort_reason("a worker"))


if __name__ == "__main__":
    from geryon.quickexit import exit_without_collecting

    exit_without_collecting()   # a rank ends as promptly as a job's worker does
    rank_arg, world_arg, init_arg, store_arg = sys.argv[1:5]
    print(json.dumps(train_rank(int(rank_arg), int(world_arg), int(init_arg), int(store_arg))), flush=True)
