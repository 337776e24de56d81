"""Partial allreduce (--sync partial): schedules, the group reduce over real sockets, and a launched job.

The job test checks what Ripples' P-Reduce promises: on every worker the recorded groups never
overlap in time, every member of a group recorded the same group, the final replicas are equal,
and the model converges below the loss full allreduce reaches (given more iterations: the price).
"""

import json
import re
import threading
import time
from pathlib import Path

import pytest
import torch

from geryon.errors import ConfigError, TransportError
from geryon.launch.config import check_sync, parse_launch_args
from geryon.launch.environment import job_environment
from geryon.launch.placement import RankSpec
from geryon.runtime.env import RankEnv
from geryon.runtime.partial_sync import class_bounds, static_groups
from geryon.runtime.straggler import slow_down
from geryon.syncmodes import parse_straggler, parse_sync
from geryon.transport.config import TransportConfig
from geryon.transport.group_reduce import GroupReduce
from launch_support import run_launcher
from transport_support import free_ports

SCRIPT = Path(__file__).parent / "partial_script.py"


@pytest.mark.parametrize("world,size", [(8, 4), (8, 3), (5, 2), (3, 4), (7, 3)])
def test_static_rounds_partition_the_workers_and_mix_them(world, size):
    weights = torch.eye(world, dtype=torch.float64)   # row i: what worker i's model is made of
    for round_ in range(world):
        groups = static_groups(round_, world, size)
        members = [m for g in groups for m in g]
        assert sorted(members) == list(range(world))          # each worker in exactly one group
        assert all(len(g) >= 2 for g in groups)
        for group in groups:
            weights[group] = weights[group].mean(0)
    assert bool((weights > 0).all())    # every worker's model has reached every other worker


def test_flags_are_checked_before_anything_starts():
    assert parse_sync("partial").group_size == 4 and parse_sync("partial-static:3").group_size == 3
    assert parse_straggler("7:5").factor == 5.0
    for bad in ("partial:1", "partial:x", "full:3", "ripples"):
        with pytest.raises(ConfigError, match="--sync"):
            parse_sync(bad)
    for bad in ("8:2", "1:0.5", "one:2"):
        with pytest.raises(ConfigError, match="--straggler"):
            parse_straggler(bad, workers=8)
    config = parse_launch_args(["--local", "--workers", "8", "--straggler", "7:5", str(SCRIPT)],
                               environ={"GERYON_SYNC": "partial"})
    assert (config.sync, config.straggler) == ("partial:4", "7:5")
    rank = RankEnv.from_environ(job_environment(config, RankSpec("worker", 7, 0, 7), "127.0.0.1", 1, 8))
    assert (rank.sync, rank.straggler) == ("partial:4", "7:5")
    with pytest.raises(ConfigError, match="allreduce only"):
        parse_launch_args(["--local", "--mode", "ps", "--sync", "partial-static", str(SCRIPT)], environ={})
    with pytest.raises(ConfigError, match="--collectives"):
        check_sync("partial", None, "allreduce", "nccl", 4)


def test_class_bounds_put_the_leading_half_of_the_model_in_class_zero():
    tensors = [torch.zeros(10), torch.zeros(30), torch.zeros(60)]
    assert class_bounds(tensors, 2) == [0, 40, 100]
    assert class_bounds(tensors, 3) == [0, 40, 100, 100]
    assert class_bounds(tensors, 1) == [0, 100]
    assert class_bounds([torch.zeros(90), torch.zeros(10)], 2) == [0, 90, 100]   # the first tensor at least


def _mesh(world, config, body):
    host, ports = "127.0.0.1", free_ports(world)
    peers = [(host, p) for p in ports]
    results, errors = [None] * world, [None] * world

    def run(rank):
        mesh = None
        try:
            mesh = GroupReduce(rank, world, peers, config, 5003, torch.float32, listen=(host, ports[rank]))
            results[rank] = body(mesh)
        except BaseException as exc:  # noqa: BLE001 -- checked in the caller's thread
            errors[rank] = exc
        finally:
            if mesh is not None:
                mesh.close()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results, errors


def test_disjoint_groups_at_once_give_every_member_the_same_bits():
    world = 4
    inputs = [torch.randn(5003, generator=torch.Generator().manual_seed(r)) for r in range(world)]
    rounds = [[[0, 1], [2, 3]], [[0, 3], [1, 2]], [[0, 1, 2, 3]]]
    config = TransportConfig(secret="t", slice_bytes=1024, timeout=20)

    def body(mesh):
        flat, seen = inputs[mesh.rank].clone(), []
        for index, groups in enumerate(rounds):
            group = next(g for g in groups if mesh.rank in g)
            mesh.average(100 + index * 10 + groups.index(group), group, flat, [0, 1000, 5003])
            seen.append(flat.clone())
        return seen

    results, errors = _mesh(world, config, body)
    assert errors == [None] * world
    want = [x.clone() for x in inputs]
    for groups in rounds:
        for group in groups:
            total = want[group[0]].clone()
            for member in group[1:]:
                total.add_(want[member])
            total.div_(len(group))
            for member in group:
                want[member] = total.clone()
        for rank in range(world):
            step = rounds.index(groups)
            assert torch.equal(results[rank][step], want[rank])
    assert all(torch.equal(results[0][-1], results[r][-1]) for r in range(world))


@pytest.mark.timing
def test_a_member_that_dies_is_named_within_the_timeout():
    config = TransportConfig(secret="t", slice_bytes=1024, timeout=2)

    paired = threading.Barrier(3)

    def body(mesh):
        flat = torch.ones(5003)
        if mesh.rank < 2:
            mesh.average(7, [0, 1], flat)
        paired.wait()
        if mesh.rank == 2:
            mesh.pool.close(say_goodbye=False)    # as a killed process: connections reset, no BYE
            return None
        started = time.monotonic()
        try:
            mesh.average(8, [0, 1, 2], flat)
        finally:
            assert time.monotonic() - started < config.timeout + 1
        return flat

    results, errors = _mesh(3, config, body)
    for rank in (0, 1):
        assert isinstance(errors[rank], TransportError), errors[rank]
        assert "rank 2" in str(errors[rank])


@pytest.mark.timing
def test_a_straggler_sleeps_its_factor_less_one_times_its_compute(monkeypatch):
    model = torch.nn.Linear(200, 200)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    slow_down(model, optimizer, 3.0)
    slept = []
    monkeypatch.setattr("geryon.runtime.straggler.time.sleep", slept.append)
    for _ in range(3):
        started = time.monotonic()
        model(torch.randn(64, 200)).sum().backward()
        optimizer.step()
        elapsed = time.monotonic() - started
        assert 0 < slept[-1] <= 2.0 * elapsed
    assert len(slept) == 3


def _job(sync, iterations, tmp_path=None, extra=()):
    args = ["--local", "--workers", "3", "--sync", sync, *extra]
    if tmp_path is not None:
        args += ["--timeline", str(tmp_path / "trace.json")]
    result = run_launcher(*args, str(SCRIPT), "--iterations", str(iterations), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return [json.loads(line) for line in re.findall(r"RESULT (\{.*\})", result.stdout)]


def test_partial_job_converges_with_equal_replicas_and_atomic_groups(tmp_path):
    full = _job("full", 30)
    partial = _job("partial:2", 45, tmp_path)
    assert len(partial) == 3 and len({r["digest"] for r in partial}) == 1      # replicas end equal
    assert partial[0]["loss"] < full[0]["loss"], (partial[0], full[0])   # below full allreduce's, 1.5x the steps
    spans = [e for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
             if e.get("cat") == "group"]
    by_rank, by_group = {}, {}
    for span in spans:
        by_rank.setdefault(span["pid"], []).append((span["ts"], span["ts"] + span["dur"]))
        by_group.setdefault(span["args"]["seq"], set()).add((span["args"]["members"], span["pid"] - 1))
    assert len(by_rank) == 3
    for intervals in by_rank.values():    # a worker is in one group at a time
        intervals.sort()
        assert all(end <= start for (_, end), (start, _) in zip(intervals, intervals[1:]))
    for seq, records in by_group.items():   # every member recorded the group, with the same members
        members = {m for m, _ in records}
        assert len(members) == 1
        assert sorted(rank for _, rank in records) == [int(m) for m in members.pop().split(",")]


def test_ddp_options_are_refused_under_partial_sync():
    from geryon.runtime.api import distribute

    job = RankEnv(rank=0, world_size=2, secret="s", sync="partial")
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError, match="--sync partial:4 keeps the model unwrapped"):
        distribute(model, torch.optim.SGD(model.parameters(), lr=0.1), job, static_graph=True)
