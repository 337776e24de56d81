"""Ring allreduce on loopback (ranks as threads, real sockets): bit-exact against torch."""

import socket
import warnings

import pytest
import torch

from geryon.errors import ConfigError, ProtocolError
from geryon.transport.allreduce import reference_allreduce_tensors
from geryon.transport.config import TransportConfig
from geryon.transport.flows import TCP_NOTSENT_LOWAT, TCP_RTO_MAX_MS
from transport_support import PRIORITIES, assert_sum_and_avg_exact, serve_world_of_threads, tensor_inputs


@pytest.mark.parametrize("world", [2, 3, 5, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_bit_exact_sum_and_avg(world, dtype):
    assert_sum_and_avg_exact(world, dtype)


@pytest.mark.parametrize("policy", ["vanilla", "slicing", "endhost"])
def test_every_policy_is_exact(policy):
    config = TransportConfig(secret="t", policy=policy, slice_bytes=1024, bucket_bytes=4096)
    inputs = tensor_inputs(3, torch.float32, seed=1)
    results = serve_world_of_threads(
        3, config, lambda g: g.allreduce([t.clone() for t in inputs[g.rank]], PRIORITIES))
    want = reference_allreduce_tensors(inputs, PRIORITIES, "sum", 4096)
    for got_list in results:
        assert all(torch.equal(g, w) for g, w in zip(got_list, want))


def test_matches_plain_sum_for_integers():
    config = TransportConfig(secret="t", slice_bytes=1024)
    inputs = [[torch.arange(1000, dtype=torch.int64) * (r + 1)] for r in range(4)]
    results = serve_world_of_threads(4, config, lambda g: g.allreduce([inputs[g.rank][0].clone()]))
    for (got,) in results:
        assert torch.equal(got, torch.arange(1000, dtype=torch.int64) * 10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.int32, torch.int8,
                                   torch.uint8])
def test_special_values_and_wraparound_are_exact_and_silent(dtype):
    """The reduction runs through numpy for these dtypes: it gives torch's bits for inf - inf, nan,
    overflow to inf and integer wraparound, and raises no numpy warnings (made errors here). A
    float16 NaN's sign depends on where torch's own vectorized loop ends (geryon.transport.elementwise),
    so float16 NaNs are compared as NaNs."""
    config = TransportConfig(secret="t", slice_bytes=1024, bucket_bytes=4096, timeout=20)
    world, generator = 3, torch.Generator().manual_seed(3)
    inputs = []
    for rank in range(world):
        if dtype.is_floating_point:
            values = torch.randn(5000, generator=generator, dtype=torch.float64) * 1e3
            specials = torch.tensor([float("inf"), -float("inf"), float("nan")] * 10)
            values[:30] = specials[torch.randperm(30, generator=generator)]
            values[30:40] = torch.finfo(dtype).max * (1 if rank % 2 else 0.75)
        else:
            info = torch.iinfo(dtype)
            values = torch.randint(info.min, info.max + 1, (5000,), generator=generator, dtype=torch.int64)
        inputs.append([values.to(dtype)])

    def body(group):
        summed = [inputs[group.rank][0].clone()]
        group.allreduce(summed)
        averaged = [inputs[group.rank][0].clone()]
        if dtype.is_floating_point:
            group.allreduce(averaged, op="avg")
        return summed[0], averaged[0]

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        results = serve_world_of_threads(world, config, body)
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    want_sum = reference_allreduce_tensors(inputs, None, "sum", 4096)[0]
    want_avg = reference_allreduce_tensors(inputs, None, "avg", 4096)[0] if dtype.is_floating_point else None
    assert want_sum.isinf().any() or not dtype.is_floating_point
    if dtype == torch.float16:
        want_sum[want_sum.isnan()] = float("nan")
        want_avg[want_avg.isnan()] = float("nan")
    for summed, averaged in results:
        if dtype == torch.float16:
            summed[summed.isnan()] = float("nan")
            averaged[averaged.isnan()] = float("nan")
        assert torch.equal(summed.view(bits), want_sum.view(bits))
        if want_avg is not None:
            assert torch.equal(averaged.view(bits), want_avg.view(bits))


def test_plan_mismatch_fails_clearly_on_every_rank():
    config = TransportConfig(secret="t", timeout=10)

    def body(group):
        size = 100 if group.rank != 1 else 101
        with pytest.raises(ProtocolError, match="disagree on the allreduce bucket plan"):
            group.allreduce([torch.ones(size)])
        return True

    assert serve_world_of_threads(3, config, body) == [True, True, True]


def test_flows_are_marked_per_class():
    config = TransportConfig(secret="t", class_dscp=(46, 26, 0), tcp_congestion="cubic")

    def body(group):
        marks = {}
        for (peer, index), flow in group.pool.flows.items():
            marks[index] = (flow.sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) >> 2,
                            flow.sock.getsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT),
                            flow.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
                            .rstrip(b"\0"))
        return marks

    for marks in serve_world_of_threads(2, config, body):
        assert marks == {0: (46, 128 * 1024, b"cubic"), 1: (26, 128 * 1024, b"cubic"),
                         2: (0, 128 * 1024, b"cubic")}


def _kernel_caps_rto() -> bool:
    with socket.socket() as probe:
        try:
            probe.setsockopt(socket.IPPROTO_TCP, TCP_RTO_MAX_MS, 1000)
        except OSError:
            return False
    return True


@pytest.mark.skipif(not _kernel_caps_rto(), reason="TCP_RTO_MAX_MS needs Linux >= 6.15")
def test_flows_cap_the_retransmission_backoff():
    """After an outage a flow retransmits within rto_max_ms of the link's return, not up to 2x later."""
    def body(group):
        return {flow.sock.getsockopt(socket.IPPROTO_TCP, TCP_RTO_MAX_MS) for flow in group.pool.flows.values()}

    assert serve_world_of_threads(2, TransportConfig(secret="t"), body) == [{1000}, {1000}]
    assert serve_world_of_threads(2, TransportConfig(secret="t", rto_max_ms=5000), body) == [{5000}, {5000}]
    with pytest.raises(ConfigError, match="rto_max_ms"):
        TransportConfig(secret="t", rto_max_ms=10)


def test_piece_bytes_follow_the_link_rate_within_their_bounds():
    """A rank's pieces: slice_bytes until a rate is known or at low rates; `slice_seconds` of the rate
    at high ones, at most max_slice_bytes and a quarter of the chunk; never below slice_bytes."""
    from geryon.transport.allreduce import piece_bytes
    config = TransportConfig(secret="s", slice_bytes=256 * 1024, max_slice_bytes=4 << 20, slice_seconds=0.02)
    chunk = 100 << 20
    assert piece_bytes(config, None, chunk) == 256 * 1024
    assert piece_bytes(config, 12.5e6, chunk) == 256 * 1024           # 100 Mbit/s: 250 KB < slice_bytes
    assert piece_bytes(config, 125e6, chunk) == int(125e6 * 0.02)    # 1 Gbit/s: 2.5 MB
    assert piece_bytes(config, 1.25e9, chunk) == 4 << 20              # 10 Gbit/s: capped
    assert piece_bytes(config, 125e6, 4 << 20) == 1 << 20             # a quarter of a 4 MiB chunk
    assert piece_bytes(config, 125e6, 512 * 1024) == 256 * 1024       # never below slice_bytes
    off = TransportConfig(secret="s", max_slice_bytes=256 * 1024)
    assert piece_bytes(off, 1.25e9, chunk) == 256 * 1024
    assert piece_bytes(TransportConfig(secret="s", slice_seconds=0), 1.25e9, chunk) == 256 * 1024
    with pytest.raises(ConfigError, match="max_slice_bytes"):
        TransportConfig(secret="s", slice_bytes=1 << 20, max_slice_bytes=256 * 1024)
    with pytest.raises(ConfigError, match="slice_seconds"):
        TransportConfig(secret="s", slice_seconds=-1)


def test_ranks_that_cut_their_chunks_differently_still_agree_bit_exactly():
    """Each rank sizes the pieces of the chunks it starts from its own link's rate: here rank r
    pretends a different rate each, so slices of 1, 2, 4 and 8 KiB meet in one ring, and a rank's
    rate is learned from a collective big enough to be bandwidth-bound."""
    config = TransportConfig(secret="t", slice_bytes=1024, max_slice_bytes=8192, slice_seconds=1.0,
                             bucket_bytes=1 << 20)
    generator = torch.Generator().manual_seed(7)
    inputs = [[torch.randn(40_000, generator=generator)] for _ in range(4)]

    def body(group):
        group.link_rate = [None, 2048.0, 4096.0, 1e9][group.rank]
        out = group.allreduce([inputs[group.rank][0].clone()])
        learned = group.link_rate
        again = group.allreduce([inputs[group.rank][0].clone()], op="avg")
        return out, again, learned

    results = serve_world_of_threads(4, config, body)
    want = reference_allreduce_tensors(inputs, None, "sum", 1 << 20)
    want_avg = reference_allreduce_tensors(inputs, None, "avg", 1 << 20)
    for out, again, learned in results:
        assert torch.equal(out[0], want[0]) and torch.equal(again[0], want_avg[0])
        assert learned is not None and learned > 0    # 120 KB per link >= 16 slices of 1 KiB


def test_a_receiving_flow_lands_every_piece_in_one_scratch_buffer_made_and_touched_up_front():
    """The reduce-scatter scratch of a receiving flow is made at its first slice, as large as the
    largest rate-sized piece (max_slice_bytes) and zero-filled, then reused while the pieces grow
    with the learned rate: growing it with them gave the first collective with larger pieces fresh
    memory to land in, 15-30 ms slower at 1 Gbit/s (docs/transport.md).
    Still bit-exact."""
    config = TransportConfig(secret="t", slice_bytes=1024, max_slice_bytes=8192, slice_seconds=1.0,
                             bucket_bytes=1 << 20)
    generator = torch.Generator().manual_seed(11)
    inputs = [[torch.randn(40_000, generator=generator)] for _ in range(4)]

    def scratch_of(group):
        return sorted((inbox.scratch.data_ptr(), inbox.scratch.numel()) for inbox in group._inboxes.values())

    def body(group):
        first = group.allreduce([inputs[group.rank][0].clone()])     # 1 KiB pieces: no rate yet
        made = scratch_of(group)
        group.link_rate = 8192.0                                      # pieces of 8 KiB from now on
        second = group.allreduce([inputs[group.rank][0].clone()])
        return first, second, made, scratch_of(group)

    want = reference_allreduce_tensors(inputs, None, "sum", 1 << 20)
    for first, second, made, after in serve_world_of_threads(4, config, body):
        assert torch.equal(first[0], want[0]) and torch.equal(second[0], want[0])
        assert made and all(numel == 8192 for _, numel in made)
        assert after == made                      # the same buffers: none made for the larger pieces


def test_a_rank_queues_its_own_chunk_piece_by_piece_in_the_order_of_queuing_it_all():
    """A rank's own chunk leaves in pieces, each queued (by the sender thread) once the piece before
    it is in the kernel, so the first byte need not wait for hundreds of pieces to be queued; the
    send keys are reserved up front, so the order on the flow is what queuing them all at once gave:
    the more urgent bucket's pieces first, each bucket's in offset order. Still bit-exact."""
    from geryon.transport.buckets import chunk_bounds, normalize_priorities, plan_buckets
    from geryon.transport.trace import TransferEvent

    events: list[TransferEvent] = []
    config = TransportConfig(secret="t", slice_bytes=1024, max_slice_bytes=1024, bucket_bytes=1 << 15,
                             tracer=events.append)
    priorities = [(0, 5), (0, 1)]            # one class, the second tensor more urgent
    generator = torch.Generator().manual_seed(3)
    inputs = [[torch.randn(8192, generator=generator) for _ in range(2)] for _ in range(2)]
    results = serve_world_of_threads(2, config, lambda g: g.allreduce([t.clone() for t in inputs[g.rank]],
                                                                      priorities))
    want = reference_allreduce_tensors(inputs, priorities, "sum", 1 << 15)
    assert all(torch.equal(got, w) for out in results for got, w in zip(out, want))

    buckets = plan_buckets(inputs[0], normalize_priorities(2, priorities, config.classes), 1 << 15)
    urgent = min(buckets, key=lambda b: b.urgency).id
    own_ends = {b.id: chunk_bounds(b.numel, 2)[0][1] for b in buckets}
    sent_by_rank0 = [e for e in events if e.peer.startswith("rank 1") and e.offset < own_ends[e.tensor_id]]
    starts = [(e.tensor_id, e.offset) for e in sent_by_rank0 if e.kind == "send_start"]
    assert len(starts) == 2 * 16                               # 16 KiB of each bucket in 1 KiB pieces
    assert [b for b, _ in starts] == [urgent] * 16 + [1 - urgent] * 16
    assert all(starts[i][1] < starts[i + 1][1] for i in (*range(15), *range(16, 31)))
    for bucket in (0, 1):
        mine = [e for e in sent_by_rank0 if e.tensor_id == bucket]
        queued = sorted(e.t for e in mine if e.kind == "queued")
        done = sorted(e.t for e in mine if e.kind == "send_done")
        assert all(queued[i + 1] >= done[i] for i in range(15))   # piece i+1 queued after piece i went


def test_continuation_headers_save_36_bytes_a_piece_and_ranks_need_not_agree_on_them():
    """Pieces that continue the one before on their connection go with the 8-byte header; a rank
    with compact_headers off sends full headers, and its neighbours read both. Bit-exact either way."""
    from dataclasses import replace

    from geryon.transport.wire import CONTINUATION_SIZE, HEADER_SIZE

    generator = torch.Generator().manual_seed(11)
    inputs = [[torch.randn(30_000, generator=generator), torch.randn(5, generator=generator)]
              for _ in range(3)]
    want = reference_allreduce_tensors(inputs, PRIORITIES[:2], "sum", 1 << 20)
    config = TransportConfig(secret="t", slice_bytes=1024, max_slice_bytes=1024, bucket_bytes=1 << 20)

    def run(compact_ranks):
        configs = [replace(config, compact_headers=rank in compact_ranks) for rank in range(3)]

        def body(group):
            out = group.allreduce([t.clone() for t in inputs[group.rank]], PRIORITIES[:2])
            return out, sum(flow.bytes_sent for flow in list(group.pool.flows.values()))
        results = serve_world_of_threads(3, configs, body)
        for out, _ in results:
            assert all(torch.equal(got, w) for got, w in zip(out, want))
        return [sent for _, sent in results]

    full, compact, mixed = run(()), run((0, 1, 2)), run((1, 2))
    saved = [f - c for f, c in zip(full, compact)]
    assert all(s > 0 and s % (HEADER_SIZE - CONTINUATION_SIZE) == 0 for s in saved)
    assert mixed[0] == full[0] and all(m < f for m, f in zip(mixed[1:], full[1:]))


def test_parameters_are_reduced_in_place_outside_autograd():
    """Model averaging allreduces parameters (leaves that require grad): a big one in a bucket of its
    own and small ones batched. Both paths write in place without autograd's in-place check."""
    config = TransportConfig(secret="t", slice_bytes=1024, bucket_bytes=4096)
    inputs = tensor_inputs(3, torch.float32, seed=4)

    def body(group):
        params = [torch.nn.Parameter(t.clone()) for t in inputs[group.rank]]
        group.allreduce(params, PRIORITIES, op="avg")
        return [p.detach().clone() for p in params], [p.requires_grad for p in params]

    want = reference_allreduce_tensors(inputs, PRIORITIES, "avg", 4096)
    for got, requires_grad in serve_world_of_threads(3, config, body):
        assert all(torch.equal(g, w) for g, w in zip(got, want))
        assert all(requires_grad)
