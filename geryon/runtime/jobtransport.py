"""A rank's handle on geryon's transport: its TransportConfig, the job's store, where it listens.

Everything here comes from the rank's `RankEnv` (geryon.runtime.env): the job secret (without it
there is no geryon transport: a torchrun or Slurm job on one host without GERYON_JOB_SECRET falls
back to gloo, see geryon.runtime.api; across hosts it refuses to start), the job id (hashed to the
transport's 32-bit job id), the policy and the classes' DSCP values, the address this rank's flows
listen on, MASTER_ADDR/PORT (the job's TCPStore: the launcher's, torchrun's agent's, or the one
engine rank 0 hosts; ranks publish their addresses there) and the transport timeout (seconds
without progress before a peer counts as dead; tests set a few seconds so that a dead peer ends a
job quickly).
"""

import hashlib
import socket
from datetime import timedelta

from geryon import envvars
from geryon.errors import ConfigError
from geryon.runtime.env import RankEnv

STORE_TIMEOUT = timedelta(minutes=5)


def transport_job_id(job_id: str | None) -> int:
    """The transport's 32-bit job id, derived from the launcher's job id string."""
    return int(hashlib.sha256((job_id or "").encode()).hexdigest()[:8], 16)


def class_dscp(spec: str | None) -> tuple[int, ...] | None:
    """DSCP values of a class spec (the job's classes); None for the transport's default two."""
    if not spec:
        return None
    from geryon.netconf.classes import parse_classes

    try:
        return tuple(c.dscp for c in parse_classes(spec))
    except ConfigError as exc:
        raise ConfigError(f"{envvars.CLASSES}={spec!r}: {exc}") from None


def transport_config(env: RankEnv, tracer=None):
    """The TransportConfig of this job, as the launcher described it."""
    from geryon.transport import TransportConfig

    settings = dict(secret=env.secret or "", job_id=transport_job_id(env.job_id), policy=env.policy,
                    timeout=env.transport_timeout, connect_timeout=env.connect_timeout,
                    thread_rt_priority=env.thread_rt_priority,
                    placement=env.ps_placement)
    dscp = class_dscp(env.classes)
    if dscp:
        settings["class_dscp"] = dscp
    return TransportConfig(tracer=tracer, tls=job_tls(env), **settings)


def job_tls(env: RankEnv):
    """The job's TLS credentials under --tls (geryon.transport.tls), else None."""
    from geryon.transport.tls import TlsCredentials, load_credentials

    if env.tls_credentials:
        return TlsCredentials.decode(env.tls_credentials)
    if env.tls_file:
        return load_credentials(env.tls_file)
    return None


def open_store(env: RankEnv):
    """A client of the job's TCPStore (the launcher's, or torchrun's agent store) at MASTER_ADDR:PORT,
    its values signed and verified with the job secret (geryon.transport.signed_store)."""
    from torch.distributed import TCPStore

    from geryon.transport.signed_store import SignedStore

    if not env.master_addr or not env.master_port:
        raise ConfigError("geryon's transport needs the job's store: MASTER_ADDR and MASTER_PORT are not set")
    if not env.secret:
        raise ConfigError("geryon's transport needs the job secret to read the job's store")
    return SignedStore(TCPStore(env.master_addr, env.master_port, is_master=False, wait_for_workers=False,
                                timeout=STORE_TIMEOUT), env.secret)


def listen_host(env: RankEnv) -> str:
    """The address this rank's flows listen on: the launcher's, else the one that routes to MASTER_ADDR."""
    if env.host_ip:
        return env.host_ip
    master = env.master_addr or "127.0.0.1"
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


def open_allreduce_group(env: RankEnv, config, store):
    """This rank's AllreduceGroup (the caller closes it), its peers found through the job's store."""
    from geryon.transport import AllreduceGroup
    from geryon.transport.hooks import peers_from_store

    host = listen_host(env)
    reservation = reserve_port(host)
    try:
        port = reservation.getsockname()[1]
        peers = peers_from_store(store, env.rank, env.world_size, host, port,
                                 prefix=f"{env.store_prefix}transport/allreduce")
        return AllreduceGroup(env.rank, env.world_size, peers, config, listen=(host, port))
    finally:
        reservation.close()
