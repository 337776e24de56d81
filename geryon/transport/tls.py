"""Optional TLS for the data flows: per-job credentials, mutual verification, a full-duplex socket.

`generate_credentials()` makes a fresh P-256 key and a self-signed certificate for one job (the
launcher does it once per job with `--tls`); every rank gets the same PEM text (key + certificate) and
trusts only that certificate: each side of a connection presents it and verifies the other's against
it (mutual TLS, TLS 1.3), so a peer without the job's credentials is refused during the TLS handshake.
Host names are not checked (ranks are addressed by IP; the job certificate is the identity).

`TlsSocket` carries TLS over a connected TCP socket through memory BIOs. A flow reads on one thread
while it writes on another; one OpenSSL connection object must not be driven by two threads at once
(its error state is shared), so every call into it holds a lock, and the socket I/O happens outside
that lock on the plain socket. The plain socket stays what the transport configured: DSCP,
SO_PRIORITY, TCP_NOTSENT_LOWAT and timeouts apply to it unchanged, and `setsockopt`, `settimeout`,
`getsockname`, `shutdown` ... reach it. It offers `recv_into`, `sendall` and `sendmsg` (encrypting
each buffer, returning the full count), which is all geryon.transport.socketio uses.

The authenticated handshake (geryon.transport.handshake) still runs inside TLS: TLS adds
confidentiality and a second, certificate-based admission; the secret's MAC stays the job's proof.
"""

from __future__ import annotations

import base64
import datetime
import functools
import socket
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass, field

from geryon.errors import AuthenticationError, ConfigError, PeerTimeout, TransportError
from geryon.transport.wire import MAGIC, Kind, encode_control

_RECV_CHUNK = 256 * 1024
_SMALL_RECORD = 16 * 1024       # frames up to this size go out as one record (header and payload joined)


@dataclass(frozen=True)
class TlsCredentials:
    """One job's key and self-signed certificate (PEM); both ends of every flow use the same."""
    pem: str = field(repr=False)

    def __post_init__(self):
        if "PRIVATE KEY-----" not in self.pem or "BEGIN CERTIFICATE-----" not in self.pem:
            raise ConfigError("TLS credentials must hold a PEM private key and certificate (the launcher "
                              "makes them per job with --tls)")

    def encoded(self) -> str:
        """One line (base64), for a channel that carries lines (the SSH backend's stdin)."""
        return base64.b64encode(self.pem.encode()).decode()

    @classmethod
    def decode(cls, line: str) -> "TlsCredentials":
        try:
            return cls(base64.b64decode(line.strip(), validate=True).decode())
        except (ValueError, UnicodeDecodeError):
            raise ConfigError("TLS credentials line is not base64 PEM") from None

    def context(self, server_side: bool) -> ssl.SSLContext:
        """A TLS 1.3 context presenting these credentials and trusting only their certificate."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server_side else ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.check_hostname = False
        context.verify_mode = ssl.CERT_REQUIRED
        if server_side:
            context.num_tickets = 0              # no session tickets: nothing written after the handshake
        # load_cert_chain reads files only: a private temporary file (0600, removed at once)
        with tempfile.NamedTemporaryFile("w", suffix=".pem") as handle:
            handle.write(self.pem)
            handle.flush()
            context.load_cert_chain(handle.name)
        context.load_verify_locations(cadata=_certificate_pem(self.pem))
        return context


def _certificate_pem(pem: str) -> str:
    start = pem.index("-----BEGIN CERTIFICATE-----")
    end = pem.index("-----END CERTIFICATE-----", start) + len("-----END CERTIFICATE-----")
    return pem[start:end] + "\n"


def generate_credentials(job: str = "geryon job", days: int = 30) -> TlsCredentials:
    """A fresh P-256 key and a self-signed certificate for one job (CA and end entity at once)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"geryon {job}"[:64])])
    now = datetime.datetime.now(datetime.timezone.utc)
    public = key.public_key()
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    return TlsCredentials(key_pem + certificate.public_bytes(serialization.Encoding.PEM).decode())


def load_credentials(path: str) -> TlsCredentials:
    """Credentials from the file the launcher wrote (0600)."""
    try:
        with open(path) as handle:
            return TlsCredentials(handle.read())
    except OSError as exc:
        raise ConfigError(f"cannot read the job's TLS credentials {path!r}: {exc}") from None


def _refused(peer: str, exc: ssl.SSLError) -> AuthenticationError:
    reason = getattr(exc, "reason", None) or str(exc)
    return AuthenticationError(f"TLS with {peer} failed ({reason}): both sides need this job's TLS "
                               "certificate (every rank of a --tls job gets it from the launcher; a "
                               "peer without --tls, or of another job, is refused)")


class TlsSocket:
    """A connected TCP socket carrying TLS; one thread may read while another writes (see the module)."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, server_side: bool, peer: str):
        self.sock, self.peer = sock, peer
        self.family = sock.family
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=server_side)
        self._lock = threading.Lock()          # every call into the TLS object
        self._send_lock = threading.Lock()     # encrypted bytes leave in the order they were made
        self._eof = False
        self._chunk = bytearray(_RECV_CHUNK)   # only the reading thread fills it

    # -- the plain socket's own calls ---------------------------------------------------------------
    def settimeout(self, value):
        self.sock.settimeout(value)

    def gettimeout(self):
        return self.sock.gettimeout()

    def setsockopt(self, *args):
        self.sock.setsockopt(*args)

    def getsockopt(self, *args):
        return self.sock.getsockopt(*args)

    def getsockname(self):
        return self.sock.getsockname()

    def getpeername(self):
        return self.sock.getpeername()

    def fileno(self) -> int:
        return self.sock.fileno()

    def shutdown(self, how) -> None:
        self.sock.shutdown(how)

    def close(self) -> None:
        self.sock.close()

    # -- TLS ----------------------------------------------------------------------------------------
    def handshake(self, deadline: float) -> None:
        """Run the TLS handshake by `deadline` (time.monotonic()); AuthenticationError if refused."""
        previous = self.sock.gettimeout()
        try:
            while True:
                try:
                    with self._lock:
                        self._tls.do_handshake()
                    self._flush()
                    return
                except ssl.SSLWantReadError:
                    self._flush()
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise PeerTimeout(f"{self.peer} did not complete the TLS handshake in time") from None
                    self.sock.settimeout(left)
                    if not self._fill():
                        raise TransportError(f"{self.peer} closed the connection during the TLS "
                                             "handshake (is it running with --tls, and of this job?)")
                except ssl.SSLError as exc:
                    self._flush_quietly()       # the alert tells the peer why
                    raise _refused(self.peer, exc) from None
        except socket.timeout:
            raise PeerTimeout(f"{self.peer} did not complete the TLS handshake in time") from None
        except OSError as exc:                  # reset, unreachable: the dialer retries these
            raise TransportError(f"TLS handshake with {self.peer} failed: {exc}") from None
        finally:
            self.sock.settimeout(previous)

    def recv_into(self, view, nbytes: int = 0) -> int:
        """Up to `nbytes` (default len(view)) decrypted bytes into `view`; 0 at end of stream."""
        nbytes = nbytes or len(view)
        while True:
            with self._lock:
                try:
                    got = self._tls.read(nbytes, view)
                except ssl.SSLWantReadError:
                    got = None
                except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                    return 0                    # closed (cleanly or not): the caller names the peer
                except ssl.SSLError as exc:
                    raise _refused(self.peer, exc) from None
                pending = self._outgoing.pending
            if pending:
                self._flush()
            if got is not None:
                return got
            if not self._fill():
                return 0

    def sendmsg(self, buffers) -> int:
        """Encrypt and send every buffer in order; returns the total (all of it, or it raises)."""
        views = [memoryview(b).cast("B") for b in buffers]
        total = sum(len(v) for v in views)
        if total <= _SMALL_RECORD and len(views) > 1:
            views = [memoryview(b"".join(views))]
        with self._send_lock:
            with self._lock:
                try:
                    for view in views:
                        if len(view):
                            self._tls.write(view)
                except ssl.SSLError as exc:
                    raise _refused(self.peer, exc) from None
                data = self._outgoing.read()
            self.sock.sendall(data)
        return total

    def sendall(self, data) -> None:
        self.sendmsg([data])

    def _fill(self) -> bool:
        """Read what the plain socket has into the TLS object; False at end of stream."""
        if self._eof:
            return False
        got = self.sock.recv_into(self._chunk)
        with self._lock:
            if got:
                self._incoming.write(memoryview(self._chunk)[:got])
            else:
                self._eof = True
                self._incoming.write_eof()
        return got > 0

    def _flush(self) -> None:
        with self._send_lock:
            with self._lock:
                data = self._outgoing.read()
            if data:
                self.sock.sendall(data)

    def _flush_quietly(self) -> None:
        try:
            self._flush()
        except OSError:
            pass


@functools.lru_cache(maxsize=8)
def _context(credentials: TlsCredentials, server_side: bool) -> ssl.SSLContext:
    return credentials.context(server_side)


def wrap(sock: socket.socket, credentials: TlsCredentials, server_side: bool, peer: str,
         timeout: float) -> TlsSocket:
    """`sock` with TLS on it, its handshake done within `timeout` seconds."""
    tls = TlsSocket(sock, _context(credentials, server_side), server_side, peer)
    tls.handshake(time.monotonic() + timeout)
    return tls


def secure(sock: socket.socket, config, server_side: bool, peer: str, timeout: float):
    """`sock` unchanged when `config.tls` is None, else wrapped in TLS (the transport's one call).

    A listener whose dialer speaks geryon's plain protocol (no --tls) answers with a plain REJECT
    saying so, so that the dialer fails at once with the reason instead of retrying until its timeout.
    """
    if config.tls is None:
        return sock
    if server_side:
        _refuse_plain_dialer(sock, config.job_id, peer, timeout)
    return wrap(sock, config.tls, server_side, peer, timeout)


def _refuse_plain_dialer(sock: socket.socket, job_id: int, peer: str, timeout: float) -> None:
    sock.settimeout(timeout)
    try:
        first = sock.recv(len(MAGIC), socket.MSG_PEEK | socket.MSG_WAITALL)
    except socket.timeout:
        raise PeerTimeout(f"{peer} sent nothing within {timeout:g} s") from None
    except OSError as exc:
        raise TransportError(f"connection from {peer} failed: {exc}") from None
    if first == MAGIC:
        reason = "this job's flows use TLS (--tls): connect with the job's TLS credentials"
        try:
            sock.sendall(encode_control(Kind.REJECT, reason.encode(), job_id=job_id))
        except OSError:
            pass
        raise AuthenticationError(f"{peer} spoke without TLS to a --tls job")
