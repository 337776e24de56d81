"""Flows: authenticated TCP connections to peers, one per priority class (or one per peer).

A FlowPool owns a listening socket and every connection of one rank. Each connection (a Flow) is
marked with its class's DSCP (IP_TOS / IPV6_TCLASS) and SO_PRIORITY, optionally its own congestion
control, TCP_NOTSENT_LOWAT (so the kernel does not absorb the priority queue) and TCP_NODELAY. Each
flow has a sender thread draining a priority-ordered send queue and a receiver thread that reads
headers, asks the pool's handler for the destination view, and `recv_into`s the payload there. A
payload is bytes (a view of host memory), or a `StagedSlice` of a device tensor that the sender
copies into host memory when its turn comes (geryon.transport.staging).

The handler (allreduce, PS, the priority bench) is a `FlowHandler`:
    destination(flow, header) -> memoryview   (raise ProtocolError to reject the frame)
    delivered(flow, header)                   (payload is in place)
    control(flow, header, payload)            (PLAN / PULL frames)
and optionally tensor_numel(tensor_id) -> int | None (validates data frames early), flow_failed(flow,
exc) and peer_left(flow). Owners read the pool's state through its methods (`departed`, `lost`, `flow`,
`wait_until`, ...) and share its condition `cond` for their own state; nothing else reads its fields.
A frame that fails validation closes that connection with a logged reason; the pool records the
failure per peer so that every wait on that peer raises a TransportError naming it.

When is a peer gone (`departed`, `lost`, `has_left`)? By default when any of its connections fails or
says goodbye: every flow of an allreduce ring carries the collective. With `peer_flow=k` only the end of
the peer's flow k is the peer's end; the end of any other connection under its id (a malformed frame,
a stall, a close, a BYE) costs only that connection, and a new connection under its id clears its
record only on flow k. A parameter server passes 0, a worker's control flow (PLAN, PULL and STEP
frames), which it dials first: one bad spare connection under a worker's id cannot make the server
think that worker is gone.

Before authentication nobody is trusted: a listener runs at most MAX_PENDING_HANDSHAKES handshakes at
once and MAX_PENDING_PER_SOURCE from one address, each with one deadline for the whole exchange; an
accept() error (out of descriptors or buffers) is retried, never ends the listener. A dialer whose
handshake is dropped retries with backoff until the timeout. A (peer, class) slot is reserved before
ACCEPT, so a duplicate is refused with a REJECT; a slot whose peer said BYE can be taken again.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import logging
import os
import select
import socket
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

from geryon.errors import AuthenticationError, PeerAborted, PeerClosed, PeerTimeout, ProtocolError, TransportError
from geryon.transport.config import TransportConfig
from geryon.transport.handshake import dial_handshake, listen_handshake
from geryon.transport.socketio import FrameReader, use_kernel_timeouts, write_all
from geryon.transport.staging import StagedSlice
from geryon.transport.tls import secure
from geryon.transport.trace import emit_from_header, emit_received
from geryon.transport.wire import (CONTROL_KINDS, HEADER_SIZE, MAX_CONTROL_PAYLOAD, HeaderCompressor, Kind,
                                   encode_control)

log = logging.getLogger(__name__)

SO_PRIORITY = getattr(socket, "SO_PRIORITY", 12)
TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", 13)
TCP_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", 25)
TCP_RTO_MAX_MS = 44             # linux/tcp.h since 6.15; older kernels answer ENOPROTOOPT and keep 120 s
TCP_RTO_MIN_US = 45             # linux/tcp.h since 6.15; older kernels answer ENOPROTOOPT and keep 200 ms
MAX_PENDING_HANDSHAKES = 64
MAX_PENDING_PER_SOURCE = 8      # handshakes at once from one address: one host cannot fill the slots
HANDSHAKE_TIMEOUT_S = 10.0      # the whole handshake (not each read), capped by the config's timeout
SLOT_WAIT_S = 1.0               # how long a dialer for a busy slot waits for the old connection to end
_ACCEPT_RETRY_S = 0.1           # after accept() failed for lack of descriptors or buffers
PEER_LAST_WORDS_S = 0.5         # a send that found the peer gone waits this long for what it said last
_DIAL_BACKOFF_S = (0.05, 1.0)   # first and longest pause between handshake attempts
_POLL = 0.2


def socket_options(config: TransportConfig, flow: int, family: int) -> list[tuple[int, int, object]]:
    """The (level, option, value) list applied to a flow's socket, built as plain data.

    IP_TOS goes before SO_PRIORITY because Linux derives the socket priority from the TOS.
    """
    dscp = config.flow_dscp(flow)
    flows = config.scheduling.flows(config.classes)
    so_priority = 6 - (6 * flow) // max(flows - 1, 1) if flows > 1 else 0
    if family == socket.AF_INET6:
        options = [(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, dscp << 2)]
    else:
        options = [(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)]
    options += [(socket.SOL_SOCKET, SO_PRIORITY, so_priority),
                (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
    if config.notsent_lowat:
        options.append((socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT, config.notsent_lowat))
    if config.tcp_congestion:
        options.append((socket.IPPROTO_TCP, TCP_CONGESTION, config.tcp_congestion.encode()))
    return options


def apply_socket_options(sock: socket.socket, options, rto_max_ms: int | None = None,
                         rto_min_us: int | None = None) -> None:
    """Sets `options` (a failure is an error) and, best effort, the retransmission timeout's bounds."""
    for level, option, value in options:
        try:
            sock.setsockopt(level, option, value)
        except OSError as exc:
            raise TransportError(f"cannot set socket option {option} to {value!r}: {exc}") from None
    if rto_max_ms is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, TCP_RTO_MAX_MS, rto_max_ms)
        except OSError:
            pass                # kernel before 6.15: outages cost up to twice their length, still correct
    if rto_min_us is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, TCP_RTO_MIN_US, rto_min_us)
        except OSError:
            pass                # kernel before 6.15: a tail loss under incast waits 200 ms, still correct


def tcp_sockets() -> set[int]:
    """Inode numbers of this process's open TCP sockets (for `cap_retransmission_backoff`'s `skip`)."""
    inodes = set()
    for inode, sock in _tcp_sockets():
        sock.close()
        inodes.add(inode)
    return inodes


def cap_retransmission_backoff(rto_max_ms: int, skip=frozenset()) -> int:
    """Cap TCP's retransmission backoff (TCP_RTO_MAX_MS) on this process's TCP sockets but those whose
    inode is in `skip` (sockets that were open before, e.g. the user's own); returns how many it capped.

    For connections geryon does not open itself, torch.distributed's gloo pairs: without the cap each
    outage of a flapping link doubles their retransmission timeout (200 ms up to 120 s), and one that
    has backed off to several seconds holds every collective on it that long after the link is back.
    Best effort: a kernel before 6.15 has no such option and keeps its backoff.
    """
    capped = 0
    for inode, sock in _tcp_sockets():
        with sock:
            if inode in skip:
                continue
            try:
                sock.setsockopt(socket.IPPROTO_TCP, TCP_RTO_MAX_MS, rto_max_ms)
                capped += 1
            except OSError:
                pass
    return capped


def _tcp_sockets():
    """(inode, a duplicate socket object) for each open TCP socket of this process; the caller closes it."""
    for name in os.listdir("/proc/self/fd"):
        try:
            status = os.fstat(int(name))
            if not stat.S_ISSOCK(status.st_mode):
                continue
            duplicate = os.dup(int(name))              # closing it leaves the owner's socket open
        except (ValueError, OSError):
            continue                                   # closed meanwhile (or the listing's own fd)
        try:
            sock = socket.socket(fileno=duplicate)
        except OSError:
            os.close(duplicate)
            continue
        inode = status.st_ino
        if sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6):
            yield inode, sock
        else:
            sock.close()


@dataclass(order=True)
class _Queued:
    key: tuple
    header: bytes = field(compare=False)
    payload: object = field(compare=False)
    on_sent: object = field(compare=False)


class SendQueue:
    """A blocking priority queue of frames (smallest key first); unbounded count, payloads are views."""

    def __init__(self):
        self._heap: list[_Queued] = []
        self._cond = threading.Condition()
        self._closed = False

    def put(self, item: _Queued) -> None:
        with self._cond:
            heapq.heappush(self._heap, item)
            self._cond.notify()

    def get(self) -> _Queued | None:
        with self._cond:
            while not self._heap and not self._closed:
                self._cond.wait()
            return heapq.heappop(self._heap) if self._heap and not self._closed else None

    def head_payload(self):
        """The payload of the frame that `get` would return next (None: the queue is empty)."""
        with self._cond:
            return self._heap[0].payload if self._heap else None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify_all()


class Flow:
    """One authenticated TCP connection to a peer carrying one flow index (class)."""

    def __init__(self, pool: FlowPool, sock: socket.socket, peer_id: int, index: int, name: str):
        self.pool, self.sock, self.peer_id, self.index, self.name = pool, sock, peer_id, index, name
        self.queue = SendQueue()
        self.closing = False
        self.peer_done = False
        self.bytes_received = 0
        self.bytes_sent = 0
        self._readable: select.poll | None = None     # set by start() for a plain blocking socket
        self._poll_ms = max(1, int(pool.config.timeout * 1000))   # how often that wait looks at `closing`
        self._receiving_done = threading.Event()
        self._threads = [threading.Thread(target=self._send_loop, name=f"gy-send-{name}", daemon=True),
                         threading.Thread(target=self._recv_loop, name=f"gy-recv-{name}", daemon=True)]

    def start(self) -> None:
        if use_kernel_timeouts(self.sock, self.pool.config.timeout):
            self._readable = select.poll()
            self._readable.register(self.sock, select.POLLIN)
        for thread in self._threads:
            thread.start()

    def send(self, key: tuple, header: bytes, payload=b"", on_sent=None) -> None:
        tracer = self.pool.config.tracer
        if tracer is not None:
            emit_from_header(tracer, "queued", self.peer, self.name, header)
        self.queue.put(_Queued(key, header, payload, on_sent))

    def bound_send_buffer(self, nbytes: int) -> None:
        """Hold at most about `nbytes` in the kernel for this connection, unsent or unacknowledged
        (SO_SNDBUF: the kernel doubles it for its bookkeeping and caps it at net.core.wmem_max); the
        kernel's autotuning of the buffer ends. A closed connection is left alone."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, nbytes)
        except OSError as exc:
            if not self.closing:
                raise TransportError(f"cannot bound the send buffer of {self.name}: {exc}") from None

    @property
    def peer(self) -> str:
        return self.pool.peer_name(self.peer_id)

    @property
    def active(self) -> bool:
        """Open and the peer has not said goodbye: its slot is taken."""
        return not self.closing and not self.peer_done

    def close(self) -> None:
        self.closing = True
        self.queue.close()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def join(self, timeout: float) -> None:
        """Wait for this flow's threads to end (never joins the calling thread)."""
        for thread in self._threads:
            if thread is not threading.current_thread() and thread.is_alive():
                thread.join(timeout)

    def _set_class_cpu_priority(self) -> None:
        """Give this thread its class's CPU priority (best effort; see TransportConfig): the first flow's
        real-time at max(1, `thread_rt_priority` - index), else `class_thread_nice` x index nicer."""
        config, tid = self.pool.config, threading.get_native_id()
        try:
            if config.thread_rt_priority:
                rt = max(1, config.thread_rt_priority - self.index)
                os.sched_setscheduler(tid, os.SCHED_RR, os.sched_param(rt))
                return
            nice = config.class_thread_nice * self.index
            if nice > 0:
                os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
        except OSError:
            pass

    def _send_loop(self) -> None:
        tracer = self.pool.config.tracer
        headers = HeaderCompressor(self.pool.config.compact_headers)
        self._set_class_cpu_priority()
        try:
            while (item := self.queue.get()) is not None:
                if tracer is not None:
                    emit_from_header(tracer, "send_start", self.peer, self.name, item.header)
                header = headers.wire_header(item.header)
                staged = isinstance(item.payload, StagedSlice)
                payload = item.payload.open() if staged else item.payload
                if staged:      # the next staged slice is copied while this one is written
                    following = self.queue.head_payload()
                    if isinstance(following, StagedSlice):
                        following.prefetch()
                write_all(self.sock, [header, payload], self.name)
                if staged:
                    item.payload.close()
                if tracer is not None:
                    emit_from_header(tracer, "send_done", self.peer, self.name, item.header)
                self.bytes_sent += len(header) + len(payload)
                if item.on_sent is not None:
                    item.on_sent()
        except Exception as exc:  # noqa: BLE001 -- any failure ends this flow, reported to waiters
            if isinstance(exc, PeerClosed):
                # what the peer said before it closed (an ABORT naming the rank that failed) is still
                # readable: the receiving thread reports it, if it comes, rather than this broken pipe
                self._receiving_done.wait(PEER_LAST_WORDS_S)
            self._fail(exc)

    def _recv_loop(self) -> None:
        self._set_class_cpu_priority()
        config, handler = self.pool.config, self.pool.handler
        frames = FrameReader(self.sock, self.name, job_id=config.job_id, max_payload=config.max_payload,
                             tensor_numel=getattr(handler, "tensor_numel", None))
        tracer = config.tracer
        try:
            while not self.closing:
                header = frames.next_header(self._wait_header_start)
                if header is None:
                    return
                if header.kind == Kind.BYE:
                    self.peer_done = True   # it sends no more; we may still send our own BYE
                    self.pool.peer_left(self)
                    return
                if header.kind == Kind.ABORT:
                    reason = frames.read_control(header).decode(errors="replace")
                    raise PeerAborted(f"{self.name} aborted the job: {reason}", reason)
                if header.kind in CONTROL_KINDS:
                    handler.control(self, header, frames.read_control(header))
                    continue
                destination = handler.destination(self, header)
                if len(destination) != header.payload_len:
                    raise ProtocolError(f"{header.describe()} does not fit its destination")
                frames.read_into(destination)
                self.bytes_received += frames.header_size + header.payload_len
                if tracer is not None:
                    emit_received(tracer, self.peer, self.name, header)
                handler.delivered(self, header)
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
        finally:
            self._receiving_done.set()

    def _wait_header_start(self, view: memoryview) -> int:
        """Wait, without a deadline (an idle peer is fine), for a header to start; 0 when closing.

        Returns how many header bytes it read: as many as had arrived, so one recv per frame, not two.
        On a plain socket a header that has not arrived is waited for in poll(): a thread blocked in
        recv() is also woken each time ACKs free send-buffer space (reader and writer share the socket's
        wait queue), while poll() for readability sleeps through those (docs/transport.md).
        """
        readable = self._readable
        while not self.closing:
            try:
                if readable is not None:
                    got = self.sock.recv_into(view, HEADER_SIZE, socket.MSG_DONTWAIT)
                else:                       # a TLS wrapper's recv_into takes no flags
                    got = self.sock.recv_into(view, HEADER_SIZE)
            except (socket.timeout, BlockingIOError):
                if readable is not None:
                    readable.poll(self._poll_ms)
                continue
            except OSError as exc:
                if self.closing:
                    return 0
                raise TransportError(f"connection to {self.name} failed: {exc}") from None
            if got == 0:
                if self.closing:
                    return 0
                raise TransportError(f"{self.name} closed the connection (process exited or killed)")
            return got
        return 0

    def _fail(self, exc: Exception) -> None:
        if self.closing:
            return
        if not isinstance(exc, TransportError):
            exc = TransportError(f"flow to {self.name} failed: {exc!r}")
        log.warning("closing connection to %s: %s", self.name, exc)
        self.pool.record_failure(self, exc)   # first: a sender that finds this flow closed learns why
        self.close()
        self.pool.flow_failed(self, exc)


class FlowHandler(Protocol):
    """What the owner of a FlowPool implements; see the module docstring for the optional hooks."""

    def destination(self, flow: "Flow", header) -> memoryview:
        """Where a data frame's payload goes (raise ProtocolError to reject the frame)."""

    def delivered(self, flow: "Flow", header) -> None:
        """A data frame's payload is in place."""

    def control(self, flow: "Flow", header, payload: bytes) -> None:
        """A control frame (PLAN, PULL, ...) arrived."""


class FlowPool:
    """All flows of one rank: listens, dials, authenticates, and records per-peer failures."""

    def __init__(self, my_id: int, config: TransportConfig, handler: FlowHandler, *,
                 listen: tuple[str, int] | None = ("0.0.0.0", 0), peer_label: str = "rank",
                 accept_peers=None, peer_flow: int | None = None):
        self.my_id, self.config, self.handler, self.peer_label = my_id, config, handler, peer_label
        self.accept_peers = accept_peers          # None: any authenticated id; else a set of ids
        self.peer_flow = peer_flow                # whose end is the peer's end (None: any flow's)
        self.flows: dict[tuple[int, int], Flow] = {}
        self.failures: dict[int, TransportError] = {}   # in the order the peers failed
        self.left: set[int] = set()
        self._aborts: list[tuple[Flow, threading.Event]] = []   # ABORT frames sent, and when out
        self.addresses: dict[int, str] = {}
        self.cond = threading.Condition()
        self.closed = False
        self._pending = threading.BoundedSemaphore(MAX_PENDING_HANDSHAKES)
        self._pending_from: dict[str, int] = {}   # handshakes in progress per source address
        self._reserved: set[tuple[int, int]] = set()   # slots of dialers being told ACCEPT
        self.listener = None
        self._accept_thread: threading.Thread | None = None
        if isinstance(handler, PoolOwner):
            # a peer's first frame may reach the owner's callbacks (on the accept and receive threads)
            # before this constructor has returned and the owner has assigned its pool
            handler.pool = self
        if listen is not None:
            family = socket.AF_INET6 if ":" in listen[0] else socket.AF_INET
            self.listener = socket.socket(family, socket.SOCK_STREAM)
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.listener.bind(listen)
            self.listener.listen(128)
            self._accept_thread = threading.Thread(target=self._accept_loop, name=f"gy-accept-{my_id}",
                                                   daemon=True)
            self._accept_thread.start()

    def is_peer_flow(self, flow: Flow) -> bool:
        """Whether `flow`'s end (failure, close, goodbye) is its peer's end (see the module docstring)."""
        return self.peer_flow is None or flow.index == self.peer_flow

    def departed(self) -> set[int]:
        """Peers that said goodbye or failed."""
        with self.cond:
            return self.left | set(self.failures)

    def other_flows_up(self, flow: Flow) -> bool:
        """Another connection of `flow`'s peer is open and not said goodbye."""
        with self.cond:
            return any(other is not flow and other.active
                       for (peer, _index), other in self.flows.items() if peer == flow.peer_id)

    def has_left(self, peer_id: int) -> bool:
        """The peer said goodbye."""
        with self.cond:
            return peer_id in self.left

    def lost(self) -> dict[int, TransportError]:
        """Peers that failed, with their failure."""
        with self.cond:
            return dict(self.failures)

    @property
    def flow_count(self) -> int:
        return self.config.scheduling.flows(self.config.classes)

    @property
    def port(self) -> int:
        return self.listener.getsockname()[1]

    def peer_name(self, peer_id: int, index: int | None = None) -> str:
        where = f" at {self.addresses[peer_id]}" if peer_id in self.addresses else ""
        flow = f" (flow {index})" if index is not None else ""
        return f"{self.peer_label} {peer_id}{where}{flow}"

    # -- establishing connections -------------------------------------------------------------
    @property
    def handshake_timeout(self) -> float:
        """Half the transport timeout (at most HANDSHAKE_TIMEOUT_S): a dialer dropped because a flood
        held the slots has time to retry once the flood's handshakes expire."""
        return min(self.config.timeout / 2, HANDSHAKE_TIMEOUT_S)

    def connect(self, peer_id: int, address: tuple[str, int]) -> None:
        """Dial every flow to a peer, retrying until the timeout while it is not listening yet or
        drops the handshake (a listener busy with a flood of unauthenticated clients does)."""
        self.addresses[peer_id] = f"{address[0]}:{address[1]}"
        for index in range(self.flow_count):
            name = self.peer_name(peer_id, index)
            deadline = time.monotonic() + self.config.start_timeout
            pause = _DIAL_BACKOFF_S[0]
            while True:
                sock = self._dial(address, index, name, deadline)
                try:
                    timeout = max(0.1, min(self.handshake_timeout, deadline - time.monotonic()))
                    sock = secure(sock, self.config, False, name, timeout)   # TLS under --tls
                    dial_handshake(sock, name, secret=self.config.secret, job_id=self.config.job_id,
                                   my_id=self.my_id, class_index=index, expected_listener=peer_id,
                                   timeout=timeout)
                    break
                except (AuthenticationError, ProtocolError):
                    sock.close()
                    raise                       # a definite answer: retrying cannot change it
                except TransportError as exc:   # dropped or stalled before the answer
                    sock.close()
                    if time.monotonic() + pause >= deadline:
                        raise PeerTimeout(f"no handshake with {name} within {self.config.start_timeout:g} s "
                                          f"(last attempt: {exc})") from None
                    log.info("handshake with %s dropped (%s); retrying in %.2f s", name, exc, pause)
                    time.sleep(pause)
                    pause = min(pause * 2, _DIAL_BACKOFF_S[1])
                except Exception:
                    sock.close()
                    raise
            self._register(sock, peer_id, index, name)

    def _dial(self, address, index, name, deadline: float) -> socket.socket:
        """A TCP connection to `address`, retried while refused until `deadline` (monotonic)."""
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        while True:
            sock = socket.socket(family, socket.SOCK_STREAM)
            apply_socket_options(sock, socket_options(self.config, index, family), self.config.rto_max_ms,
                                 self.config.rto_min_us)
            sock.settimeout(max(0.1, min(self.config.timeout, deadline - time.monotonic())))
            try:
                sock.connect(address)
                return sock
            except (ConnectionRefusedError, socket.timeout, OSError) as exc:
                sock.close()
                if time.monotonic() >= deadline:
                    raise PeerTimeout(f"cannot connect to {name}: {exc} "
                                      f"(tried for {self.config.start_timeout:g} s)") from None
                time.sleep(0.05)

    def _accept_loop(self) -> None:
        while not self.closed:
            try:
                sock, address = self.listener.accept()
            except OSError as exc:
                if self.closed or exc.errno in (errno.EBADF, errno.EINVAL):
                    return                      # the listener was closed
                # out of descriptors or buffers (EMFILE, ENFILE, ENOBUFS, ENOMEM), or a connection
                # aborted before accept: transient, and the listener must outlive it
                log.warning("accept() failed (%s); retrying in %g s", exc, _ACCEPT_RETRY_S)
                time.sleep(_ACCEPT_RETRY_S)
                continue
            if self.closed:
                sock.close()
                return
            source = address[0]
            with self.cond:
                busy = self._pending_from.get(source, 0) >= MAX_PENDING_PER_SOURCE
                if not busy:
                    busy = not self._pending.acquire(blocking=False)
                if not busy:
                    self._pending_from[source] = self._pending_from.get(source, 0) + 1
            if busy:
                log.warning("too many connections in handshake; dropping %s:%s", *address[:2])
                sock.close()
                continue
            try:
                threading.Thread(target=self._admit, args=(sock, address), daemon=True).start()
            except RuntimeError as exc:         # cannot start a thread: drop this one, keep accepting
                log.warning("cannot handle the connection from %s: %s", source, exc)
                sock.close()
                self._handshake_done(source)

    def _handshake_done(self, source: str) -> None:
        with self.cond:
            left = self._pending_from.get(source, 0) - 1
            if left > 0:
                self._pending_from[source] = left
            else:
                self._pending_from.pop(source, None)
            self._pending.release()

    def _admit(self, sock: socket.socket, address) -> None:
        where = f"{address[0]}:{address[1]}"
        identity = None
        try:
            sock.settimeout(self.handshake_timeout)
            sock = secure(sock, self.config, True, f"connection from {where}", self.handshake_timeout)
            identity = listen_handshake(sock, f"connection from {where}", secret=self.config.secret,
                                        job_id=self.config.job_id, my_id=self.my_id,
                                        classes=self.flow_count, timeout=self.handshake_timeout,
                                        admit=self._reserve)
            apply_socket_options(sock, socket_options(self.config, identity.class_index, sock.family),
                                 self.config.rto_max_ms, self.config.rto_min_us)
            self.addresses.setdefault(identity.peer_id, where)
            self._register(sock, identity.peer_id, identity.class_index,
                           self.peer_name(identity.peer_id, identity.class_index))
        except Exception as exc:  # noqa: BLE001 -- a bad client must never stop the listener
            log.warning("rejected connection from %s: %s", where, exc)
            sock.close()
        finally:
            self._unreserve(identity)
            self._handshake_done(address[0])

    def _reserve(self, identity) -> None:
        """Hold a (peer, class) slot for an authenticated dialer before it is told ACCEPT."""
        key = (identity.peer_id, identity.class_index)
        name = self.peer_name(identity.peer_id, identity.class_index)
        if self.accept_peers is not None and identity.peer_id not in self.accept_peers:
            raise ProtocolError(f"{self.peer_label} {identity.peer_id} is not expected here")
        def busy() -> bool:
            old = self.flows.get(key)
            return key in self._reserved or (old is not None and old.active)

        with self.cond:
            # a reconnecting peer may race the end of its old connection (its BYE or EOF is still
            # in flight): give that a moment before refusing
            self.cond.wait_for(lambda: not busy() or self.closed, timeout=SLOT_WAIT_S)
            if self.closed:
                raise ProtocolError(f"{name}: this {self.peer_label} pool is closing")
            if busy():
                raise ProtocolError(f"{name} connected twice (that flow is already up)")
            self._reserved.add(key)

    def _unreserve(self, identity) -> None:
        if identity is None:
            return
        with self.cond:
            self._reserved.discard((identity.peer_id, identity.class_index))
            self.cond.notify_all()

    def _register(self, sock, peer_id, index, name) -> None:
        with self.cond:
            old = self.flows.get((peer_id, index))
            if old is not None and old.active:
                sock.close()
                raise ProtocolError(f"{name} connected twice")
            if old is not None and not old.closing:
                old.close()                     # it said BYE: it will send nothing more there
            flow = Flow(self, sock, peer_id, index, name)
            self.flows[(peer_id, index)] = flow
            if self.is_peer_flow(flow):
                self.failures.pop(peer_id, None)
                self.left.discard(peer_id)
            self.cond.notify_all()
        flow.start()

    def wait_connected(self, peers, timeout: float | None = None) -> None:
        """Block until every flow to each peer in `peers` exists (dialed or accepted), at most
        `timeout` seconds (default: the config's start_timeout)."""
        wanted = [(p, i) for p in peers for i in range(self.flow_count)]
        start = time.monotonic()
        self.wait_until(lambda: all(k in self.flows for k in wanted),
                        f"connections from {', '.join(self.peer_name(p) for p in peers)}",
                        peers, progress=lambda: start,
                        timeout=self.config.start_timeout if timeout is None else timeout)
        return None

    # -- sending and waiting ------------------------------------------------------------------
    def flow(self, peer_id: int, index: int, wait: bool = False) -> Flow:
        """The flow to a peer; with `wait`, block (up to the timeout) until it is connected."""
        if wait and (peer_id, index) not in self.flows:
            self.wait_connected([peer_id])
        flow = self.flows.get((peer_id, index))
        if flow is None or flow.closing:
            raise self.failures.get(peer_id) or TransportError(f"no connection to "
                                                               f"{self.peer_name(peer_id, index)}")
        return flow

    def wait_until(self, predicate, what: str, peers, progress, timeout: float | None = None):
        """Wait for `predicate()` (checked under self.cond); fail fast if a peer in `peers` failed.

        `progress()` returns the monotonic time of the last useful event; no progress for
        `timeout` seconds (default: the config's) raises PeerTimeout naming the peers.
        """
        timeout = self.config.timeout if timeout is None else timeout
        with self.cond:
            while True:
                if predicate():
                    return
                # the first peer to fail, not the first in `peers`: the others may only have closed on
                # hearing of it before this thread woke
                failure = next((f for peer, f in self.failures.items() if peer in peers), None)
                if failure is not None:
                    raise type(failure)(f"while waiting for {what}: {failure}")
                if self.closed:
                    raise TransportError(f"transport closed while waiting for {what}")
                if time.monotonic() - progress() > timeout:
                    names = ", ".join(self.peer_name(p) for p in peers) or "peers"
                    raise PeerTimeout(f"no progress for {timeout:g} s while waiting for {what} "
                                      f"from {names}: a peer died, stalled or the network is cut")
                self.cond.wait(_POLL)

    def record_failure(self, flow: Flow, exc: TransportError) -> None:
        """Remember why the peer of `flow` failed (the first reason is kept); `flow_failed` wakes the waiters."""
        with self.cond:
            if self.flows.get((flow.peer_id, flow.index)) is flow and self.is_peer_flow(flow):
                self.failures.setdefault(flow.peer_id, exc)

    def flow_failed(self, flow: Flow, exc: TransportError) -> None:
        """After `record_failure` (the failing flow records first, then closes): the owner's hook, then
        the waiters wake."""
        failed = getattr(self.handler, "flow_failed", None)
        try:
            if failed is not None:   # the owner tells the other peers (ABORT) before a waiter wakes on
                failed(flow, exc)    # the failure and closes the pool, which would send nothing more
        finally:
            with self.cond:
                self.cond.notify_all()

    def peer_left(self, flow: Flow) -> None:
        with self.cond:
            if self.is_peer_flow(flow):
                self.left.add(flow.peer_id)
            self.cond.notify_all()
        left = getattr(self.handler, "peer_left", None)
        if left is not None:
            left(flow)

    def abort(self, reason: str, skip_peer: int | None = None) -> list[threading.Event]:
        """Tell every connected peer (but `skip_peer`) that the job fails, ahead of queued data.

        Returns events set once each ABORT frame is in the kernel. Every flow to a peer carries
        one: the peer reads each flow on its own thread, and an ABORT on one flow only would race
        the end of another (closed right after), whose "connection closed" hides the reason.
        """
        payload = reason.encode()[:MAX_CONTROL_PAYLOAD]
        frame = encode_control(Kind.ABORT, payload, job_id=self.config.job_id)
        with self.cond:
            flows = [f for (peer, _index), f in self.flows.items()
                     if peer != skip_peer and not f.closing]
        sent = []
        for flow in flows:
            event = threading.Event()
            flow.send((float("-inf"),), frame, on_sent=event.set)
            sent.append(event)
            self._aborts.append((flow, event))
        log.warning("aborting: told %d peer(s): %s", len({f.peer_id for f in flows}), reason)
        return sent

    def _close_listener(self) -> None:
        """Stop accepting: wake the accept thread (close alone leaves it blocked in accept) and join it."""
        if self.listener is None:
            return
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass                                  # already shut down, or never connected
        self.listener.close()
        if self._accept_thread is not None and self._accept_thread is not threading.current_thread():
            self._accept_thread.join(timeout=5.0)

    def close(self, say_goodbye: bool = True) -> None:
        """Close every flow (after a BYE and the queued frames, when say_goodbye) and the listener.

        After a peer failed the job is over: no goodbyes (a peer that stopped reading would hold
        them up to the timeout), only the ABORT frames already queued get a moment to leave.
        """
        with self.cond:
            self.closed = True
            flows = list(self.flows.values())
            failed = bool(self.failures)
            self.cond.notify_all()
        if failed:
            say_goodbye = False
            deadline = time.monotonic() + min(self.config.timeout, 1.0)
            for flow, event in self._aborts:
                while not (event.is_set() or flow.closing) and time.monotonic() < deadline:
                    event.wait(0.02)
        self._close_listener()
        if say_goodbye:
            sent = []
            for flow in flows:
                if not flow.closing:
                    event = threading.Event()
                    flow.send((float("inf"),), encode_control(Kind.BYE, b"", job_id=self.config.job_id),
                              on_sent=event.set)
                    sent.append(event)
            deadline = time.monotonic() + min(self.config.timeout, 5.0)
            for event in sent:
                event.wait(max(0.0, deadline - time.monotonic()))
        for flow in flows:
            flow.close()
        for flow in flows:   # no transport thread may outlive close (torch aborts at exit otherwise)
            flow.join(2.0)


class PoolOwner:
    """A rank whose connections are one FlowPool (None: nothing to connect); a context manager."""

    pool: FlowPool | None
    _aborted = False   # set once abort_others() has told the other peers

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    def abort_others(self, flow: Flow, exc: TransportError, reason: str) -> None:
        """A peer's connection broke: tell every other peer (ABORT), once, so none waits out its timeout.

        Nothing is sent for a protocol error (the peer is not one of ours), for a peer that had finished,
        or while closing; a PeerAborted passes on its own reason, anything else `reason`."""
        if isinstance(exc, ProtocolError) or self._aborted or flow.peer_done or self.pool.closed:
            return
        self._aborted = True
        self.pool.abort(exc.reason if isinstance(exc, PeerAborted) else reason, skip_peer=flow.peer_id)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_sequence = itertools.count()


def next_sequence() -> int:
    """A process-wide increasing number, used as the FIFO tie-breaker in send keys."""
    return next(_sequence)
