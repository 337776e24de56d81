"""TransportConfig: every knob of the transport in one plain dataclass, validated on creation.

Default slice size: 256 KiB, the largest size with full goodput whose wait behind one slice of its
own flow stays small (21 ms at 100 Mbit/s, 2 ms at 1 Gbit/s); the sweep behind it, and the
TCP_NOTSENT_LOWAT measurement, are in docs/transport.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from geryon.errors import ConfigError
from geryon.transport.policy import PLACEMENTS, Policy, get_policy

if TYPE_CHECKING:   # the settings alone, without the frame format's torch: CLIs read their defaults
    from geryon.transport.tls import TlsCredentials
    from geryon.transport.trace import TransferEvent

DEFAULT_DSCP = (46, 0)
# TCP's retransmission backoff cap (TCP_RTO_MAX_MS) for geryon's flows and for the job's gloo connections
# (geryon.runtime.api.init): a flow resumes within 1 s after a link comes back
DEFAULT_RTO_MAX_MS = 1000


@dataclass(frozen=True)
class TransportConfig:
    """Settings shared by every rank of a job (they must agree on all but timeouts)."""
    secret: bytes | str = field(default="", repr=False)
    job_id: int = 0
    policy: str = "geryon"
    class_dscp: tuple[int, ...] = DEFAULT_DSCP   # index = priority class, 0 most urgent
    slice_bytes: int = 256 * 1024
    bucket_bytes: int = 4 * 1024 * 1024          # allreduce: small tensors batched up to this
    # allreduce: a rank cuts its own chunks into pieces of about `slice_seconds` on the wire at the rate
    # its ring link reached in the last bandwidth-bound collective, between slice_bytes and this, and at
    # most a quarter of the chunk (the ring still pipelines). Fewer, larger pieces at high rates halve
    # the per-slice CPU (docs/transport.md); at 100 Mbit/s a piece stays
    # slice_bytes. Pieces carry their offset and length, so ranks need not agree. = slice_bytes: off.
    max_slice_bytes: int = 4 * 1024 * 1024
    slice_seconds: float = 0.02
    timeout: float = 60.0                        # seconds without progress before PeerTimeout
    # seconds a rank keeps dialing a peer that is not listening yet, and waits to be dialed, when the
    # job starts (the other processes may still be importing torch or being started over SSH); None =
    # `timeout`. A short `timeout` finds a dead peer quickly; this keeps it from failing the start.
    connect_timeout: float | None = None
    tcp_congestion: str | None = None            # e.g. "cubic", "bbr"; None = system default
    notsent_lowat: int | None = 128 * 1024       # TCP_NOTSENT_LOWAT; None leaves it alone
    # TCP_RTO_MAX_MS (Linux >= 6.15; ignored where absent): caps the retransmission backoff, so a flow
    # resumes within this long after a link comes back instead of up to 2x the outage; None = 120 s default
    rto_max_ms: int | None = DEFAULT_RTO_MAX_MS
    # TCP_RTO_MIN_US (Linux >= 6.15; ignored where absent): the floor of the retransmission timeout. Many
    # flows into one port (PS push/pull) lose whole window tails; with the 200 ms default each such loss
    # stalled a synchronous iteration for 200 ms (docs/transport.md); None = the kernel's
    rto_min_us: int | None = 10_000
    # CPU niceness added to the send/receive threads of every flow after the first (the less urgent
    # classes), best effort: where the CPU, not the wire, is contended, the urgent class's frames are
    # sent, received and aggregated first; 0 = every thread at the process's niceness
    class_thread_nice: int = 0
    # SCHED_RR real-time priority (1..99) of the flows' send/receive threads, best effort (needs
    # CAP_SYS_NICE; the kernel's RT throttling keeps 5% of each core for the rest): flow c's threads run
    # at max(1, P - c), so frames are sent, received and aggregated as soon as they arrive, ahead of the
    # process's other work and of other processes, the urgent class first; 0 = normal scheduling
    thread_rt_priority: int = 0
    max_payload: int = 1 << 30                   # largest data frame accepted, in bytes
    # a data frame that continues the one sent before it on its connection goes with the 8-byte
    # continuation header instead of the 44-byte one (transport.wire); False: always the full header.
    # The receiver accepts both, so ranks need not agree.
    compact_headers: bool = True
    # PS slices over servers (transport.shards.plan_shards): "bytes" gives each slice to the server
    # holding the fewest bytes so far; "count" deals them round-robin (P3), which loads a server with
    # several times the bytes of another when big and small tensors alternate (conv and BN, weight and
    # bias): ResNet-50 network-bound, geryon 1.604 -> 1.368 s per iteration (docs/paper-table.md)
    placement: str = "bytes"
    # TLS on every flow (geryon.transport.tls): the job's key + self-signed certificate, the same on every
    # rank; None = plain TCP (the handshake's MAC authenticates either way)
    tls: TlsCredentials | None = field(default=None, compare=False, repr=False)
    # called with a TransferEvent per data slice queued / sent / received (see transport.trace)
    tracer: Callable[[TransferEvent], None] | None = field(default=None, compare=False, repr=False)

    @property
    def start_timeout(self) -> float:
        """How long a rank waits for its peers to come up: connect_timeout, or timeout when unset."""
        return self.timeout if self.connect_timeout is None else self.connect_timeout

    def __post_init__(self):
        if isinstance(self.secret, str):
            object.__setattr__(self, "secret", self.secret.encode())
        if not self.secret:
            raise ConfigError("the transport needs a per-job secret: pass secret=... (the same value on "
                              "every rank; under geryon.launch every rank is given the job's)")
        if isinstance(self.tls, str):
            from geryon.transport.tls import TlsCredentials
            object.__setattr__(self, "tls", TlsCredentials(self.tls))
        object.__setattr__(self, "class_dscp", tuple(int(d) for d in self.class_dscp))
        if not 1 <= len(self.class_dscp) <= 8 or any(not 0 <= d <= 63 for d in self.class_dscp):
            raise ConfigError(f"class_dscp {self.class_dscp}: give 1-8 DSCP values in 0..63")
        if not 0 <= self.job_id < 2**32:
            raise ConfigError(f"job_id {self.job_id} must fit in 32 bits")
        if self.slice_bytes < 1024 or self.bucket_bytes < 1 or not 0 < self.timeout < math.inf:
            raise ConfigError("slice_bytes must be >= 1024, bucket_bytes >= 1 and timeout > 0")
        if self.connect_timeout is not None and not 0 < self.connect_timeout < math.inf:
            raise ConfigError(f"connect_timeout {self.connect_timeout}: > 0 seconds, or None (= timeout)")
        if self.max_slice_bytes < self.slice_bytes or not 0 <= self.slice_seconds < math.inf:
            raise ConfigError(f"max_slice_bytes {self.max_slice_bytes} must be >= slice_bytes "
                              f"{self.slice_bytes}, and slice_seconds >= 0 (0: pieces of slice_bytes)")
        get_policy(self.policy)
        if self.rto_max_ms is not None and not 1000 <= self.rto_max_ms <= 120_000:
            raise ConfigError(f"rto_max_ms {self.rto_max_ms}: Linux accepts 1000..120000 (or None)")
        if self.rto_min_us is not None and not 5000 <= self.rto_min_us <= 200_000:
            raise ConfigError(f"rto_min_us {self.rto_min_us}: Linux accepts 5000..200000 (or None)")
        if not 0 <= self.thread_rt_priority <= 99:
            raise ConfigError(f"thread_rt_priority {self.thread_rt_priority}: 0 (off) or 1..99")
        if self.placement not in PLACEMENTS:
            raise ConfigError(f"placement {self.placement!r}: choose one of {', '.join(PLACEMENTS)}")

    @property
    def scheduling(self) -> Policy:
        return get_policy(self.policy)

    @property
    def classes(self) -> int:
        return len(self.class_dscp)

    def flow_dscp(self, flow: int) -> int:
        """DSCP of a flow: its class's under per-class flows, else the lowest class's."""
        if self.scheduling.flow_per_class:
            return self.class_dscp[flow]
        return self.class_dscp[-1]
