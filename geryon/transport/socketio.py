"""Whole-frame reads and writes on a blocking socket: exact reads into caller buffers, vectored writes.

A read of a frame's header may wait indefinitely (an idle peer is normal) only when the caller says
so; once a frame has started, every read must make progress within the socket timeout, otherwise
the peer is named in a PeerTimeout. End of stream is a TransportError naming the peer.
"""

from __future__ import annotations

import socket
import time

from geryon.errors import PeerTimeout, ProtocolError, TransportError
from geryon.transport.wire import HEADER_SIZE, MAX_CONTROL_PAYLOAD, Header, decode_header


def read_exact_into(sock: socket.socket, view: memoryview, peer: str,
                    deadline: float | None = None) -> None:
    """Fill `view` from the socket; each recv must progress within the socket's timeout.

    With a `deadline` (time.monotonic()), the whole read must also end by then: a peer that trickles
    one byte at a time cannot hold the read open (the handshake uses this).
    """
    filled, total = 0, len(view)
    while filled < total:
        try:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout
                sock.settimeout(left)
            got = sock.recv_into(view[filled:], total - filled)
        except socket.timeout:
            if deadline is not None:
                raise PeerTimeout(f"{peer} did not complete its frame before the deadline "
                                  f"({filled} of {total} bytes)") from None
            raise PeerTimeout(f"{peer} sent nothing for {sock.gettimeout():g} s in the middle of a "
                              "frame; it stalled or the network is cut") from None
        except OSError as exc:
            raise TransportError(f"connection to {peer} failed: {exc}") from None
        if got == 0:
            raise TransportError(f"{peer} closed the connection "
                                 f"({filled} of {total} bytes of a frame read)")
        filled += got


def read_header(sock: socket.socket, buffer: bytearray, peer: str, *, job_id: int,
                max_payload: int, tensor_numel=None, deadline: float | None = None) -> Header:
    """Read and validate the next header into `buffer` (HEADER_SIZE bytes)."""
    read_exact_into(sock, memoryview(buffer)[:HEADER_SIZE], peer, deadline)
    return decode_header(buffer, job_id=job_id, max_payload=max_payload, tensor_numel=tensor_numel)


def read_control_payload(sock: socket.socket, header: Header, peer: str,
                         deadline: float | None = None) -> bytes:
    """Read the short payload of a control frame (validated to be ≤ MAX_CONTROL_PAYLOAD)."""
    if header.payload_len > MAX_CONTROL_PAYLOAD:
        raise ProtocolError(f"control frame of {header.payload_len} bytes from {peer}")
    buffer = bytearray(header.payload_len)
    read_exact_into(sock, memoryview(buffer), peer, deadline)
    return bytes(buffer)


def write_all(sock: socket.socket, buffers: list, peer: str) -> None:
    """Write every buffer in order with as few syscalls as possible (sendmsg, no joining copies)."""
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    while views:
        try:
            sent = sock.sendmsg(views)
        except socket.timeout:
            raise PeerTimeout(f"{peer} accepted no data for {sock.gettimeout():g} s; "
                              "it stalled or the network is cut") from None
        except OSError as exc:
            raise TransportError(f"sending to {peer} failed: {exc}") from None
        while sent:
            if sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0
