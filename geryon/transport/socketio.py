"""Whole-frame reads and writes on a blocking socket: exact reads into caller buffers, vectored writes,
and `FrameReader`, a flow's receive side (full and continuation headers, bytes read ahead carried).

A read of a frame's header may wait indefinitely (an idle peer is normal) only when the caller says
so; once a frame has started, its bytes must keep arriving: a peer silent for the socket timeout in
the middle of a frame (header, continuation header or payload) is named in a PeerTimeout, cut within
the timeout of its last byte plus the time to notice. A peer that keeps sending, however slowly, is
not a stall. End of stream is a TransportError naming the peer.

Two ways to time out. During the handshake, Python's socket timeout (settimeout: a poll() before every
recv/send). Once a plain TCP flow runs, `use_kernel_timeouts` makes the socket blocking with the
kernel's SO_RCVTIMEO/SO_SNDTIMEO instead: one syscall per call, and a payload is read with
MSG_WAITALL, so a 256 KiB slice is one recv_into (one wake-up of the thread) instead of one per
arriving burst, and a send blocks in the kernel until the whole slice is queued (docs/transport.md).
A kernel timeout shows as BlockingIOError (EAGAIN) and is reported exactly like socket.timeout.
The kernel bounds a whole MSG_WAITALL call by the timeout, progress or not: a call that returns part of
what it asked for ran into the timeout with bytes that arrived at some point inside it. The rest of the
read then waits only for what is left of the timeout since the last byte arrived (TCP_INFO's
last_data_recv), not a whole timeout more: a stall mid-payload is cut after one timeout, not two.
"""

from __future__ import annotations

import select
import socket
import struct
import time

from geryon.errors import PeerClosed, PeerTimeout, ProtocolError, TransportError
from geryon.transport.wire import (CONTINUATION_SIZE, CONTINUATION_TAG, CONTROL_KINDS, HEADER_SIZE,
                                   MAX_CONTROL_PAYLOAD, Header, decode_continuation, decode_header)


_TIMEVAL = struct.Struct("@ll")
_TCP_INFO_LAST_DATA_RECV = struct.Struct("=I")   # ms since data last arrived, at this offset in Linux's
_TCP_INFO_LAST_DATA_RECV_AT = 52                 # struct tcp_info (unchanged since Linux 2.6)


def use_kernel_timeouts(sock, seconds: float) -> bool:
    """Make a plain TCP socket blocking with `seconds` as the kernel's send and receive timeouts.

    Returns False (and sets Python's timeout instead) for anything else, e.g. a TLS wrapper, which
    does its own I/O on the socket beneath and expects socket.timeout from it.
    """
    if type(sock) is not socket.socket:
        sock.settimeout(seconds)
        return False
    whole = int(seconds)
    value = _TIMEVAL.pack(whole, int(round((seconds - whole) * 1e6)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
    sock.settimeout(None)
    return True


def timeout_of(sock) -> float:
    """The socket's timeout in seconds: Python's, else the kernel's receive timeout."""
    timeout = sock.gettimeout()
    if timeout is None:
        whole, micro = _TIMEVAL.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _TIMEVAL.size))
        timeout = whole + micro / 1e6
    return timeout


def read_exact_into(sock: socket.socket, view: memoryview, peer: str,
                    deadline: float | None = None) -> None:
    """Fill `view` from the socket; each recv must progress within the socket's timeout.

    With a `deadline` (time.monotonic()), the whole read must also end by then: a peer that trickles
    one byte at a time cannot hold the read open (the handshake uses this).
    """
    filled, total = 0, len(view)
    # blocking plain socket (use_kernel_timeouts): the kernel fills the whole view, waking us once
    flags = socket.MSG_WAITALL if deadline is None and type(sock) is socket.socket \
        and sock.gettimeout() is None else 0
    while filled < total:
        try:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout
                sock.settimeout(left)
            if flags and filled:            # the last call ran into the kernel's timeout part-way
                _wait_rest_of_timeout(sock)
            if flags:
                got = sock.recv_into(view[filled:], total - filled, flags)
            else:                           # a TLS wrapper's recv_into takes no flags
                got = sock.recv_into(view[filled:], total - filled)
        except (socket.timeout, BlockingIOError):
            if deadline is not None:
                raise PeerTimeout(f"{peer} did not complete its frame before the deadline "
                                  f"({filled} of {total} bytes)") from None
            raise PeerTimeout(f"{peer} sent nothing for {timeout_of(sock):g} s in the middle of a "
                              "frame; it stalled or the network is cut") from None
        except OSError as exc:
            raise TransportError(f"connection to {peer} failed: {exc}") from None
        if got == 0:
            raise TransportError(f"{peer} closed the connection "
                                 f"({filled} of {total} bytes of a frame read)")
        filled += got


def _wait_rest_of_timeout(sock: socket.socket) -> None:
    """Wait until the socket is readable, at most the kernel timeout less the time since data last
    arrived; raise socket.timeout when it is not. Called after a MSG_WAITALL recv returned part of what
    it asked for: that call waited out the whole timeout, while the peer's last byte came at some point
    inside it, so another whole timeout would let a stall last up to twice the timeout."""
    timeout = timeout_of(sock)
    if timeout <= 0:                      # no kernel timeout: the call was interrupted by a signal
        return
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LAST_DATA_RECV_AT + 4)
        silent = _TCP_INFO_LAST_DATA_RECV.unpack_from(info, _TCP_INFO_LAST_DATA_RECV_AT)[0] / 1000
    except (OSError, struct.error):
        silent = 0.0                      # not TCP: wait a whole timeout from now
    readable = select.poll()
    readable.register(sock, select.POLLIN)
    if not readable.poll(max(0, int((timeout - silent) * 1000))):
        raise socket.timeout


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


class FrameReader:
    """The receive side of one connection: its frames' headers (full or continuation) and payloads.

    A header is read with one recv of up to HEADER_SIZE bytes (as many as have arrived). When the
    frame is a continuation (8 bytes), the bytes past its header already belong to its payload, or,
    after a payload shorter than that, to the next frame: they are carried over and handed out first,
    never lost. The last data frame's Header is kept to rebuild the next continuation from.
    """

    def __init__(self, sock: socket.socket, peer: str, *, job_id: int, max_payload: int,
                 tensor_numel=None):
        self.sock, self.peer = sock, peer
        self.job_id, self.max_payload, self.tensor_numel = job_id, max_payload, tensor_numel
        self.buffer = bytearray(HEADER_SIZE)
        self.view = memoryview(self.buffer)
        self.have = 0                    # bytes of the stream read ahead, at the buffer's start
        self.previous: Header | None = None
        self.header_size = 0             # wire size of the last header read

    def next_header(self, wait_start) -> Header | None:
        """The next frame's validated header. `wait_start(view)` waits for the frame's first bytes
        (an idle peer is fine) and returns how many it read into `view`, 0 when the flow closes
        (then this returns None)."""
        if not self.have:
            self.have = wait_start(self.view)
            if not self.have:
                return None
        self._fill(len(CONTINUATION_TAG))
        size = CONTINUATION_SIZE if self.buffer[:len(CONTINUATION_TAG)] == CONTINUATION_TAG else HEADER_SIZE
        self._fill(size)
        if size == HEADER_SIZE:
            header = decode_header(self.view[:size], job_id=self.job_id, max_payload=self.max_payload,
                                   tensor_numel=self.tensor_numel)
        else:
            header = decode_continuation(self.view[:size], self.previous, max_payload=self.max_payload,
                                         tensor_numel=self.tensor_numel)
        self._consume(size)
        self.header_size = size
        if header.kind not in CONTROL_KINDS:
            self.previous = header
        return header

    def read_into(self, destination: memoryview) -> None:
        """Fill `destination` with the stream's next bytes: the carried ones, then the socket's."""
        carried = min(self.have, len(destination))
        if carried:
            destination[:carried] = self.view[:carried]
            self._consume(carried)
        if carried < len(destination):
            read_exact_into(self.sock, destination[carried:], self.peer)

    def read_control(self, header: Header) -> bytes:
        """The short payload of a control frame (validated to be ≤ MAX_CONTROL_PAYLOAD)."""
        if header.payload_len > MAX_CONTROL_PAYLOAD:
            raise ProtocolError(f"control frame of {header.payload_len} bytes from {self.peer}")
        buffer = bytearray(header.payload_len)
        self.read_into(memoryview(buffer))
        return bytes(buffer)

    def _fill(self, size: int) -> None:
        if self.have < size:            # the frame has started: each read must progress in time
            read_exact_into(self.sock, self.view[self.have:size], self.peer)
            self.have = size

    def _consume(self, size: int) -> None:
        self.buffer[:self.have - size] = self.buffer[size:self.have]
        self.have -= size


def write_all(sock: socket.socket, buffers: list, peer: str) -> None:
    """Write every buffer in order with as few syscalls as possible (sendmsg, no joining copies)."""
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    while views:
        try:
            sent = sock.sendmsg(views)
        except (socket.timeout, BlockingIOError):
            raise PeerTimeout(f"{peer} accepted no data for {timeout_of(sock):g} s; "
                              "it stalled or the network is cut") from None
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise PeerClosed(f"sending to {peer} failed: {exc}") from None
        except OSError as exc:
            raise TransportError(f"sending to {peer} failed: {exc}") from None
        while sent:
            if sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0
