"""Ring allreduce with collectives of different classes in flight at once.

An urgent collective started while a bulk one is in flight overtakes it on every link under the
ordering policies and waits behind it under the FIFO ones; either way every rank ends with the
reference ring's bits; ranks that start collectives of different classes under one number fail.
"""

import re
import subprocess
import threading
import time

import pytest
import torch

from geryon.errors import ProtocolError, TransportError
from geryon.transport.allreduce import reference_allreduce_tensors
from geryon.transport.config import TransportConfig
from transport_support import serve_world_of_threads

BULK, URGENT = 1, 0          # classes
BUCKET_BYTES = 1 << 16


def random_inputs(world: int, sizes, seed: int) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [[torch.randn(n, generator=generator) for n in sizes] for _ in range(world)]


def assert_exact(results, inputs, priorities, op) -> None:
    want = reference_allreduce_tensors(inputs, priorities, op, BUCKET_BYTES)
    for got in results:
        assert all(torch.equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("world, policy, stage_host", [(3, "endhost", False), (4, "endhost", False),
                                                      (3, "geryon", False), (4, "geryon", False),
                                                      (3, "endhost", True)])
def test_interleaved_classes_stay_bit_exact(world, policy, stage_host):
    """Two bulk collectives and two urgent ones, each urgent one started right behind a bulk one and
    all four in flight at once, in 1 KiB slices: every result is the reference ring's, bit for bit,
    also through the host staging slots that CUDA tensors take (`stage_host`)."""
    config = TransportConfig(secret="t", policy=policy, slice_bytes=1024, max_slice_bytes=1024,
                             bucket_bytes=BUCKET_BYTES, timeout=20)
    calls = [("bulk", (40_000, 3001, 7), [BULK] * 3, "sum"),
             ("urgent", (2000, 5), [URGENT] * 2, "sum"),
             ("bulk", (30_001, 11), [(BULK, 1), (BULK, 0)], "avg"),
             ("urgent", (999,), [URGENT], "avg")]
    inputs = [random_inputs(world, sizes, seed) for seed, (_, sizes, _, _) in enumerate(calls)]

    def body(group):
        mine = [[t.clone() for t in call_inputs[group.rank]] for call_inputs in inputs]
        works = [group.allreduce_async(tensors, priorities, op)
                 for tensors, (_, _, priorities, op) in zip(mine, calls)]
        return [work.wait() for work in reversed(works)][::-1]

    results = serve_world_of_threads(world, config, body, stage_host=stage_host)
    for i, (_, _, priorities, op) in enumerate(calls):
        assert_exact([rank_results[i] for rank_results in results], inputs[i], priorities, op)


@pytest.fixture
def slow_loopback(unique_name):
    """A network namespace whose loopback is rate-limited to 200 Mbit/s (tbf): every ring link shares
    one real bottleneck, so a bulk collective takes a few hundred milliseconds on the wire."""
    netns = f"gy{unique_name}"
    subprocess.run(["ip", "netns", "add", netns], check=True, capture_output=True, timeout=30)
    try:
        for command in (["ip", "-n", netns, "link", "set", "lo", "up"],
                        ["tc", "-n", netns, "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "200mbit",
                         "burst", "128kb", "latency", "20ms"]):
            subprocess.run(command, check=True, capture_output=True, timeout=30)
        yield netns
    finally:
        subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30)


@pytest.mark.timing
@pytest.mark.root
@pytest.mark.parametrize("policy, overtakes", [("endhost", True), ("vanilla", False)])
def test_an_urgent_collective_overtakes_an_earlier_bulk_one_on_every_link(slow_loopback, policy, overtakes):
    """Three ranks on a 200 Mbit/s loopback start a 2 MB bulk collective and, 20 ms later, a 64 KB
    urgent one. Under endhost the urgent one ends on every rank while the bulk one is still running,
    well within half its time (the credit: with the kernel's autotuned send buffers the bulk queued in
    the kernel would hold it back); under vanilla (FIFO: no preemption) it ends only after the bulk.
    Both plans are agreed on in a first round, so the second round measures the data alone."""
    world = 3
    config = TransportConfig(secret="t", policy=policy, slice_bytes=64 * 1024, max_slice_bytes=64 * 1024,
                             bucket_bytes=4 << 20, timeout=20)
    inputs = random_inputs(world, (512 * 1024, 16 * 1024), seed=7)

    def body(group):
        bulk, urgent = ([inputs[group.rank][0].clone()], [inputs[group.rank][1].clone()])
        group.allreduce([t.clone() for t in bulk], [BULK])
        group.allreduce([t.clone() for t in urgent], [URGENT])
        start = time.monotonic()
        bulk_work = group.allreduce_async(bulk, [BULK])
        time.sleep(0.02)                                # bulk slices on every link by now
        urgent_work = group.allreduce_async(urgent, [URGENT])
        urgent_work.wait()
        urgent_done, bulk_running = time.monotonic() - start, not bulk_work.is_completed()
        bulk_work.wait()
        return bulk_running, urgent_done, time.monotonic() - start, bulk[0], urgent[0]

    results = serve_world_of_threads(world, config, body, netns=slow_loopback)
    want = reference_allreduce_tensors(inputs, [BULK, URGENT], "sum", 4 << 20)
    for bulk_running, urgent_done, bulk_done, bulk, urgent in results:
        assert torch.equal(bulk, want[0]) and torch.equal(urgent, want[1])
        assert bulk_running == overtakes
        if overtakes:
            assert urgent_done < bulk_done / 2, (urgent_done, bulk_done)


def test_ranks_that_disagree_on_a_collectives_class_fail():
    """Both plans are agreed on first (their digests differ only by class); then rank 1 starts them in
    the other order, so its collective 2 is urgent where its neighbours' is bulk, and 3 the other way
    round. A rank whose left neighbour disagrees (1 or 2: whichever sees it first; the other may
    see its connection closed first) raises ProtocolError naming the collective (the urgent one may
    arrive first); every rank fails, none hangs."""
    world = 3
    config = TransportConfig(secret="t", policy="endhost", slice_bytes=1024, max_slice_bytes=1024,
                             timeout=10)
    agreed = threading.Barrier(world)

    def body(group):
        a, b = torch.ones(5000), torch.ones(5000)          # same sizes: only the class tells them apart
        group.allreduce([a], [BULK])
        group.allreduce([b], [URGENT])
        agreed.wait()                       # a rank that fails closes its connections: not before all ended
        order = [([a], [BULK]), ([b], [URGENT])]
        if group.rank == 1:
            order.reverse()
        with pytest.raises(TransportError) as caught:
            for work in [group.allreduce_async(tensors, priorities) for tensors, priorities in order]:
                work.wait()
        return caught.value

    errors = serve_world_of_threads(world, config, body)
    assert all(isinstance(error, TransportError) for error in errors)
    named = [rank for rank, error in enumerate(errors) if isinstance(error, ProtocolError)
             and re.search(r"disagree on the class of allreduce #[23] bucket 0", str(error))]
    assert named and set(named) <= {1, 2}
