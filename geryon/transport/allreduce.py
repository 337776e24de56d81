"""Ring allreduce (reduce-scatter then all-gather) over priority flows, bucket by bucket.

Each bucket is split into `world` chunks (`chunk_bounds`); chunk c is owned (ends fully reduced) by
rank (c - 1) mod world. At reduce-scatter step s rank r sends chunk (r - s) to its right neighbour
and adds the chunk (r - s - 1) it receives from its left neighbour; then the owners' chunks travel
once more round the ring (all-gather). Chunks move in slices under the sliced policies, so reduction
and transfer pipeline: each slice is reduced and forwarded by the receiving thread as soon as it
lands. A rank cuts the chunks it starts into pieces of TransportConfig.slice_bytes, or larger where
its link proved fast: about `slice_seconds` at the rate its last bandwidth-bound collective reached
(`piece_bytes`), at most max_slice_bytes and a quarter of the chunk. It queues the pieces of its
own chunk one at a time, each once the one before it is in the kernel, under send keys reserved when
the collective starts (`_own_chunk`): the send order is that of queuing them all, and the first byte
leaves at once. A slice's header carries its offset and length, and the receiver forwards what it
got, so ranks need not cut alike. A reduce-scatter slice lands in that flow's own scratch buffer
(made once, as large as the largest rate-sized piece, and touched when made: `_Inbox`; reused, so
it stays in cache) and is added in place into the bucket; an all-gather slice lands straight in the
bucket. Nothing the size of a bucket is allocated per collective. A call with the
same tensors as an earlier one reuses that call's plan and views (`geryon.transport.prepared`).

CUDA tensors (and CPU tensors when the group is made with `stage_host=True`, which runs the same
pipeline on host buffers) go through `geryon.transport.staging`: a slice is copied into one of the
sending flow's host slots when its turn to be sent comes, every received slice lands in a host slot
of its flow and is added (reduce-scatter) or copied (all-gather) into the bucket on the bucket's
device, on that flow's side stream; the CPU does not add. `wait()` makes the caller's stream wait
for those streams, without synchronising the device.

Send order (`Policy.collective_key`): under the ordering policies (endhost, geryon) a flow's send
queue is ordered by (class, collective, urgency, queuing order), so a slice of an urgent collective
started while an earlier bulk one is in flight leaves before every bulk slice still queued, both the
pieces of this rank's own chunks and the slices it forwards: it overtakes the bulk on every link of
the ring (preemption by slicing). On each link it waits only behind what is past the queue: the
piece being written and what the kernel holds, unsent or unacknowledged, which the credit bounds:
the flows to the right neighbour get a send buffer of one rate-sized piece (`credit_bytes`, about
`slice_seconds` at the link's rate), not the kernel's autotuned megabytes that TCP would let fill
the bottleneck's queue. Under geryon each class has a flow of its own, which the hosts' and
switches' priority queues order; the key orders the collectives that share a flow. The FIFO policies
(vanilla, slicing) send collective after collective. A receiver matches a slice by its header
(collective, bucket, offset), never by its arrival order, and a slice of a collective this rank has
not started yet waits on its flow's receiving thread until the rank starts it. Preemption changes
when a slice moves, never what is added to what: the sums below are the same bits.

Reduction order (deterministic, bit-exact): chunk c is summed along the ring starting at rank c,
    ((x_c + x_{c+1}) + x_{c+2}) + ... + x_{c+world-1}      (indices mod world)
with torch's elementwise add in the tensors' own dtype; `op="avg"` then divides that sum by world
once, at the owner. `reference_allreduce` computes exactly this with plain torch ops.

Every rank must start the same collectives (tensors' sizes, dtypes, priorities) in the same order.
The first call with a new plan exchanges SHA-256 digests of the bucket plan round the ring and
every rank raises ProtocolError when any rank differs. Every data slice carries its bucket's class
and the receiver checks it against its own, so ranks that agree on each plan but start them in
another order (one rank's collective n urgent, its neighbour's bulk) raise ProtocolError too: the
ranks' schedules cannot silently differ.
"""

from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from geryon.errors import ConfigError, ProtocolError
from geryon.transport import elementwise
from geryon.transport.buckets import (Bucket, chunk_bounds, normalize_priorities, pieces,
                                      plan_buckets, plan_digest)
from geryon.transport.config import TransportConfig
from geryon.transport.flows import FlowPool, PoolOwner, next_sequence
from geryon.transport.prepared import PreparedCache, memory_flat, prepare, reusable
from geryon.transport.staging import HostStaging, Marker, StagedSlice, flow_outbox, mark, staging_for
from geryon.transport.wire import Kind, byte_view, dtype_code, encode_control, encode_header

log = logging.getLogger(__name__)

BANDWIDTH_BOUND_SLICES = 16   # a collective moving fewer slice_bytes than this gives no rate
PIECES_PER_CHUNK = 4          # a piece is at most this fraction of a chunk: the ring still pipelines


def piece_bytes(config: TransportConfig, link_rate: float | None, chunk_bytes: float) -> int:
    """Bytes per slice of a chunk this rank starts: `slice_seconds` at `link_rate` (bytes/s, None:
    unknown), within [slice_bytes, max_slice_bytes] and at most chunk_bytes / PIECES_PER_CHUNK
    (never below slice_bytes)."""
    if not link_rate or config.slice_seconds <= 0:
        return config.slice_bytes
    target = min(link_rate * config.slice_seconds, config.max_slice_bytes, chunk_bytes / PIECES_PER_CHUNK)
    return max(config.slice_bytes, int(target))


def credit_bytes(config: TransportConfig, link_rate: float | None) -> int:
    """What a ring flow of an ordering policy may hold in the kernel, unsent or unacknowledged: one
    rate-sized piece (`piece_bytes` of an unbounded chunk), so an urgent slice queued behind it waits
    about one piece per link. The kernel's send buffer (`Flow.bound_send_buffer`) is twice that
    (capped at net.core.wmem_max), so a flow carries twice the credit per round trip: the link's
    rate while the round trip stays under 2 x slice_seconds and the cap is not reached."""
    return piece_bytes(config, link_rate, float("inf"))


@dataclass
class _Inbox:
    """Per receiving flow (used by its receive thread only): where reduce-scatter payloads land, and
    the frame whose payload is being read (looked up once, in `destination`).

    The scratch buffer is made at the first slice, at least `reserve` bytes (the largest piece a
    rate-sized sender cuts, TransportConfig.max_slice_bytes) and zero-filled, so its pages exist
    before any socket read lands in them. A buffer that grew with the pieces was fresh, untouched
    memory at each growth: the first collective with rate-sized pieces (the one after the first of
    a size) took 15-30 ms longer at 1 Gbit/s, 8 x 100 MB, and made this way it does not
    (docs/transport.md). It grows again only for a piece larger than
    `reserve` (unsliced policies).
    """
    reserve: int = 0
    scratch: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.uint8))
    view: memoryview = field(default_factory=lambda: memoryview(bytearray(0)))
    array: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.uint8))   # over `scratch`
    frame: tuple | None = None
    stagings: dict = field(default_factory=dict)   # device -> HostStaging, for staged buckets

    def staging(self, device) -> HostStaging:
        staging = self.stagings.get(device)
        if staging is None:
            staging = self.stagings[device] = staging_for(device, self.reserve)
        return staging

    def landing(self, nbytes: int) -> memoryview:
        if len(self.view) < nbytes:
            self.scratch = torch.zeros(max(nbytes, self.reserve), dtype=torch.uint8)   # touched: see above
            self.view = byte_view(self.scratch)
            self.array = self.scratch.numpy()
        return self.view[:nbytes]


@dataclass
class _BucketRun:
    bucket: Bucket
    acc: torch.Tensor          # flat, the bucket's data; becomes the result
    starts: list[int]
    expect_rs: int
    expect_ag: int
    expect_sent: int
    got_rs: int = 0
    got_ag: int = 0
    sent: int = 0
    counted: bool = False      # already subtracted from the collective's `remaining`
    acc_bytes: memoryview | None = None   # a byte view of `acc`; made here when not given
    staged: bool = False       # slices cross through host slots (geryon.transport.staging)

    def __post_init__(self):
        # made once per collective, not once per slice
        self.dtype_code = dtype_code(self.bucket.dtype)
        if self.acc_bytes is None and not self.staged:
            self.acc_bytes = byte_view(self.acc)

    @cached_property
    def acc_array(self) -> np.ndarray | None:
        """`acc` as a numpy array (None: its dtype is reduced with torch), made at the first slice
        that needs it, on a receiving thread, so starting a collective does not pay for it."""
        return elementwise.array_of(self.acc)

    def slice_of(self, data: memoryview, offset: int, length: int) -> memoryview:
        """Bytes of elements [offset, offset + length) of `acc_bytes`."""
        size = self.bucket.dtype.itemsize
        return data[offset * size:(offset + length) * size]

    @property
    def done(self) -> bool:
        return (self.got_rs == self.expect_rs and self.got_ag == self.expect_ag
                and self.sent == self.expect_sent)


@dataclass
class _Collective:
    seq: int
    runs: list[_BucketRun]
    average: bool
    remaining: int
    link_bytes: float = 0.0     # bytes this rank's ring link carries for it (2 (n-1) / n of the data)
    started: float = field(default_factory=time.monotonic)
    last_progress: float = field(default_factory=time.monotonic)
    start: Marker = None        # staged buckets: the compute stream's work before the collective


class AllreduceWork:
    """Handle of an allreduce in flight; `wait()` returns the reduced tensors (in place)."""

    def __init__(self, group: AllreduceGroup, op: _Collective | None, tensors, finish):
        self._group, self._op, self._tensors, self._finish = group, op, tensors, finish

    def is_completed(self) -> bool:
        """Whether the reduction has ended on this rank: `wait()` would not wait for the network."""
        return self._op is None or self._op.remaining == 0

    def wait(self) -> list[torch.Tensor]:
        if self._op is not None:
            self._group._wait(self._op)
            self._group._join_staging(self._op)
            self._finish()
            self._op = None
        return self._tensors


class AllreduceGroup(PoolOwner):
    """One rank of a ring: `allreduce(tensors, priorities)` sums (or averages) across all ranks.

    `peers[i]` is the (host, port) where rank i listens; this rank listens on its own entry
    (or on `listen`). Priorities: per tensor a class (int, 0 most urgent) or (class, urgency).
    CUDA tensors are staged through host memory (geryon.transport.staging); `stage_host=True`
    stages CPU tensors the same way (the pipeline's CPU form, for tests and the CUDA bench).
    """

    def __init__(self, rank: int, world: int, peers, config: TransportConfig,
                 listen: tuple[str, int] | None = None, stage_host: bool = False):
        if not 0 <= rank < world or len(peers) != world:
            raise ConfigError(f"rank {rank} of world {world} with {len(peers)} peer addresses")
        self.rank, self.world, self.config = rank, world, config
        self.policy = config.scheduling
        self.left, self.right = (rank - 1) % world, (rank + 1) % world
        self._ops: dict[int, _Collective] = {}
        self._next_seq = 0
        self._registered = 0   # collectives below this number have been started here
        self._verified: set[bytes] = set()
        self._digests: dict[int, dict[int, bytes]] = {}
        self._inboxes: dict[object, _Inbox] = {}   # per receiving flow
        self._outboxes: dict[tuple, HostStaging] = {}   # (sending flow, device) -> its staging
        self.stage_host = stage_host
        self._prepared = PreparedCache()
        self.link_rate: float | None = None       # bytes/s of the last bandwidth-bound collective
        self._credit: int | None = None           # the send buffer the flows to the right have now
        self.pool = None
        if world == 1:
            return
        bind = listen or ("0.0.0.0", peers[rank][1])
        self.pool = FlowPool(rank, config, self, listen=bind, peer_label="rank",
                             accept_peers={self.left, self.right})
        if not (world == 2 and rank == 1):
            self.pool.connect(self.right, tuple(peers[self.right]))
        self.pool.wait_connected({self.left, self.right})
        self._bound_credit()

    # -- public API ---------------------------------------------------------------------------
    def allreduce(self, tensors, priorities=None, op: str = "sum") -> list[torch.Tensor]:
        """Reduce `tensors` in place across all ranks and return them. Tensors that require grad
        (parameters) are reduced in place outside autograd, as torch.distributed's collectives do."""
        return self.allreduce_async(tensors, priorities, op).wait()

    def allreduce_async(self, tensors, priorities=None, op: str = "sum") -> AllreduceWork:
        if op not in ("sum", "avg"):
            raise ConfigError(f"allreduce op {op!r}: use 'sum' or 'avg'")
        tensors = list(tensors)
        prepared = self._prepared.get(tensors, priorities, op) if self.world > 1 else None
        if prepared is not None:    # these tensors again: planned, checked and viewed before
            collective = self._start(self._take_seq(), prepared.buckets, prepared.flats, op == "avg",
                                     prepared.views)
            return AllreduceWork(self, collective, tensors, lambda: None)
        prios = normalize_priorities(len(tensors), priorities, self.config.classes)
        buckets = plan_buckets(tensors, prios, self.config.bucket_bytes)
        for bucket in buckets:
            dtype_code(bucket.dtype)
            if op == "avg" and not bucket.dtype.is_floating_point:
                raise ConfigError(f"op='avg' needs floating-point tensors, not {bucket.dtype}")
        reuse = self.world > 1 and not self.stage_host and reusable(tensors, buckets)
        prepared = prepare(tensors, buckets) if reuse else None
        flats = prepared.flats if prepared else [self._flatten(tensors, bucket) for bucket in buckets]

        def finish():
            for bucket, flat in zip(buckets, flats):
                if len(bucket.entries) == 1 and flat.data_ptr() == tensors[bucket.entries[0].index].data_ptr():
                    continue
                for entry in bucket.entries:
                    target = tensors[entry.index].detach()    # parameters too: in place, outside autograd
                    target.copy_(flat[entry.offset:entry.offset + entry.numel].view_as(target))

        if self.world == 1:
            if op == "avg":
                for flat in flats:
                    flat.div_(1)
            return AllreduceWork(self, None, tensors, finish)
        seq = self._take_seq()
        digest = plan_digest(buckets, self.world, self.policy.name)
        if digest not in self._verified:
            self._verify_plan(seq, digest)
        if prepared is not None:    # kept once the ranks have agreed on its plan
            self._prepared.put(tensors, priorities, op, prepared)
        collective = self._start(seq, buckets, flats, op == "avg", prepared.views if prepared else None)
        return AllreduceWork(self, collective, tensors, finish)

    def _take_seq(self) -> int:
        seq = self._next_seq
        self._next_seq += 1
        return seq

    def flow_failed(self, flow, exc) -> None:
        """A neighbour's connection broke: pass the news round the ring (ABORT to the other side)."""
        self.abort_others(flow, exc, f"rank {flow.peer_id} failed ({exc})")

    # -- plan agreement -----------------------------------------------------------------------
    def _verify_plan(self, seq: int, digest: bytes) -> None:
        with self.pool.cond:
            self._digests.setdefault(seq, {})[self.rank] = digest
        self._send_control(seq, self.rank, digest)
        start = time.monotonic()
        self.pool.wait_until(lambda: len(self._digests.get(seq, ())) == self.world,
                             f"bucket-plan digests (collective {seq})", [self.left, self.right],
                             progress=lambda: start)
        with self.pool.cond:
            digests = self._digests.pop(seq)
        if len(set(digests.values())) != 1:
            mine = digests[self.rank]
            differ = sorted(r for r, d in digests.items() if d != mine)
            raise ProtocolError(
                f"ranks disagree on the allreduce bucket plan (collective {seq}): rank {self.rank} "
                f"has {mine.hex()[:12]}, ranks {differ} have another plan; every rank must pass the "
                "same tensors (sizes, dtypes, priorities) in the same order")
        self._verified.add(digest)

    def _send_control(self, seq: int, origin: int, digest: bytes) -> None:
        frame = encode_control(Kind.PLAN, digest, job_id=self.config.job_id, iteration=seq,
                               tensor_id=origin)
        # class -1: ahead of every data slice queued on the flow (see `control`)
        self.pool.flow(self.right, 0, wait=True).send(self.policy.collective_key(seq, -1, 0, next_sequence()),
                                                      frame)

    def control(self, flow, header, payload: bytes) -> None:
        if header.kind != Kind.PLAN or flow.peer_id != self.left or len(payload) != 32 \
                or header.tensor_id >= self.world:
            raise ProtocolError(f"unexpected {header.kind.name} control frame from {flow.name}")
        # Passed on before it is recorded: once this rank holds every digest it may queue the
        # collective's data, and the right neighbour's receiving thread, which waits for this rank's
        # data of a collective it has not started, must find the digest it still lacks ahead of it.
        if header.tensor_id != self.right:
            self._send_control(header.iteration, header.tensor_id, payload)
        with self.pool.cond:
            self._digests.setdefault(header.iteration, {})[header.tensor_id] = payload
            self.pool.cond.notify_all()

    # -- running a collective -----------------------------------------------------------------
    def _flatten(self, tensors, bucket: Bucket) -> torch.Tensor:
        if len(bucket.entries) == 1:
            tensor = tensors[bucket.entries[0].index]
            if tensor.is_contiguous():
                return memory_flat(tensor)
        return torch.cat([tensors[e.index].detach().reshape(-1) for e in bucket.entries])

    def _start(self, seq: int, buckets: list[Bucket], flats, average: bool, views=None) -> _Collective:
        """Register collective `seq` and queue this rank's first pieces. `views[i]`: a byte view of
        `flats[i]` made before (None: made here)."""
        n, r = self.world, self.rank
        runs = []
        for i, (bucket, flat) in enumerate(zip(buckets, flats)):
            bounds = chunk_bounds(bucket.numel, n)
            size = [e - s for s, e in bounds]
            runs.append(_BucketRun(bucket, flat, [s for s, _ in bounds],
                                   expect_rs=bucket.numel - size[r],
                                   expect_ag=bucket.numel - size[(r + 1) % n],
                                   expect_sent=2 * bucket.numel - size[(r + 1) % n] - size[(r + 2) % n],
                                   acc_bytes=views[i] if views is not None else None,
                                   staged=self.stage_host or flat.device.type != "cpu"))
        data = sum(b.numel * b.dtype.itemsize for b in buckets)
        staged = [run.acc.device for run in runs if run.staged]
        collective = _Collective(seq, runs, average, remaining=len(runs), link_bytes=2 * (n - 1) / n * data,
                                 start=mark(staged[0]) if staged else None)
        with self.pool.cond:
            self._ops[seq] = collective
            self._registered = max(self._registered, seq + 1)
            for run in runs:
                self._check_done(collective, run)
            self.pool.cond.notify_all()
        chains = [chain for run in runs if (chain := self._own_chunk(collective, run)) is not None]
        for _, start_chain in sorted(chains, key=lambda chain: chain[0]):
            start_chain()
        return collective

    def _own_chunk(self, collective: _Collective, run: _BucketRun):
        """The pieces of this rank's own chunk of `run`, as a chain: (the first piece's send key, a
        function that queues the first piece); None when the chunk is empty.

        Each piece is queued when the one before it has been handed to the kernel, under a send key
        reserved now. `_start` reserves every run's keys first and starts the chains in key order,
        so the flows send in the order that queuing every piece at once would give (a run's next
        piece is queued by the sender thread before it takes its next frame), but the first byte
        leaves as soon as the first piece is queued. Queuing a 100 MB chunk's hundreds of pieces up
        front held every rank's first byte back by milliseconds of Python at every collective
        (docs/transport.md).
        """
        start, end = self._chunk(run, self.rank)
        spans = pieces(start, end, self._piece(run))
        if not spans:
            return None
        keys = [self._send_key(collective, run) for _ in spans]

        def send(i: int) -> None:
            offset, length = spans[i]
            self._send(collective, run, Kind.REDUCE, offset, length, key=keys[i],
                       then=(lambda: send(i + 1)) if i + 1 < len(spans) else None)

        return keys[0], lambda: send(0)

    def _piece(self, run: _BucketRun) -> int | None:
        if not self.policy.sliced:
            return None
        chunk_bytes = (run.bucket.numel // self.world) * run.bucket.dtype.itemsize
        return max(1, piece_bytes(self.config, self.link_rate, chunk_bytes) // run.bucket.dtype.itemsize)

    def _chunk(self, run: _BucketRun, c: int) -> tuple[int, int]:
        c %= self.world
        end = run.starts[c + 1] if c + 1 < self.world else run.bucket.numel
        return run.starts[c], end

    def _send_key(self, collective: _Collective, run: _BucketRun) -> tuple:
        return self.policy.collective_key(collective.seq, run.bucket.priority, run.bucket.urgency,
                                          next_sequence())

    def _send(self, collective: _Collective, run: _BucketRun, kind: Kind, offset: int, length: int,
              key: tuple | None = None, then=None, after: Marker = None):
        """Queue one piece for the right neighbour (under `key`, else a fresh one); `then()` runs on
        the flow's sender thread once the piece is in the kernel. A staged piece is copied out of the
        bucket once `after` (default: the collective's start) is reached."""
        bucket = run.bucket
        header = encode_header(kind, job_id=self.config.job_id, iteration=collective.seq,
                               tensor_id=bucket.id, offset=offset, length=length,
                               dtype=run.dtype_code, priority=bucket.priority)
        key = key if key is not None else self._send_key(collective, run)

        def sent():
            with self.pool.cond:
                run.sent += length
                collective.last_progress = time.monotonic()
                self._check_done(collective, run)
            if then is not None:
                then()

        flow = self.pool.flow(self.right, self.policy.flow_of(bucket.priority), wait=True)
        if run.staged:
            payload = StagedSlice(self._outbox(flow, run.acc.device), run.acc[offset:offset + length],
                                  after if after is not None else collective.start)
        else:
            payload = run.slice_of(run.acc_bytes, offset, length)
        flow.send(key, header, payload, on_sent=sent)

    def _outbox(self, flow, device) -> HostStaging:
        """The staging `flow`'s sender copies `device` slices through (used by that thread only)."""
        return flow_outbox(self._outboxes, self.pool.cond, flow, device, self.config.max_slice_bytes)

    def _join_staging(self, collective: _Collective) -> None:
        """Order the caller's stream after the device work the receivers queued for `collective`."""
        if collective.start is None and not self.stage_host:
            return
        for inbox in list(self._inboxes.values()):
            for staging in list(inbox.stagings.values()):
                staging.join()

    def _check_done(self, collective: _Collective, run: _BucketRun) -> None:
        # called with pool.cond held
        if run.done and not run.counted:
            run.counted = True
            collective.remaining -= 1
            if collective.remaining == 0:
                self._ops.pop(collective.seq, None)
                # a rate only from a collective long enough to be bandwidth-bound (start-up skew
                # and latency make shorter ones read low, which only keeps the pieces small)
                if collective.link_bytes >= BANDWIDTH_BOUND_SLICES * self.config.slice_bytes:
                    elapsed = time.monotonic() - collective.started
                    if elapsed > 0:
                        self.link_rate = collective.link_bytes / elapsed
                        self._bound_credit()
            self.pool.cond.notify_all()

    def _bound_credit(self) -> None:
        """Give the flows to the right neighbour the send buffer of the current credit (ordering
        policies only: under FIFO nothing overtakes, so the kernel keeps sizing the buffer)."""
        if not self.policy.urgency_order:
            return
        credit = credit_bytes(self.config, self.link_rate)
        if credit == self._credit:
            return
        self._credit = credit
        for index in range(self.pool.flow_count):
            self.pool.flow(self.right, index).bound_send_buffer(credit)

    def _wait(self, collective: _Collective) -> None:
        self.pool.wait_until(lambda: collective.remaining == 0, f"allreduce #{collective.seq}",
                             [self.left, self.right], progress=lambda: collective.last_progress)

    # -- receiving (called from the left neighbour's flow threads) ------------------------------
    def _lookup(self, flow, header) -> tuple[_Collective, _BucketRun, int]:
        if flow.peer_id != self.left:
            raise ProtocolError(f"{flow.name} is not this rank's left neighbour")
        seq = header.iteration
        arrival = time.monotonic()
        self.pool.wait_until(lambda: seq in self._ops or seq < self._registered,
                             f"this rank to start allreduce #{seq} (sent early by rank {self.left})",
                             [], progress=lambda: arrival)
        collective = self._ops.get(seq)
        if collective is None or header.tensor_id >= len(collective.runs):
            raise ProtocolError(f"{header.describe()} from {flow.name} matches no allreduce in flight")
        run = collective.runs[header.tensor_id]
        if header.priority != run.bucket.priority:
            raise ProtocolError(
                f"ranks disagree on the class of allreduce #{seq} bucket {run.bucket.id}: rank {self.left} "
                f"sends it as class {header.priority}, rank {self.rank} has class {run.bucket.priority}; "
                "every rank must start the same collectives, with the same priorities, in the same order")
        if header.dtype != run.bucket.dtype or header.offset + header.length > run.bucket.numel:
            raise ProtocolError(f"{header.describe()} from {flow.name} does not fit bucket "
                                f"{run.bucket.id} ({run.bucket.numel} x {run.bucket.dtype})")
        c = bisect.bisect_right(run.starts, header.offset) - 1
        start, end = self._chunk(run, c)
        if header.offset + header.length > end:
            raise ProtocolError(f"{header.describe()} from {flow.name} crosses a chunk boundary")
        return collective, run, c

    def destination(self, flow, header) -> memoryview:
        collective, run, c = self._lookup(flow, header)
        inbox = self._inboxes.get(flow)
        if inbox is None:
            inbox = self._inboxes[flow] = _Inbox(reserve=self.config.max_slice_bytes)
        if header.kind == Kind.REDUCE and c != self.rank:
            inbox.frame = (collective, run, c)
            if run.staged:
                return inbox.staging(run.acc.device).landing(header.payload_len)
            return inbox.landing(header.payload_len)
        if header.kind == Kind.GATHER and c != (self.rank + 1) % self.world:
            inbox.frame = (collective, run, c)
            if run.staged:
                return inbox.staging(run.acc.device).landing(header.payload_len)
            return run.slice_of(run.acc_bytes, header.offset, header.length)
        raise ProtocolError(f"{header.describe()} from {flow.name} is not expected at rank {self.rank}")

    def delivered(self, flow, header) -> None:
        inbox = self._inboxes[flow]
        (collective, run, c), inbox.frame = inbox.frame, None
        offset, length, n, r = header.offset, header.length, self.world, self.rank
        ready = None
        if header.kind == Kind.REDUCE:
            owner = c == (r + 1) % n
            divisor = n if owner and collective.average else None
            if run.staged:
                ready = inbox.staging(run.acc.device).into(run.acc[offset:offset + length], add=True,
                                                           divisor=divisor, after=collective.start)
            else:
                self._reduce(run, inbox, offset, length, header.payload_len, divisor)
            self._send(collective, run, Kind.GATHER if owner else Kind.REDUCE, offset, length, after=ready)
        else:
            if run.staged:
                ready = inbox.staging(run.acc.device).into(run.acc[offset:offset + length], add=False,
                                                           after=collective.start)
            if c != (r + 2) % n:
                self._send(collective, run, Kind.GATHER, offset, length, after=ready)
        with self.pool.cond:
            if header.kind == Kind.REDUCE:
                run.got_rs += length
            else:
                run.got_ag += length
            if run.got_rs > run.expect_rs or run.got_ag > run.expect_ag:
                raise ProtocolError(f"{flow.name} sent bucket {run.bucket.id} data twice")
            collective.last_progress = time.monotonic()
            self._check_done(collective, run)

    @staticmethod
    def _reduce(run: _BucketRun, inbox: _Inbox, offset: int, length: int, nbytes: int, divisor) -> None:
        """Add the slice in `inbox` (nbytes) into elements [offset, offset + length) of the bucket,
        then divide them by `divisor` (None: no division); numpy where it computes torch's bits."""
        acc = run.acc_array
        if acc is not None:
            target, source = acc[offset:offset + length], inbox.array[:nbytes].view(acc.dtype)
            add, divide = elementwise.add_array_, elementwise.div_array_
        else:
            target, source = run.acc[offset:offset + length], inbox.scratch[:nbytes].view(run.bucket.dtype)
            add, divide = elementwise.add_, elementwise.div_
        add(target, source)
        if divisor is not None:
            divide(target, divisor)


def reference_allreduce(inputs: list[torch.Tensor], op: str = "sum") -> torch.Tensor:
    """The result the ring computes for one flat bucket, with plain torch ops in the same order.

    `inputs[i]` is rank i's flat tensor.
    """
    world = len(inputs)
    out = torch.empty_like(inputs[0])
    for c, (start, end) in enumerate(chunk_bounds(inputs[0].numel(), world)):
        acc = inputs[c][start:end].clone()
        for step in range(1, world):
            acc.add_(inputs[(c + step) % world][start:end])
        if op == "avg":
            acc.div_(world)
        out[start:end] = acc
    return out


def reference_allreduce_tensors(inputs: list[list[torch.Tensor]], priorities=None, op: str = "sum",
                                bucket_bytes: int = TransportConfig.bucket_bytes,
                                classes: int = 8) -> list[torch.Tensor]:
    """Per-tensor results of allreducing `inputs[rank][i]` exactly as AllreduceGroup buckets them."""
    first = inputs[0]
    buckets = plan_buckets(first, normalize_priorities(len(first), priorities, classes), bucket_bytes)
    results = [None] * len(first)
    for bucket in buckets:
        flats = [torch.cat([rank_inputs[e.index].reshape(-1) for e in bucket.entries])
                 for rank_inputs in inputs]
        out = reference_allreduce(flats, op)
        for e in bucket.entries:
            results[e.index] = out[e.offset:e.offset + e.numel].view_as(first[e.index])
    return results
