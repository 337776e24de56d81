"""Connection handshake: mutual authentication with a per-job secret, version and job id checks.

    dialer   -> HELLO      peer_id u32, class u8, nonce_d (32 random bytes)
    listener -> CHALLENGE  listener_id u32, nonce_l (32), HMAC-SHA256(secret, "geryon-listener" | T)
    dialer   -> PROOF      HMAC-SHA256(secret, "geryon-dialer" | T)
    listener -> ACCEPT     (empty)  or REJECT (reason text) and close

T, the transcript, is job_id | version | peer_id | class | listener_id | nonce_d | nonce_l, so each
side proves knowledge of the secret over both nonces and neither proof can be replayed. Every frame
header is validated (magic, version, job id) as usual; any failure raises AuthenticationError or
ProtocolError and the connection is closed. The whole handshake has one deadline (socket timeout).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import socket
import struct
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


def _transcript(job_id, peer_id, class_index, listener_id, nonce_d, nonce_l) -> bytes:
    return _TRANSCRIPT.pack(job_id, PROTOCOL_VERSION, peer_id, class_index, listener_id,
                            nonce_d, nonce_l)


def _expect(sock, buffer, peer, job_id, kind: Kind) -> bytes:
    header = read_header(sock, buffer, peer, job_id=job_id, max_payload=0)
    payload = read_control_payload(sock, header, peer)
    if header.kind == Kind.REJECT:
        reason = payload.decode("utf-8", "replace")
        raise AuthenticationError(f"{peer} rejected the connection: {reason}")
    if header.kind != kind:
        raise ProtocolError(f"{peer} sent {header.kind.name} during the handshake, expected {kind.name}")
    return payload


def dial_handshake(sock: socket.socket, peer: str, *, secret: bytes, job_id: int, my_id: int,
                   class_index: int, expected_listener: int | None = None) -> int:
    """Authenticate as the dialing side; returns the listener's id."""
    buffer = bytearray(HEADER_SIZE)
    nonce_d = os.urandom(NONCE_SIZE)
    write_all(sock, [encode_control(Kind.HELLO, _HELLO.pack(my_id, class_index, nonce_d),
                                    job_id=job_id)], peer)
    payload = _expect(sock, buffer, peer, job_id, Kind.CHALLENGE)
    if len(payload) != _CHALLENGE.size:
        raise ProtocolError(f"{peer} sent a malformed CHALLENGE")
    listener_id, nonce_l, listener_mac = _CHALLENGE.unpack(payload)
    transcript = _transcript(job_id, my_id, class_index, listener_id, nonce_d, nonce_l)
    if not hmac.compare_digest(listener_mac, _mac(secret, b"geryon-listener", transcript)):
        raise AuthenticationError(f"{peer} does not know this job's secret; every rank needs the same job secret")
    if expected_listener is not None and listener_id != expected_listener:
        raise ProtocolError(f"{peer} is rank {listener_id}, expected rank {expected_listener}: "
                            "check the rendezvous addresses")
    write_all(sock, [encode_control(Kind.PROOF, _mac(secret, b"geryon-dialer", transcript),
                                    job_id=job_id)], peer)
    _expect(sock, buffer, peer, job_id, Kind.ACCEPT)
    return listener_id


def listen_handshake(sock: socket.socket, peer: str, *, secret: bytes, job_id: int,
                     my_id: int, classes: int) -> PeerIdentity:
    """Authenticate a dialer; on failure send REJECT (best effort) and raise."""
    buffer = bytearray(HEADER_SIZE)
    try:
        payload = _expect(sock, buffer, peer, job_id, Kind.HELLO)
        if len(payload) != _HELLO.size:
            raise ProtocolError(f"{peer} sent a malformed HELLO")
        peer_id, class_index, nonce_d = _HELLO.unpack(payload)
        if class_index >= classes:
            raise ProtocolError(f"{peer} asked for class {class_index}, only {classes} configured")
        nonce_l = os.urandom(NONCE_SIZE)
        transcript = _transcript(job_id, peer_id, class_index, my_id, nonce_d, nonce_l)
        challenge = _CHALLENGE.pack(my_id, nonce_l, _mac(secret, b"geryon-listener", transcript))
        write_all(sock, [encode_control(Kind.CHALLENGE, challenge, job_id=job_id)], peer)
        proof = _expect(sock, buffer, peer, job_id, Kind.PROOF)
        if not hmac.compare_digest(proof, _mac(secret, b"geryon-dialer", transcript)):
            raise AuthenticationError(f"{peer} failed authentication (wrong per-job secret)")
    except (AuthenticationError, ProtocolError) as exc:
        _reject(sock, str(exc), job_id)
        raise
    write_all(sock, [encode_control(Kind.ACCEPT, b"", job_id=job_id)], peer)
    return PeerIdentity(peer_id, class_index)


def _reject(sock: socket.socket, reason: str, job_id: int) -> None:
    try:
        sock.sendall(encode_control(Kind.REJECT, reason.encode()[:200], job_id=job_id))
    except OSError:
        pass
