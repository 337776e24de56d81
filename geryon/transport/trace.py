"""Transfer tracing: one TransferEvent per step of a data slice's life, handed to a user callback.

Set `TransportConfig(tracer=callback)`; the flows then call `callback(event)` for every data frame
(PS pushes and parameters, allreduce reduce-scatter and all-gather slices; control frames are not
traced):

    queued      the slice entered its class's send queue      (caller's thread)
    send_start  the sender thread starts writing it            (the flow's sender thread)
    send_done   the last byte was handed to the kernel         (the flow's sender thread)
    recv_done   the slice was fully received into its tensor   (the flow's receiver thread)

The callback runs on transport threads while they wait: keep it short (append to a list, put on a
queue). An exception it raises is logged (once) and dropped, never breaks the transfer. With
`tracer=None` (the default) the flows only test one attribute per frame.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from geryon.transport.wire import CONTROL_KINDS, HEADER

log = logging.getLogger(__name__)

EVENT_KINDS = ("queued", "send_start", "send_done", "recv_done")


@dataclass(frozen=True)
class TransferEvent:
    """One step of one slice: `offset` in elements of the tensor's dtype, `nbytes` of payload.

    `peer` names the other end ("rank 1 at 10.0.0.2:29500"), `cls` is the slice's priority class
    (0 most urgent), `flow` labels the connection (peer and flow index), `tensor_id` is the PS
    tensor index or the allreduce bucket id, `iteration` the PS iteration or allreduce collective
    number, `t` is `time.time()`.
    """
    kind: str
    peer: str
    cls: int
    flow: str
    tensor_id: int
    offset: int
    nbytes: int
    t: float
    iteration: int


Tracer = Callable[[TransferEvent], None]


def emit_from_header(tracer: Tracer, kind: str, peer: str, flow: str, header: bytes) -> None:
    """Emit an event for a packed frame header (sending side); control frames are skipped."""
    (_, _, message, _, priority, _, iteration, tensor_id, offset, _,
     payload_len) = HEADER.unpack_from(header)
    if message in CONTROL_KINDS:
        return
    _call(tracer, TransferEvent(kind, peer, priority, flow, tensor_id, offset, payload_len,
                                time.time(), iteration))


def emit_received(tracer: Tracer, peer: str, flow: str, header) -> None:
    """Emit recv_done for a decoded data-frame Header (receiving side)."""
    _call(tracer, TransferEvent("recv_done", peer, header.priority, flow, header.tensor_id,
                                header.offset, header.payload_len, time.time(), header.iteration))


_failed_tracers: set[int] = set()


def _call(tracer: Tracer, event: TransferEvent) -> None:
    try:
        tracer(event)
    except Exception:  # noqa: BLE001 -- a broken tracer must not break training
        if id(tracer) not in _failed_tracers:   # once per tracer, not once per slice
            _failed_tracers.add(id(tracer))
            log.exception("transfer tracer %r failed on %s (further failures not logged)",
                          tracer, event)


__all__ = ["EVENT_KINDS", "Tracer", "TransferEvent", "emit_from_header", "emit_received"]
