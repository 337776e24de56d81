"""Staging: how a tensor that does not live in host memory (a CUDA tensor) crosses the flows.

Sockets read and write host memory, so every slice of a GPU bucket passes through a host buffer:

  sending    a `StagedSlice` is the queued payload that stands for a slice of a device bucket. The
             flow's sender thread opens it when its turn comes (the copy into one of the flow's
             host slots, waited for), and before writing those bytes starts the copy of the frame
             now at the head of its queue into the other slot (`prefetch`), so that copy runs
             while this slice is on the wire; it closes the slice once written, freeing its slot.
  receiving  the flow's receive thread lands a slice in a host slot (`landing`), then issues its
             copy to the device and the add (or plain copy) into the bucket there (`into`); the
             copy runs on a side stream while the next slice arrives in the other slot. A slot is
             reused only once its copy to the device has finished.

Slots are allocated once per flow and direction, `SLOTS` of them, each the flow's largest piece
(TransportConfig.max_slice_bytes; larger only for an unsliced policy's piece), so staging memory is
bounded and never allocated per slice. Device work is ordered with events: a `Marker` recorded on
the compute stream when a collective starts gates every copy out of and into its buckets, the
marker `into` returns gates a forward of that slice, and `join` makes the compute stream wait for
a flow's side stream before the result is used (the device is not synchronised).

`HostStaging` is the implementation for CPU tensors (plain host buffers, copies that finish at
once, markers that are None); it runs the same pipeline, so tests exercise it on any machine.
`CudaStaging` differs only in where the buffers live (pinned host memory, a device scratch) and
how copies are issued (asynchronously, on the flow's own CUDA stream). The sum a receiver makes is
torch's elementwise add in the bucket's dtype, on the bucket's device: the same bits in the same
order as the CPU ring (geryon.transport.allreduce).
"""

from __future__ import annotations

import torch

from geryon.errors import ConfigError
from geryon.transport import elementwise

SLOTS = 2   # per flow and direction: one slice in flight on the device while the next crosses the wire

Marker = object   # a torch.cuda.Event on CUDA, None on the host: "the device work before it is done"


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().reshape(-1).view(torch.uint8)


class HostStaging:
    """Staging for CPU tensors: the slots are plain host buffers and every copy is done on return."""

    def __init__(self, device: torch.device, reserve: int):
        self.device = torch.device(device)
        self.reserve = reserve
        self._slots: list[torch.Tensor] = []
        self._gates: list[Marker] = []      # receiving: per slot, the device work that reads it
        self._owners: list[object] = []     # sending: per slot, the StagedSlice it holds until closed
        self._next = 0

    # -- buffers -------------------------------------------------------------------------------
    def _host_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.zeros(nbytes, dtype=torch.uint8)   # touched: its pages exist before a socket read

    def _make_slots(self, nbytes: int) -> None:
        if not self._slots:
            self._slots = [self._host_buffer(max(nbytes, self.reserve)) for _ in range(SLOTS)]
            self._gates = [None] * SLOTS
            self._owners = [None] * SLOTS

    def _fit(self, index: int, nbytes: int) -> torch.Tensor:
        if self._slots[index].numel() < nbytes:     # an unsliced policy's piece: grow this slot once
            self._slots[index] = self._host_buffer(nbytes)
        return self._slots[index]

    def _slot(self, nbytes: int) -> tuple[int, torch.Tensor]:
        """The next slot in turn, at least `nbytes`, once the device work that read it is done."""
        self._make_slots(nbytes)
        index, self._next = self._next, (self._next + 1) % SLOTS
        self.wait(self._gates[index])
        self._gates[index] = None
        return index, self._fit(index, nbytes)

    @property
    def slot_bytes(self) -> int:
        """Host bytes this staging holds (SLOTS slots once used, 0 before)."""
        return sum(slot.numel() for slot in self._slots)

    # -- the device side (overridden on CUDA) ------------------------------------------------------
    def wait(self, marker: Marker) -> None:
        """Block this thread until the device work before `marker` is done."""

    def join(self) -> None:
        """Make the caller's (compute) stream wait for everything this staging queued."""

    def _copy(self, target: torch.Tensor, source: torch.Tensor, after: Marker) -> None:
        target.copy_(source)

    def _reduce(self, target: torch.Tensor, source: torch.Tensor, add: bool, divisor, after: Marker) -> Marker:
        if add:
            elementwise.add_(target, source)
        else:
            target.copy_(source)
        if divisor is not None:
            elementwise.div_(target, divisor)
        return None

    # -- the pipeline --------------------------------------------------------------------------
    def begin(self, piece: StagedSlice) -> bool:
        """Start copying `piece` into a free slot (one no other piece holds), once its `after` is
        reached; False, copying nothing, when every slot is held."""
        self._make_slots(piece.nbytes)
        free = [i for i, owner in enumerate(self._owners) if owner is None]
        if not free:
            return False
        index = free[0]
        slot = self._fit(index, piece.nbytes)
        self._copy(slot[:piece.nbytes], _bytes(piece.source), piece.after)
        self._owners[index] = piece
        piece.ticket = (index, self._ready_marker())
        return True

    def open(self, piece: StagedSlice) -> memoryview:
        """`piece`'s bytes in its slot (copied now if `begin` was not called), ready to write."""
        if piece.ticket is None and not self.begin(piece):
            raise RuntimeError("every staging slot of this flow is held: a slice was prefetched and "
                               "never sent")
        index, ready = piece.ticket
        self.wait(ready)
        return memoryview(self._slots[index][:piece.nbytes].numpy()).cast("B")

    def close(self, piece: StagedSlice) -> None:
        """`piece` was written: its slot is free again."""
        if piece.ticket is not None:
            self._owners[piece.ticket[0]] = None
            piece.ticket = None

    def held(self) -> int:
        """Slots a piece holds (copied or being written, not yet closed)."""
        return sum(owner is not None for owner in self._owners)

    def _ready_marker(self) -> Marker:
        return None

    def landing(self, nbytes: int) -> memoryview:
        """Host bytes for the next slice to land in (the slot whose copy to the device is done)."""
        index, slot = self._slot(nbytes)
        self._landed = (index, nbytes)
        return memoryview(slot[:nbytes].numpy()).cast("B")

    def into(self, target: torch.Tensor, *, add: bool, divisor=None, after: Marker = None) -> Marker:
        """Put the slice that just landed into `target` (on this device, its dtype and size): add it
        (or copy it) there, then divide by `divisor` (None: not). Returns the marker after which
        `target` holds the result; the slot is reused once that work is done."""
        index, nbytes = self._landed
        source = self._slots[index][:nbytes].view(target.dtype)
        if source.numel() != target.numel():
            raise ConfigError(f"a staged slice of {source.numel()} elements into {target.numel()}")
        done = self._reduce(target, source, add, divisor, after)
        self._gates[index] = done
        return done


class CudaStaging(HostStaging):
    """Staging for one CUDA device: pinned host slots, a device scratch, and a side stream."""

    def __init__(self, device: torch.device, reserve: int):
        super().__init__(device, reserve)
        self.stream = torch.cuda.Stream(device=self.device)
        self._scratch = torch.empty(0, dtype=torch.uint8, device=self.device)
        self._last: torch.cuda.Event | None = None

    def _host_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.zeros(nbytes, dtype=torch.uint8).pin_memory()

    def _event(self) -> torch.cuda.Event:
        event = torch.cuda.Event()
        event.record(self.stream)
        self._last = event
        return event

    def wait(self, marker: Marker) -> None:
        if marker is not None:
            marker.synchronize()

    def join(self) -> None:
        torch.cuda.current_stream(self.device).wait_stream(self.stream)

    def _copy(self, target: torch.Tensor, source: torch.Tensor, after: Marker) -> None:
        with torch.cuda.stream(self.stream):
            if after is not None:
                self.stream.wait_event(after)
            target.copy_(source, non_blocking=True)
            source.record_stream(self.stream)

    def _ready_marker(self) -> Marker:
        return self._event()

    def _reduce(self, target: torch.Tensor, source: torch.Tensor, add: bool, divisor, after: Marker) -> Marker:
        nbytes = source.numel() * source.element_size()
        if self._scratch.numel() < nbytes:
            # made on the side stream and kept: later slices reuse it in stream order
            with torch.cuda.stream(self.stream):
                self._scratch = torch.empty(max(nbytes, self.reserve), dtype=torch.uint8, device=self.device)
        with torch.cuda.stream(self.stream):
            if after is not None:
                self.stream.wait_event(after)
            staged = self._scratch[:nbytes].view(target.dtype)
            staged.copy_(source, non_blocking=True)
            if add:
                target.add_(staged)
            else:
                target.copy_(staged)
            if divisor is not None:
                target.div_(divisor)
            target.record_stream(self.stream)
        return self._event()


def mark(device: torch.device) -> Marker:
    """A marker of the work queued so far on the caller's current stream of `device` (None: CPU)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


def flow_outbox(outboxes: dict, lock, flow, device, reserve: int) -> HostStaging:
    """The staging `flow`'s sender copies `device` tensors through: made once per (flow, device) in
    `outboxes` under `lock`, then used by that flow's sending thread only."""
    with lock:
        staging = outboxes.get((flow, device))
        if staging is None:
            staging = outboxes[(flow, device)] = staging_for(device, reserve)
    return staging


def staging_for(device: torch.device, reserve: int) -> HostStaging:
    """The staging for tensors on `device`, with slots of at least `reserve` bytes."""
    device = torch.device(device)
    if device.type == "cpu":
        return HostStaging(device, reserve)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"tensors on {device} but this process sees no CUDA device")
        return CudaStaging(device, reserve)
    raise ConfigError(f"tensors on {device}: geryon's flows carry CPU and CUDA tensors only")


class StagedSlice:
    """A queued payload standing for `source` (a slice of a device bucket), copied into a slot of
    `staging` once `after` is reached. Only the sending flow's thread calls its methods: `prefetch`
    (start the copy early, while the frame before is written), `open` (the bytes to write) and
    `close` (written: the slot is free)."""

    __slots__ = ("staging", "source", "after", "nbytes", "ticket")

    def __init__(self, staging: HostStaging, source: torch.Tensor, after: Marker = None):
        self.staging, self.source, self.after = staging, source, after
        self.nbytes = source.numel() * source.element_size()
        self.ticket: tuple[int, Marker] | None = None    # (slot, copy done) once begun

    def __len__(self) -> int:
        return self.nbytes

    def prefetch(self) -> None:
        if self.ticket is None:
            self.staging.begin(self)

    def open(self) -> memoryview:
        return self.staging.open(self)

    def close(self) -> None:
        self.staging.close(self)
