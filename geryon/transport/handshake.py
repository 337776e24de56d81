"""Connection handshake: mutual authentication with a per-job secret, version and job id checks.

    dialer   -> HELLO      peer_id u32, class u8, nonce_d (32 random bytes)
    listener -> CHALLENGE  listener_id u32, nonce_l (32), HMAC-SHA256(secret, "geryon-listener" | T)
    dialer   -> PROOF      HMAC-SHA256(secret, "geryon-dialer" | T)
    listener -> ACCEPT     (empty)  or REJECT (reason text) and close

T, the transcript, is job_id | version | peer_id | class | listener_id | nonce_d | nonce_l |
dialer address | listener address, so each side proves knowledge of the secret over both nonces and
neither proof can be replayed. The addresses are the TCP connection's two endpoints as each side sees
them (getsockname / getpeername): a relay in the middle (someone who points a dialer at itself and
forwards the bytes to the real listener) makes the two sides see different endpoints, so the MACs do
not verify and the relayed connection is refused. (The price: dialing through NAT or a proxy that
rewrites addresses is not supported.) Every frame header is validated (magic, version, job id) as
usual; any failure raises AuthenticationError or ProtocolError and the connection is closed.

The whole handshake has one deadline, not one per read: a client that sends one byte a second cannot
hold a listener's handshake slot longer than `deadline` allows. The listener's `admit(identity)` runs
after the dialer proved the secret and before ACCEPT, so a refusal (a duplicate connection, a peer id
that is not expected) reaches the dialer as a REJECT instead of a silent close after ACCEPT.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import socket
import struct
import time
from dataclasses import dataclass

from geryon.errors import AuthenticationError, ProtocolError
from geryon.transport.socketio import read_control_payload, read_header, write_all
from geryon.transport.wire import HEADER_SIZE, PROTOCOL_VERSION, Kind, encode_control

log = logging.getLogger(__name__)

NONCE_SIZE = 32
_HELLO = struct.Struct("!IB32s")
_CHALLENGE = struct.Struct("!I32s32s")
_TRANSCRIPT = struct.Struct("!IBIBI32s32s")


@dataclass(frozen=True)
class PeerIdentity:
    """Who is on the other end of an authenticated connection and which class it carries."""
    peer_id: int
    class_index: int


def _mac(secret: bytes, role: bytes, transcript: bytes) -> bytes:
    return hmac.new(secret, role + transcript, hashlib.sha256).digest()


def _endpoint(address) -> bytes:
    """A socket address as text, IPv4-mapped IPv6 addresses written as plain IPv4."""
    host, port = address[0], address[1]
    if host.startswith("::ffff:") and "." in host:
        host = host[len("::ffff:"):]
    return f"{host}|{port}".encode()


def connection_endpoints(sock: socket.socket, dialer: bool) -> bytes:
    """The (dialer, listener) endpoints of a connected socket, as both sides must agree on them."""
    local, remote = _endpoint(sock.getsockname()), _endpoint(sock.getpeername())
    dialer_end, listener_end = (local, remote) if dialer else (remote, local)
    return b"dialer=" + dialer_end + b";listener=" + listener_end


def _transcript(job_id, peer_id, class_index, listener_id, nonce_d, nonce_l, endpoints) -> bytes:
    return _TRANSCRIPT.pack(job_id, PROTOCOL_VERSION, peer_id, class_index, listener_id,
                            nonce_d, nonce_l) + endpoints


def _deadline(sock: socket.socket, timeout: float | None) -> float:
    if timeout is None:
        timeout = sock.gettimeout() or 60.0
    return time.monotonic() + timeout


def _write(sock, frame: bytes, peer: str, deadline: float) -> None:
    sock.settimeout(max(0.001, deadline - time.monotonic()))
    write_all(sock, [frame], peer)


def _expect(sock, buffer, peer, job_id, kind: Kind, deadline: float) -> bytes:
    header = read_header(sock, buffer, peer, job_id=job_id, max_payload=0, deadline=deadline)
    payload = read_control_payload(sock, header, peer, deadline)
    if header.kind == Kind.REJECT:
        reason = payload.decode("utf-8", "replace")
        raise AuthenticationError(f"{peer} rejected the connection: {reason}")
    if header.kind != kind:
        raise ProtocolError(f"{peer} sent {header.kind.name} during the handshake, expected {kind.name}")
    return payload


def dial_handshake(sock: socket.socket, peer: str, *, secret: bytes, job_id: int, my_id: int,
                   class_index: int, expected_listener: int | None = None,
                   timeout: float | None = None) -> int:
    """Authenticate as the dialing side within `timeout` (default: the socket's); returns the listener id."""
    deadline = _deadline(sock, timeout)
    previous = sock.gettimeout()
    buffer = bytearray(HEADER_SIZE)
    nonce_d = os.urandom(NONCE_SIZE)
    endpoints = connection_endpoints(sock, dialer=True)
    _write(sock, encode_control(Kind.HELLO, _HELLO.pack(my_id, class_index, nonce_d), job_id=job_id),
           peer, deadline)
    payload = _expect(sock, buffer, peer, job_id, Kind.CHALLENGE, deadline)
    if len(payload) != _CHALLENGE.size:
        raise ProtocolError(f"{peer} sent a malformed CHALLENGE")
    listener_id, nonce_l, listener_mac = _CHALLENGE.unpack(payload)
    transcript = _transcript(job_id, my_id, class_index, listener_id, nonce_d, nonce_l, endpoints)
    if not hmac.compare_digest(listener_mac, _mac(secret, b"geryon-listener", transcript)):
        raise AuthenticationError(f"{peer} does not know this job's secret, or the connection is relayed "
                                  "(the endpoints differ): every rank needs the same job secret; check "
                                  "the rendezvous addresses")
    if expected_listener is not None and listener_id != expected_listener:
        raise ProtocolError(f"{peer} is rank {listener_id}, expected rank {expected_listener}: "
                            "check the rendezvous addresses")
    _write(sock, encode_control(Kind.PROOF, _mac(secret, b"geryon-dialer", transcript), job_id=job_id),
           peer, deadline)
    _expect(sock, buffer, peer, job_id, Kind.ACCEPT, deadline)
    sock.settimeout(previous)
    return listener_id


def listen_handshake(sock: socket.socket, peer: str, *, secret: bytes, job_id: int,
                     my_id: int, classes: int, timeout: float | None = None,
                     admit=None) -> PeerIdentity:
    """Authenticate a dialer within `timeout`; on failure send REJECT (best effort) and raise.

    `admit(identity)`, if given, runs once the dialer proved the secret and before ACCEPT; what it
    raises (ProtocolError, AuthenticationError) is sent to the dialer as the REJECT reason.
    """
    deadline = _deadline(sock, timeout)
    previous = sock.gettimeout()
    buffer = bytearray(HEADER_SIZE)
    try:
        endpoints = connection_endpoints(sock, dialer=False)
        payload = _expect(sock, buffer, peer, job_id, Kind.HELLO, deadline)
        if len(payload) != _HELLO.size:
            raise ProtocolError(f"{peer} sent a malformed HELLO")
        peer_id, class_index, nonce_d = _HELLO.unpack(payload)
        if class_index >= classes:
            raise ProtocolError(f"{peer} asked for class {class_index}, only {classes} configured")
        nonce_l = os.urandom(NONCE_SIZE)
        transcript = _transcript(job_id, peer_id, class_index, my_id, nonce_d, nonce_l, endpoints)
        challenge = _CHALLENGE.pack(my_id, nonce_l, _mac(secret, b"geryon-listener", transcript))
        _write(sock, encode_control(Kind.CHALLENGE, challenge, job_id=job_id), peer, deadline)
        proof = _expect(sock, buffer, peer, job_id, Kind.PROOF, deadline)
        if not hmac.compare_digest(proof, _mac(secret, b"geryon-dialer", transcript)):
            raise AuthenticationError(f"{peer} failed authentication (wrong per-job secret, or a "
                                      "relayed connection)")
        identity = PeerIdentity(peer_id, class_index)
        if admit is not None:
            admit(identity)
    except (AuthenticationError, ProtocolError) as exc:
        _reject(sock, str(exc), job_id)
        raise
    _write(sock, encode_control(Kind.ACCEPT, b"", job_id=job_id), peer, deadline)
    sock.settimeout(previous)
    return identity


def _reject(sock: socket.socket, reason: str, job_id: int) -> None:
    try:
        sock.sendall(encode_control(Kind.REJECT, reason.encode()[:200], job_id=job_id))
    except OSError:
        pass
