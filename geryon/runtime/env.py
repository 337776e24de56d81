"""`RankEnv`: who this process is in the job, parsed once from the environment.

The launcher (geryon.launch.environment) writes the variables named in geryon.envvars; this is
their one reader. It also understands plain torchrun (RANK, WORLD_SIZE, MASTER_ADDR, ...), Slurm
(SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_NODELIST) and a single process with nothing
set. Everything on the rank side (geryon.runtime) takes a RankEnv, never the environment itself.
"""

import os
import re
from dataclasses import dataclass, field

from geryon import envvars as ev
from geryon.errors import ConfigError

SLURM_DEFAULT_PORT_BASE = 20000
MODES = ("allreduce", "ps")
PS_OPTIMIZER_MODES = ("auto", "server", "worker")
PS_PULL_MODES = ("auto", "end", "ahead")
PS_PLACEMENTS = ("bytes", "count")   # transport.config.PLACEMENTS

_current: "RankEnv | None" = None


@dataclass(frozen=True)
class RankEnv:
    """This rank's job, as the environment describes it (see `from_environ`)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    mode: str = "allreduce"                 # "allreduce" | "ps"
    policy: str = ev.DEFAULT_POLICY
    priority: str = "coarse"
    classes: str | None = None
    servers: int = 0
    launcher: str = "single"                # "geryon" | "torchrun" | "slurm" | "single"
    job_id: str | None = None
    host_ip: str | None = None
    timeline: str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    secret: str | None = field(default=None, repr=False)
    tls_file: str | None = None             # --tls: the job's credentials, a 0600 file ...
    tls_credentials: str | None = field(default=None, repr=False)   # ... or their base64 text (SSH)
    # set by geryon.launch only
    role: str | None = None                 # "worker" | "server"
    rank_name: str | None = None            # worker0, server1, ...
    server_rank: int = 0
    workers: int = 1
    backend: str | None = None
    iface: str | None = None
    store_prefix: str = ev.DEFAULT_STORE_PREFIX
    ps_optimizer: str = "auto"              # ps mode: who runs the optimizer (auto | server | worker)
    ps_pull: str = "auto"                   # ps mode: when the next parameters are asked for (auto | end | ahead)
    ps_placement: str = "bytes"             # ps mode: slices over servers (bytes | count)
    collectives: str = "geryon"             # allreduce mode: what carries the buckets (geryon.collectives)
    sync: str = "full"                      # allreduce mode: full, partial[:P], partial-static[:P] (geryon.syncmodes)
    straggler: str | None = None            # RANK:FACTOR: one worker made slower (geryon.runtime.straggler)
    # inherited from the launcher's environment
    transport_timeout: float = ev.DEFAULT_TRANSPORT_TIMEOUT_S
    connect_timeout: float | None = None    # TransportConfig.connect_timeout (None: transport_timeout)
    thread_rt_priority: int = 0             # TransportConfig.thread_rt_priority (0: normal scheduling)
    search: tuple[tuple[str, str], ...] = ()   # (GERYON_SEARCH_* variable, text) of the ones set
    search_run: str | None = None

    @property
    def distributed(self) -> bool:
        """More than one worker."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0, the one that should print summaries and save checkpoints."""
        return self.rank == 0

    @property
    def name(self) -> str:
        """worker0, server1, ...: the rank's name in output lines and traces."""
        return self.rank_name or f"worker{self.rank}"

    @property
    def has_transport(self) -> bool:
        """A job secret was given: geryon's transport can authenticate (else gloo does the work)."""
        return bool(self.secret)

    @classmethod
    def from_environ(cls, environ=None) -> "RankEnv":
        """Parse `environ` (default os.environ); bad values are ConfigErrors naming the variable."""
        env = os.environ if environ is None else environ
        job = {
            "mode": env.get(ev.MODE) or "allreduce",
            "policy": env.get(ev.POLICY) or ev.DEFAULT_POLICY,
            "priority": env.get(ev.PRIORITY) or "coarse",
            "classes": env.get(ev.CLASSES) or None,
            "servers": _int(env, ev.SERVERS, 0),
            "job_id": env.get(ev.JOB_ID),
            "host_ip": env.get(ev.HOST_IP) or None,
            "timeline": env.get(ev.TIMELINE) or None,
            "secret": env.get(ev.JOB_SECRET) or None,
            "tls_file": env.get(ev.TLS_FILE) or None,
            "tls_credentials": env.get(ev.TLS_CREDENTIALS) or None,
            "role": env.get(ev.ROLE) or None,
            "rank_name": env.get(ev.RANK_NAME) or None,
            "server_rank": _int(env, ev.SERVER_RANK, 0),
            "backend": env.get(ev.BACKEND) or None,
            "iface": env.get(ev.IFACE) or None,
            "store_prefix": env.get(ev.STORE_PREFIX) or ev.DEFAULT_STORE_PREFIX,
            "ps_optimizer": env.get(ev.PS_OPTIMIZER) or "auto",
            "ps_pull": env.get(ev.PS_PULL) or "auto",
            "ps_placement": env.get(ev.PS_PLACEMENT) or "bytes",
            "collectives": env.get(ev.COLLECTIVES) or "geryon",
            "sync": env.get(ev.SYNC) or "full",
            "straggler": env.get(ev.STRAGGLER) or None,
            "transport_timeout": _seconds(ev.TRANSPORT_TIMEOUT, env.get(ev.TRANSPORT_TIMEOUT) or "",
                                          ev.DEFAULT_TRANSPORT_TIMEOUT_S),
            "connect_timeout": _seconds(ev.CONNECT_TIMEOUT, env.get(ev.CONNECT_TIMEOUT) or "", None),
            "thread_rt_priority": _int(env, ev.THREAD_RT, 0),
            "search": tuple((name, env[name].strip()) for name in ev.SEARCH_VARIABLES
                            if (env.get(name) or "").strip()),
            "search_run": env.get(ev.SEARCH_RUN) or None,
        }
        if job["mode"] not in MODES:
            raise ConfigError(f"{ev.MODE}={job['mode']!r}: use allreduce or ps")
        if not 0 <= job["thread_rt_priority"] <= 99:
            raise ConfigError(f"{ev.THREAD_RT}={job['thread_rt_priority']}: 0 (off) or a SCHED_RR priority 1..99")
        if job["ps_optimizer"] not in PS_OPTIMIZER_MODES:
            raise ConfigError(f"{ev.PS_OPTIMIZER}={job['ps_optimizer']!r}: use "
                              f"{', '.join(PS_OPTIMIZER_MODES)}")
        if job["ps_pull"] not in PS_PULL_MODES:
            raise ConfigError(f"{ev.PS_PULL}={job['ps_pull']!r}: use {', '.join(PS_PULL_MODES)}")
        if job["ps_placement"] not in PS_PLACEMENTS:
            raise ConfigError(f"{ev.PS_PLACEMENT}={job['ps_placement']!r}: use {', '.join(PS_PLACEMENTS)}")
        if "RANK" in env and "WORLD_SIZE" in env:
            world = _int(env, "WORLD_SIZE")
            return cls(rank=_int(env, "RANK"), world_size=world, local_rank=_int(env, "LOCAL_RANK", 0),
                       launcher="geryon" if job["role"] else "torchrun",
                       master_addr=env.get("MASTER_ADDR"),
                       master_port=_int(env, "MASTER_PORT", None),
                       workers=_int(env, ev.WORKERS, world), **job)
        if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
            master_addr = env.get("MASTER_ADDR") or first_slurm_host(
                env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "")
            master_port = int(env.get("MASTER_PORT") or SLURM_DEFAULT_PORT_BASE
                              + int(env.get("SLURM_JOB_ID", "0")) % 20000)
            world = _int(env, "SLURM_NTASKS")
            return cls(rank=_int(env, "SLURM_PROCID"), world_size=world,
                       local_rank=_int(env, "SLURM_LOCALID", 0), launcher="slurm",
                       master_addr=master_addr or None, master_port=master_port, workers=world, **job)
        # a parameter server (geryon.launch gives it no RANK), or a single process
        return cls(launcher="geryon" if job["role"] else "single", master_addr=env.get("MASTER_ADDR"),
                   master_port=_int(env, "MASTER_PORT", None), workers=_int(env, ev.WORKERS, 1), **job)


def current() -> RankEnv:
    """This process's RankEnv, parsed from os.environ on the first call."""
    global _current
    if _current is None:
        _current = RankEnv.from_environ()
    return _current


def first_slurm_host(nodelist: str) -> str:
    """The first host of a Slurm node list: 'node[03-05,9],gpu1' -> 'node03'."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        return ""
    prefix, ranges = match.groups()
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


_REQUIRED = object()


def _int(env, name: str, default=_REQUIRED):
    text = env.get(name)
    if not text:
        if default is _REQUIRED:
            raise ConfigError(f"{name} is not set")
        return default
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not a whole number") from None


def _seconds(name: str, text: str, default: float | None) -> float | None:
    """The positive, finite number of seconds in variable `name`, or `default` when it is unset."""
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):   # also refuses nan
        raise ConfigError(f"{name}={text!r} must be a positive, finite number of seconds")
    return value
