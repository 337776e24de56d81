"""Staged allreduce: slices cross through bounded host slots per flow and are summed on the bucket's
device (geryon.transport.staging). On CPU the same pipeline runs on host buffers (stage_host=True);
the CUDA tests run it with CUDA tensors (several ranks share one GPU: the flows are TCP)."""

import pytest
import torch

from geryon.errors import ConfigError
from geryon.transport.allreduce import reference_allreduce_tensors
from geryon.transport.config import TransportConfig
from geryon.transport.staging import SLOTS, HostStaging, StagedSlice, staging_for
from transport_support import PRIORITIES, assert_sum_and_avg_exact, serve_world_of_threads, tensor_inputs


def test_host_staging_adds_a_landed_slice_and_divides_in_the_buckets_dtype():
    staging = HostStaging(torch.device("cpu"), reserve=64)
    target = torch.tensor([1.0, 2.0, 3.0])
    landing = staging.landing(3 * 4)
    landing[:] = memoryview(torch.tensor([10.0, 20.0, 30.0]).numpy()).cast("B")
    staging.into(target, add=True, divisor=2)
    assert target.tolist() == [5.5, 11.0, 16.5]
    assert staging.slot_bytes == SLOTS * 64


def _floats(view) -> list[float]:
    return torch.frombuffer(bytearray(view), dtype=torch.float32).tolist()


def test_a_staged_slice_is_copied_into_a_slot_when_the_sender_opens_it():
    """The queued payload holds the device slice; its bytes are copied only at `open` (or `prefetch`),
    so what the bucket holds then is what is sent (device work is ordered by the `after` marker)."""
    staging = HostStaging(torch.device("cpu"), reserve=16)
    source = torch.arange(4, dtype=torch.float32)
    payload = StagedSlice(staging, source[1:3])
    source[1] = 9.0
    sent = payload.open()
    assert len(payload) == 8 and _floats(sent) == [9.0, 2.0]
    assert staging.held() == 1
    payload.close()
    assert staging.held() == 0


def test_a_prefetched_slice_keeps_its_slot_while_a_more_urgent_one_is_sent_first():
    """The sender prefetches the head of its queue while writing; a more urgent frame queued after
    that takes the other slot, and the prefetched bytes are still intact when their turn comes."""
    staging = HostStaging(torch.device("cpu"), reserve=16)
    bucket = torch.arange(8, dtype=torch.float32)
    current, ahead, urgent = (StagedSlice(staging, bucket[i:i + 2]) for i in (0, 2, 4))
    current.open()
    ahead.prefetch()                       # while `current` is written
    assert staging.held() == SLOTS
    urgent.prefetch()                      # no free slot: nothing copied, nothing overwritten
    assert urgent.ticket is None
    current.close()
    assert _floats(urgent.open()) == [4.0, 5.0]
    urgent.close()
    assert _floats(ahead.open()) == [2.0, 3.0]
    ahead.close()
    assert staging.held() == 0


def test_slots_are_reused_round_robin_and_grow_only_for_a_larger_piece():
    staging = HostStaging(torch.device("cpu"), reserve=32)
    staging.landing(16)
    made = [slot.data_ptr() for slot in staging._slots]
    for _ in range(2 * SLOTS):
        staging.landing(16)
    assert staging.slot_bytes == SLOTS * 32 and [slot.data_ptr() for slot in staging._slots] == made
    staging.landing(48)
    assert staging.slot_bytes == 32 * (SLOTS - 1) + 48


def test_staging_for_refuses_devices_it_cannot_carry_and_cuda_without_a_gpu():
    assert isinstance(staging_for(torch.device("cpu"), 8), HostStaging)
    with pytest.raises(ConfigError, match="CPU and CUDA tensors only"):
        staging_for(torch.device("meta"), 8)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            staging_for(torch.device("cuda:0"), 8)


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_staged_allreduce_is_bit_exact_with_the_ring_on_host_buffers(world, dtype):
    assert_sum_and_avg_exact(world, dtype, stage_host=True)


@pytest.mark.parametrize("policy", ["vanilla", "slicing"])
def test_staged_allreduce_is_exact_under_other_policies(policy):
    config = TransportConfig(secret="t", policy=policy, slice_bytes=1024, bucket_bytes=4096)
    inputs = tensor_inputs(3, torch.float32, seed=1)
    results = serve_world_of_threads(
        3, config, lambda g: g.allreduce([t.clone() for t in inputs[g.rank]], PRIORITIES), stage_host=True)
    want = reference_allreduce_tensors(inputs, PRIORITIES, "sum", 4096)
    for got_list in results:
        assert all(torch.equal(g, w) for g, w in zip(got_list, want))


def test_staging_memory_is_made_once_per_flow_and_bounded():
    """Every flow's staging holds SLOTS slots of max_slice_bytes, made at its first slice and the same
    buffers at every later collective: no allocation per slice or per collective."""
    config = TransportConfig(secret="t", slice_bytes=1024, max_slice_bytes=8192, bucket_bytes=1 << 20)
    generator = torch.Generator().manual_seed(5)
    inputs = [[torch.randn(40_000, generator=generator)] for _ in range(4)]

    def buffers(group):
        stagings = [s for inbox in group._inboxes.values() for s in inbox.stagings.values()]
        stagings += list(group._outboxes.values())
        return sorted((slot.data_ptr(), slot.numel()) for s in stagings for slot in s._slots)

    def body(group):
        first = group.allreduce([inputs[group.rank][0].clone()])
        made = buffers(group)
        second = group.allreduce([inputs[group.rank][0].clone()], op="avg")
        return first, second, made, buffers(group)

    want = reference_allreduce_tensors(inputs, None, "sum", 1 << 20)
    want_avg = reference_allreduce_tensors(inputs, None, "avg", 1 << 20)
    for first, second, made, after in serve_world_of_threads(4, config, body, stage_host=True):
        assert torch.equal(first[0], want[0]) and torch.equal(second[0], want_avg[0])
        assert len(made) == 2 * SLOTS                       # one receiving and one sending flow
        assert all(numel == 8192 for _, numel in made)
        assert after == made


@pytest.mark.cuda
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_allreduce_is_bit_exact_with_the_cpu_ring(world, dtype):
    """CUDA buckets: copies through pinned slots on side streams, sums on the GPU; the same bits as
    the ring's reference (torch's elementwise add in the bucket's dtype, in the same order)."""
    config = TransportConfig(secret="t", slice_bytes=1024, bucket_bytes=4096, timeout=60)
    inputs = tensor_inputs(world, dtype)
    device = torch.device("cuda", 0)

    def body(group):
        torch.cuda.set_device(device)
        summed = [t.to(device) for t in inputs[group.rank]]
        group.allreduce(summed, PRIORITIES)
        averaged = [t.to(device) for t in inputs[group.rank]]
        group.allreduce(averaged, PRIORITIES, op="avg")
        torch.cuda.synchronize(device)
        return [t.cpu() for t in summed], [t.cpu() for t in averaged], summed[0].device

    results = serve_world_of_threads(world, config, body)
    want_sum = reference_allreduce_tensors(inputs, PRIORITIES, "sum", 4096)
    want_avg = reference_allreduce_tensors(inputs, PRIORITIES, "avg", 4096)
    for summed, averaged, where in results:
        assert where.type == "cuda"
        assert all(torch.equal(got, want) for got, want in zip(summed, want_sum))
        assert all(torch.equal(got, want) for got, want in zip(averaged, want_avg))


@pytest.mark.cuda
def test_cuda_staging_uses_pinned_slots_and_a_side_stream():
    staging = staging_for(torch.device("cuda", 0), 1024)
    target = torch.ones(4, device="cuda")
    landing = staging.landing(16)
    landing[:] = memoryview(torch.full((4,), 2.0).numpy()).cast("B")
    ready = staging.into(target, add=True)
    staging.join()
    assert all(slot.is_pinned() for slot in staging._slots)
    assert staging.stream != torch.cuda.current_stream()
    assert ready is not None and target.cpu().tolist() == [3.0] * 4
