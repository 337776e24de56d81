"""Group reduce: average one flat tensor among any subgroup of the workers, over priority flows.

Partial allreduce (geryon.runtime.partial_sync) averages the model of a few workers at a time, and
which few changes from one reduce to the next, so a fixed ring (geryon.transport.allreduce) does not
fit. Every worker keeps one FlowPool connected to every other worker (a mesh: rank i dials the
ranks above it), and a group reduce has each member send its whole flat tensor to every other
member; each member then sums the members' tensors in rank order and divides by the group's size.
The sum order is the same on every member, so every member ends with the same bits.

A group reduce is named by a sequence number the group generator gives it (`seq`, unique within
the job); frames carry it as the header's iteration. A frame for a reduce this rank has not started
yet lands in a buffer made for it on arrival. The flat tensor is cut into class ranges
(`class_bounds`: the elements of class c are [bounds[c], bounds[c + 1])); each range travels on its
class's flow (DSCP as in allreduce mode), in pieces of TransportConfig.slice_bytes.

A member that dies or stalls makes every other member's wait raise the transport's error naming it
(the pool's timeout), as in allreduce mode; the first failure is passed on to the other peers.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from geryon.errors import ConfigError, ProtocolError
from geryon.transport.buckets import pieces
from geryon.transport.config import TransportConfig
from geryon.transport.flows import FlowPool, PoolOwner, next_sequence
from geryon.transport.wire import Kind, byte_view, dtype_code, encode_header

log = logging.getLogger(__name__)


@dataclass
class _Incoming:
    """What one member sent for one group reduce: the landing buffer and how much has landed."""
    data: torch.Tensor
    view: memoryview
    got: int = 0


@dataclass
class _Reduce:
    """A group reduce this rank takes part in (its own sends) or has received data for."""
    incoming: dict[int, _Incoming] = field(default_factory=dict)
    sent: int = 0
    last_progress: float = field(default_factory=time.monotonic)


class GroupReduce(PoolOwner):
    """One worker of a mesh: `average(seq, members, flat)` averages `flat` among `members` in place.

    `peers[i]` is the (host, port) where worker i listens; `numel` and `dtype` are those of the
    flat tensor every call passes (the same on every worker).
    """

    def __init__(self, rank: int, world: int, peers, config: TransportConfig, numel: int,
                 dtype: torch.dtype, listen: tuple[str, int] | None = None):
        if not 0 <= rank < world or len(peers) != world:
            raise ConfigError(f"rank {rank} of world {world} with {len(peers)} peer addresses")
        if not dtype.is_floating_point:
            raise ConfigError(f"a group average needs a floating-point tensor, not {dtype}")
        self.rank, self.world, self.config = rank, world, config
        self.numel, self.dtype, self.dtype_code = numel, dtype, dtype_code(dtype)
        self.policy = config.scheduling
        self._reduces: dict[int, _Reduce] = {}
        self._inflight: dict[object, tuple[_Incoming, int, int]] = {}   # per flow: frame being read
        self.pool = None
        if world == 1:
            return
        others = set(range(world)) - {rank}
        self.pool = FlowPool(rank, config, self, listen=listen or ("0.0.0.0", peers[rank][1]),
                             peer_label="rank", accept_peers={p for p in others if p < rank})
        for peer in sorted(p for p in others if p > rank):
            self.pool.connect(peer, tuple(peers[peer]))
        self.pool.wait_connected(others)

    # -- public API ---------------------------------------------------------------------------
    def average(self, seq: int, members, flat: torch.Tensor, class_bounds=None,
                divide: bool = True) -> torch.Tensor:
        """Average `flat` (1-D, `numel` x `dtype`) among `members` (ranks, this one included) in
        place and return it (with `divide` False: their sum). `class_bounds`: where each priority
        class's elements start, plus the end (None: everything in class 0)."""
        members, seq = sorted(set(members)), seq & 0xFFFFFFFF   # the header's iteration field
        if self.rank not in members:
            raise ConfigError(f"rank {self.rank} asked to reduce in group {members} it is not in")
        if flat.dim() != 1 or flat.numel() != self.numel or flat.dtype != self.dtype:
            raise ConfigError(f"group reduce of a {tuple(flat.shape)} {flat.dtype} tensor; this mesh "
                              f"carries {self.numel} x {self.dtype}")
        if len(members) == 1:
            return flat
        others = [m for m in members if m != self.rank]
        bounds = list(class_bounds) if class_bounds is not None else [0, self.numel]
        flat = flat.contiguous()
        send_view = byte_view(flat)
        with self.pool.cond:
            reduce = self._reduces.setdefault(seq, _Reduce())
            for peer in others:
                self._incoming(reduce, peer)
        expect_sent = self._send_all(seq, reduce, others, flat, send_view, bounds)
        self.pool.wait_until(
            lambda: reduce.sent == expect_sent and all(reduce.incoming[p].got == self.numel for p in others),
            f"group reduce #{seq} among ranks {members}", others, progress=lambda: reduce.last_progress)
        with self.pool.cond:
            self._reduces.pop(seq, None)
        total = None
        for member in members:   # rank order on every member: the same bits everywhere
            part = flat if member == self.rank else reduce.incoming[member].data
            total = part.clone() if total is None else total.add_(part)
        flat.copy_(total.div_(len(members)) if divide else total)
        return flat

    def flow_failed(self, flow, exc) -> None:
        """A peer's connection broke: tell the other peers (ABORT), so none waits out its timeout."""
        self.abort_others(flow, exc, f"rank {flow.peer_id} failed ({exc})")

    # -- sending ------------------------------------------------------------------------------
    def _send_all(self, seq: int, reduce: _Reduce, others, flat, view: memoryview, bounds) -> int:
        """Queue `flat` for every other member, class range by class range; the elements to send."""
        itemsize = flat.element_size()
        piece = max(1, self.config.slice_bytes // itemsize)
        total = 0
        for priority, (start, end) in enumerate(zip(bounds, bounds[1:])):
            spans = pieces(start, end, piece)
            for peer in others:
                flow = self.pool.flow(peer, self.policy.flow_of(priority), wait=True)
                for offset, length in spans:
                    header = encode_header(Kind.REDUCE, job_id=self.config.job_id, iteration=seq,
                                           offset=offset, length=length, dtype=self.dtype_code,
                                           priority=priority)
                    key = self.policy.send_key(seq, priority, 0, next_sequence())
                    flow.send(key, header, view[offset * itemsize:(offset + length) * itemsize],
                              on_sent=self._on_sent(reduce, length))
                    total += length
        return total

    def _on_sent(self, reduce: _Reduce, length: int):
        def sent():
            with self.pool.cond:
                reduce.sent += length
                reduce.last_progress = time.monotonic()
                self.pool.cond.notify_all()
        return sent

    # -- receiving (called from the peers' flow threads) ---------------------------------------
    def _incoming(self, reduce: _Reduce, peer: int) -> _Incoming:
        # called with pool.cond held
        incoming = reduce.incoming.get(peer)
        if incoming is None:
            data = torch.empty(self.numel, dtype=self.dtype)
            incoming = reduce.incoming[peer] = _Incoming(data, byte_view(data))
        return incoming

    def tensor_numel(self, tensor_id: int) -> int | None:
        return self.numel if tensor_id == 0 else None

    def destination(self, flow, header) -> memoryview:
        if header.kind != Kind.REDUCE or header.dtype != self.dtype:
            raise ProtocolError(f"{header.describe()} from {flow.name} is not a group-reduce piece")
        with self.pool.cond:
            reduce = self._reduces.setdefault(header.iteration, _Reduce())
            incoming = self._incoming(reduce, flow.peer_id)
        itemsize = self.dtype.itemsize
        self._inflight[flow] = (reduce, incoming, header.length)
        return incoming.view[header.offset * itemsize:(header.offset + header.length) * itemsize]

    def delivered(self, flow, header) -> None:
        reduce, incoming, length = self._inflight.pop(flow)
        with self.pool.cond:
            incoming.got += length
            if incoming.got > self.numel:
                raise ProtocolError(f"{flow.name} sent group reduce #{header.iteration} data twice")
            reduce.last_progress = time.monotonic()
            self.pool.cond.notify_all()

    def control(self, flow, header, payload: bytes) -> None:
        raise ProtocolError(f"unexpected {header.kind.name} control frame from {flow.name}")
