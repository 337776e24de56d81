"""A rank's handle on geryon's transport: its TransportConfig, the job's store, where it listens.

Everything here is read from the variables geryon.launch gives every rank (see
geryon.launch.environment.JOB_VARIABLES):
  GERYON_JOB_SECRET   the transport's per-job secret (without it there is no geryon transport:
                      scripts under plain torchrun fall back to gloo, see geryon.api)
  GERYON_JOB_ID       hashed to the transport's 32-bit job id
  GERYON_POLICY, GERYON_CLASSES   the scheduling policy and the classes' DSCP values
  GERYON_HOST_IP      the address this rank's flows listen on
  MASTER_ADDR/PORT    the launcher's TCPStore, where ranks publish their addresses
  GERYON_TRANSPORT_TIMEOUT  seconds without progress before a peer counts as dead (default 60;
                      tests set a few seconds so that a dead peer ends a job quickly)
"""

import hashlib
import os
import socket
from datetime import timedelta

from geryon.errors import ConfigError

TRANSPORT_TIMEOUT_ENV = "GERYON_TRANSPORT_TIMEOUT"
DEFAULT_TRANSPORT_TIMEOUT_S = 60.0
STORE_TIMEOUT = timedelta(minutes=5)
DEFAULT_PREFIX = "geryon/"


def has_transport(environ=None) -> bool:
    """True when the rank was given a job secret, i.e. geryon's transport can authenticate."""
    env = os.environ if environ is None else environ
    return bool(env.get("GERYON_JOB_SECRET"))


def transport_job_id(job_id: str | None) -> int:
    """The transport's 32-bit job id, derived from the launcher's job id string."""
    return int(hashlib.sha256((job_id or "").encode()).hexdigest()[:8], 16)


def class_dscp(spec: str | None) -> tuple[int, ...] | None:
    """DSCP values of a class spec (GERYON_CLASSES); None for the transport's default two."""
    if not spec:
        return None
    from geryon.netconf.classes import parse_classes

    try:
        return tuple(c.dscp for c in parse_classes(spec))
    except ConfigError as exc:
        raise ConfigError(f"GERYON_CLASSES={spec!r}: {exc}") from None


def transport_timeout(environ=None) -> float:
    env = os.environ if environ is None else environ
    text = env.get(TRANSPORT_TIMEOUT_ENV) or ""
    if not text:
        return DEFAULT_TRANSPORT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{TRANSPORT_TIMEOUT_ENV}={text!r} is not a number of seconds") from None
    if value <= 0:
        raise ConfigError(f"{TRANSPORT_TIMEOUT_ENV}={text!r} must be positive")
    return value


def transport_config(environ=None, tracer=None):
    """The TransportConfig of this job, as the launcher described it in the environment."""
    from geryon.transport import TransportConfig

    env = os.environ if environ is None else environ
    settings = dict(secret=env.get("GERYON_JOB_SECRET", ""),
                    job_id=transport_job_id(env.get("GERYON_JOB_ID")),
                    policy=env.get("GERYON_POLICY") or "vanilla",
                    timeout=transport_timeout(env))
    dscp = class_dscp(env.get("GERYON_CLASSES"))
    if dscp:
        settings["class_dscp"] = dscp
    return TransportConfig(tracer=tracer, **settings)


def store_prefix(environ=None) -> str:
    env = os.environ if environ is None else environ
    return env.get("GERYON_STORE_PREFIX") or DEFAULT_PREFIX


def open_store(environ=None):
    """A client of the job's TCPStore (the launcher's, or torchrun's agent store) at MASTER_ADDR:PORT,
    its values signed and verified with the job secret (geryon.transport.signed_store)."""
    from torch.distributed import TCPStore

    from geryon.transport.signed_store import SignedStore

    env = os.environ if environ is None else environ
    address, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if not address or not port:
        raise ConfigError("geryon's transport needs the job's store: MASTER_ADDR and MASTER_PORT are not set")
    if not env.get("GERYON_JOB_SECRET"):
        raise ConfigError("geryon's transport needs the job secret (GERYON_JOB_SECRET) to read the store")
    return SignedStore(TCPStore(address, int(port), is_master=False, wait_for_workers=False,
                                timeout=STORE_TIMEOUT), env["GERYON_JOB_SECRET"])


def listen_host(environ=None) -> str:
    """The address this rank's flows listen on: GERYON_HOST_IP, else the one that routes to MASTER_ADDR."""
    env = os.environ if environ is None else environ
    if env.get("GERYON_HOST_IP"):
        return env["GERYON_HOST_IP"]
    master = env.get("MASTER_ADDR") or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((master, 9))
            return probe.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def reserve_port(host: str) -> socket.socket:
    """A socket bound (not listening) to a free port of `host`, with SO_REUSEADDR.

    The transport's listener (also SO_REUSEADDR) can bind the same port while this socket holds it,
    so no other program gets the port between publishing it and listening on it. Close it after.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    return sock
