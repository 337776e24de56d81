"""Helpers shared by the transport tests."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import torch

from ports import free_ports  # noqa: F401 -- the transport tests take their ports here
from geryon.transport import AllreduceGroup
from geryon.transport.allreduce import reference_allreduce_tensors
from geryon.transport.config import TransportConfig

REPO = Path(__file__).resolve().parents[1]
SIZES = (1, 7, 3001, 1, 10007, 2)   # odd sizes, fewer elements than ranks, buckets and big tensors
PRIORITIES = [0, 1, 1, 0, 1, 0]


def tensor_inputs(world, dtype, seed=0):
    """Per rank, random tensors of SIZES (the same ones for the same seed)."""
    generator = torch.Generator().manual_seed(seed)
    return [[torch.randn(n, generator=generator).to(dtype) for n in SIZES] for _ in range(world)]


def serve_world_of_threads(world: int, config, body, netns: str | None = None, **group_options):
    """Run `body(group)` on `world` AllreduceGroup ranks as threads over loopback sockets; their results.
    `config` is every rank's TransportConfig, or a list of one per rank; `netns`: the network namespace
    whose loopback the ranks use (None: this process's); `group_options` go to every AllreduceGroup
    (stage_host=True, say)."""
    from geryon.netnames import enter_netns

    configs = config if isinstance(config, list) else [config] * world
    host, ports = "127.0.0.1", free_ports(world)
    peers = [(host, p) for p in ports]
    results, errors = [None] * world, [None] * world

    def run(rank):
        try:
            if netns is not None:
                enter_netns(netns)         # this thread only: its sockets live in `netns`
            with AllreduceGroup(rank, world, peers, configs[rank], listen=(host, ports[rank]),
                                **group_options) as group:
                results[rank] = body(group)
        except BaseException as exc:  # noqa: BLE001 -- re-raised in the caller's thread
            errors[rank] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for exc in errors:
        if exc is not None:
            raise exc
    return results


def assert_sum_and_avg_exact(world: int, dtype, **group_options) -> None:
    """A sum and an average over `world` ranks (every AllreduceGroup given `group_options`) match the
    reference ring bit for bit (slices of 1 KiB, buckets of 4 KiB)."""
    config = TransportConfig(secret="t", slice_bytes=1024, bucket_bytes=4096, timeout=20)
    inputs = tensor_inputs(world, dtype)

    def body(group):
        summed = [t.clone() for t in inputs[group.rank]]
        group.allreduce(summed, PRIORITIES)
        averaged = [t.clone() for t in inputs[group.rank]]
        group.allreduce(averaged, PRIORITIES, op="avg")
        return summed, averaged

    results = serve_world_of_threads(world, config, body, **group_options)
    want_sum = reference_allreduce_tensors(inputs, PRIORITIES, "sum", 4096)
    want_avg = reference_allreduce_tensors(inputs, PRIORITIES, "avg", 4096)
    for summed, averaged in results:
        assert all(torch.equal(got, want) for got, want in zip(summed, want_sum))
        assert all(torch.equal(got, want) for got, want in zip(averaged, want_avg))


def run_ps_workers(servers, workers: int, params, open_worker, work):
    """Run `work(rank, worker, local)` on `workers` threads, each with its own copy `local` of `params`
    and `open_worker(rank, addresses, local)` (a PS worker of the started `servers`); their results.
    The servers are closed at the end."""
    addresses = [("127.0.0.1", s.port) for s in servers]
    results, errors = [None] * workers, []

    def run(rank):
        try:
            local = [p.detach().clone() for p in params]
            with open_worker(rank, addresses, local) as worker:
                results[rank] = work(rank, worker, local)
        except BaseException as exc:  # noqa: BLE001 -- re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(workers)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        for s in servers:
            s.close()
    if errors:
        raise errors[0]
    return results


def step_workers_exactly(workers, reference, grad: float, lr: float, step=None) -> None:
    """One synchronous PS step of `workers` (every one pushes `grad` everywhere, then pulls), checked bit
    for bit against `reference` stepped by plain SGD with `lr` (one server, lr on the mean gradient)."""
    for worker in workers:
        worker.push([torch.full_like(p, grad) for p in worker.params])
    for worker in workers:
        worker.iteration += 1
        worker.pull(worker.iteration)
    for worker in workers:
        worker.wait_all()
    for ref in reference:
        ref.add_(torch.full_like(ref, grad), alpha=-lr)
    for worker in workers:
        assert all(torch.equal(p, r) for p, r in zip(worker.params, reference)), step


def run_rank_scripts(script, world: int, *args) -> list[dict]:
    """Run `python script RANK WORLD *args` for every rank at once (this repository first on
    PYTHONPATH); each rank's last stdout line, read as JSON. A rank that fails fails the test."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    procs = [subprocess.Popen([sys.executable, str(script), str(rank), str(world), *map(str, args)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=path)) for rank in range(world)]
    reports = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err[-3000:]
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return reports
