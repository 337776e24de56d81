"""Typed errors a user can hit; each message says what went wrong and what to do next.

`require_root` is the one check for root before namespaces, tc or raw sockets are touched.
"""

import os


class GeryonError(Exception):
    """Base of every error geryon raises on purpose."""


class ConfigError(GeryonError, ValueError):
    """Bad user input: a rate, a class spec, a name, an option."""


class RateError(ConfigError):
    """A bandwidth string that cannot be parsed."""


class ClassSpecError(ConfigError):
    """An invalid list of priority classes (count, DSCP range, duplicates)."""


class NetconfError(GeryonError):
    """Programming queues on an interface failed."""


class InterfaceNotFound(NetconfError):
    """The named interface does not exist (in the given namespace)."""


class EmulationError(GeryonError):
    """Building, using or removing an emulated cluster failed."""


class NameInUse(EmulationError):
    """An emulated cluster with this name already exists."""


class PermissionNeeded(GeryonError):
    """The operation needs root (CAP_NET_ADMIN)."""


def require_root(action: str, next_step: str = "run it with sudo") -> None:
    """Raise PermissionNeeded ("`action` needs root; `next_step`") unless this process runs as root."""
    if os.geteuid() != 0:
        raise PermissionNeeded(f"{action} needs root; {next_step}")


class LaunchError(GeryonError):
    """Starting or running a distributed job failed (a rank, a host, the rendezvous)."""


class HostKeyError(LaunchError):
    """An SSH host presented a key that known_hosts does not vouch for."""


class ProfileError(ConfigError):
    """A per-layer profile file that is not in the documented format (see geryon/categorize/profiles_data/README.md)."""


class TransportError(GeryonError):
    """Moving tensors between ranks failed: a peer closed, reset or misbehaved."""


class PeerAborted(TransportError):
    """A peer reported that the job is failing elsewhere (e.g. a PS server saw a worker die)."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message


class PeerClosed(TransportError):
    """A send found the peer's end closed or reset (it exited, was killed, or gave up on the job)."""


class AuthenticationError(TransportError):
    """A peer failed the handshake: wrong per-job secret, job id or protocol version."""


class PeerTimeout(TransportError):
    """A peer sent nothing within the transport timeout (it stalled, died or the network is cut)."""


class ProtocolError(TransportError):
    """A malformed frame, or ranks that disagree on the plan of what to send."""


class QosProfileError(ConfigError):
    """A switch QoS profile that cannot be used: bad TOML, overlapping DSCPs, queues or weights."""


class TargetLimitError(QosProfileError):
    """A QoS profile that asks more of a switch target than it offers (queues, strict queues, weights)."""


class InventoryError(ConfigError):
    """A cluster inventory file that is not in the documented format (see cluster/README.md)."""


class ApplyError(NetconfError):
    """Applying a QoS profile to a target failed; what was changed has been rolled back."""


class RemoteError(NetconfError):
    """Connecting to, or running a command on, a managed host or switch failed."""


class CollectivesUnavailable(ConfigError):
    """A --collectives choice this PyTorch or NCCL cannot provide (no NCCL, no per-communicator traffic class)."""
