"""`RankEnv`: who this process is in the job, parsed once from the environment.

The launcher (geryon.launch.environment) writes the variables named in geryon.envvars; this is
their one reader. It also understands the engines clusters run jobs with (docs/engines.md): torchrun
(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR/PORT),
Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_NNODES, SLURM_STEP_NODELIST),
and a single process with nothing set. Under an engine the job's settings are the GERYON_* variables
the job spec sets, over those of the TOML file GERYON_CONFIG names; the job secret is
GERYON_JOB_SECRET or the file GERYON_JOB_SECRET_FILE names (never the store: anyone can write it).
A ps job names its servers (GERYON_SERVERS=S: the engine's first S ranks; GERYON_SERVERS_PER_NODE=P:
the first P local ranks of every node); the other ranks are the workers, renumbered 0..W-1 as under
geryon.launch (`split_roles`). Everything on the rank side (geryon.runtime) takes a RankEnv, never the
environment itself.
"""

import os
import re
import tomllib
from dataclasses import dataclass, field

from geryon import envvars as ev
from geryon.errors import ConfigError
from geryon.transport.policy import PLACEMENTS

SLURM_DEFAULT_PORT_BASE = 20000

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
    # under an engine (torchrun, Slurm): the process's rank as the engine numbered it (servers included),
    # its node, and whether the engine serves the store at MASTER_ADDR:PORT (else engine rank 0 hosts it)
    engine_rank: int = 0
    node: int = 0
    nodes: int = 1
    agent_store: bool = True
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
    server_device: str = "cpu"              # ps mode: where a server holds its shards (cpu | cuda)
    collectives: str = "geryon"             # allreduce mode: what carries the buckets (geryon.collectives)
    overlap: str = "barrier"                # allreduce mode: barrier | next-forward (geryon.runtime.ddp_overlap)
    plain_ddp: bool = False                 # allreduce mode: the script's own DDP over gloo, no transport
    restart_count: int = 0                  # how many times the job was restarted (geryon.launch or torchrun)
    ps_checkpoint_every: int = 0            # ps mode: the servers checkpoint every K steps (0: never) ...
    ps_checkpoint_dir: str | None = None    # ... into this directory (geryon.runtime.server_checkpoint)
    resumed_step: int = 0                   # ps mode: the consistent step found there, where training resumes
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
    def device(self):
        """This rank's torch.device: its GPU by local rank when CUDA is visible, else the CPU
        (geryon.runtime.device)."""
        from geryon.runtime.device import rank_device

        return rank_device(self.local_rank)

    @property
    def has_transport(self) -> bool:
        """A job secret was given and --plain-ddp was not: geryon's transport can authenticate and is
        wanted (else gloo does the work)."""
        return bool(self.secret) and not self.plain_ddp

    @classmethod
    def from_environ(cls, environ=None) -> "RankEnv":
        """Parse `environ` (default os.environ); bad values are ConfigErrors naming the variable."""
        env = with_config_file(os.environ if environ is None else environ)
        job = {
            "mode": env.get(ev.MODE) or "allreduce",
            "policy": env.get(ev.POLICY) or ev.DEFAULT_POLICY,
            "priority": env.get(ev.PRIORITY) or "coarse",
            "classes": env.get(ev.CLASSES) or None,
            "servers": _int(env, ev.SERVERS, 0),
            "job_id": env.get(ev.JOB_ID),
            "host_ip": env.get(ev.HOST_IP) or None,
            "timeline": env.get(ev.TIMELINE) or None,
            "secret": job_secret(env),
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
            "server_device": env.get(ev.SERVER_DEVICE) or "cpu",
            "collectives": env.get(ev.COLLECTIVES) or "geryon",
            "overlap": env.get(ev.OVERLAP) or "barrier",
            "plain_ddp": (env.get(ev.PLAIN_DDP) or "").strip().lower() in ("1", "true", "yes", "on"),
            # geryon.launch sets both; plain torchrun only its own
            "restart_count": _int(env, ev.RESTART_COUNT, None) or _int(env, ev.TORCH_RESTART_COUNT, 0),
            "ps_checkpoint_every": _int(env, ev.PS_CHECKPOINT_EVERY, 0),
            "ps_checkpoint_dir": env.get(ev.PS_CHECKPOINT_DIR) or None,
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
        if job["mode"] not in ev.MODES:
            raise ConfigError(f"{ev.MODE}={job['mode']!r}: use {' or '.join(ev.MODES)}")
        if not 0 <= job["thread_rt_priority"] <= 99:
            raise ConfigError(f"{ev.THREAD_RT}={job['thread_rt_priority']}: 0 (off) or a SCHED_RR priority 1..99")
        if job["ps_optimizer"] not in ev.PS_OPTIMIZER_MODES:
            raise ConfigError(f"{ev.PS_OPTIMIZER}={job['ps_optimizer']!r}: use "
                              f"{', '.join(ev.PS_OPTIMIZER_MODES)}")
        if job["ps_pull"] not in ev.PS_PULL_MODES:
            raise ConfigError(f"{ev.PS_PULL}={job['ps_pull']!r}: use {', '.join(ev.PS_PULL_MODES)}")
        if job["ps_placement"] not in PLACEMENTS:
            raise ConfigError(f"{ev.PS_PLACEMENT}={job['ps_placement']!r}: use {', '.join(PLACEMENTS)}")
        if job["server_device"] not in ev.SERVER_DEVICES:
            raise ConfigError(f"{ev.SERVER_DEVICE}={job['server_device']!r}: use {', '.join(ev.SERVER_DEVICES)}")
        if job["overlap"] not in ev.OVERLAP_MODES:
            raise ConfigError(f"{ev.OVERLAP}={job['overlap']!r}: use {', '.join(ev.OVERLAP_MODES)}")
        if job["ps_checkpoint_every"] and job["ps_checkpoint_dir"] and job["mode"] == "ps":
            from geryon.runtime.server_checkpoint import resume_step

            job["resumed_step"] = resume_step(job["ps_checkpoint_dir"])
        if "RANK" in env and "WORLD_SIZE" in env:
            world = _int(env, "WORLD_SIZE")
            if job["role"]:   # a worker geryon.launch started
                return cls(rank=_int(env, "RANK"), world_size=world, local_rank=_int(env, "LOCAL_RANK", 0),
                           launcher="geryon", master_addr=env.get("MASTER_ADDR"),
                           master_port=_int(env, "MASTER_PORT", None), workers=_int(env, ev.WORKERS, world),
                           **job)
            if env.get("TORCHELASTIC_RESTART_COUNT") and not env.get(ev.STORE_PREFIX):
                # a restarted torchrun job meets in the same store: its keys must not be the last attempt's
                job["store_prefix"] = f"{ev.DEFAULT_STORE_PREFIX}{env['TORCHELASTIC_RESTART_COUNT']}/"
            job["job_id"] = job["job_id"] or env.get("TORCHELASTIC_RUN_ID")
            local_world = _int(env, "LOCAL_WORLD_SIZE", world)
            return _engine_rank(cls, env, job, "torchrun", engine_rank=_int(env, "RANK"), world=world,
                                local_rank=_int(env, "LOCAL_RANK", 0), local_world=local_world,
                                node=_int(env, "GROUP_RANK", 0),
                                nodes=_int(env, "GROUP_WORLD_SIZE", -(-world // local_world)),
                                master_addr=env.get("MASTER_ADDR"), master_port=_int(env, "MASTER_PORT", None),
                                agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True")
        if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
            master_addr = env.get("MASTER_ADDR") or first_slurm_host(
                env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "")
            master_port = int(env.get("MASTER_PORT") or SLURM_DEFAULT_PORT_BASE
                              + int(env.get("SLURM_JOB_ID", "0")) % 20000)
            world = _int(env, "SLURM_NTASKS")
            nodes = _int(env, "SLURM_STEP_NUM_NODES", None) or _int(env, "SLURM_NNODES", 1)
            job["job_id"] = job["job_id"] or env.get("SLURM_JOB_ID")
            return _engine_rank(cls, env, job, "slurm", engine_rank=_int(env, "SLURM_PROCID"), world=world,
                                local_rank=_int(env, "SLURM_LOCALID", 0),
                                local_world=slurm_tasks_per_node(env, world, nodes),
                                node=_int(env, "SLURM_NODEID", 0), nodes=nodes,
                                master_addr=master_addr or None, master_port=master_port, agent_store=False)
        # a parameter server (geryon.launch gives it no RANK), or a single process
        return cls(launcher="geryon" if job["role"] else "single", master_addr=env.get("MASTER_ADDR"),
                   master_port=_int(env, "MASTER_PORT", None), workers=_int(env, ev.WORKERS, 1), **job)


def _engine_rank(cls, env, job: dict, launcher: str, *, engine_rank: int, world: int, local_rank: int,
                 local_world: int, node: int, nodes: int, master_addr, master_port, agent_store: bool):
    """The RankEnv of a process torchrun or Slurm started: worker or server, numbered as geryon.launch would."""
    if nodes > 1 and not job["secret"]:
        raise ConfigError(
            f"this {launcher} job spans {nodes} hosts, so geryon's flows need a per-job secret, which the "
            f"job's store cannot carry (anyone can write it): set {ev.JOB_SECRET} to the same random text "
            f"on every rank, or {ev.JOB_SECRET_FILE} to a file holding it (e.g. a mounted Kubernetes "
            "Secret; `openssl rand -hex 32` makes one); see docs/engines.md")
    for own in ("role", "rank_name", "server_rank"):   # geryon.launch's; an engine's ranks get them here
        job.pop(own)
    per_node = _int(env, ev.SERVERS_PER_NODE, 0)
    role, index, workers, servers = split_roles(engine_rank, world, local_rank, local_world, node,
                                                job.pop("servers"), per_node)
    if servers and job["mode"] != "ps":
        raise ConfigError(f"{ev.SERVERS} / {ev.SERVERS_PER_NODE} name parameter servers, which only a ps job "
                          f"has: set {ev.MODE}=ps, or leave them unset for allreduce")
    if servers and not job["secret"]:
        raise ConfigError(f"parameter servers talk to the workers over geryon's flows, which need the job "
                          f"secret: set {ev.JOB_SECRET} or {ev.JOB_SECRET_FILE} on every rank (docs/engines.md)")
    common = dict(launcher=launcher, engine_rank=engine_rank, node=node, nodes=nodes, agent_store=agent_store,
                  master_addr=master_addr, master_port=master_port, workers=workers, servers=servers, **job)
    if role == "server":
        return cls(role="server", rank_name=f"server{index}", server_rank=index, local_rank=local_rank,
                   **common)
    return cls(rank=index, world_size=workers, local_rank=local_rank, role="worker" if servers else None,
               **common)


def split_roles(engine_rank: int, world: int, local_rank: int, local_world: int, node: int,
                servers: int, servers_per_node: int) -> tuple[str, int, int, int]:
    """(role, index, workers, servers) of engine rank `engine_rank` of `world` processes.

    `servers` S > 0: engine ranks 0..S-1 serve; `servers_per_node` P > 0: the first P local ranks of
    every node (of `local_world` ranks each) serve. Servers are numbered by engine rank, workers too,
    from 0, so a worker's rank and world size count workers only, as under geryon.launch.
    """
    if servers and servers_per_node:
        raise ConfigError(f"set {ev.SERVERS} or {ev.SERVERS_PER_NODE}, not both")
    if servers < 0 or servers_per_node < 0:
        raise ConfigError(f"{ev.SERVERS} and {ev.SERVERS_PER_NODE} count ranks: give 0 or more")
    if servers_per_node:
        if world % local_world or servers_per_node >= local_world:
            raise ConfigError(
                f"{ev.SERVERS_PER_NODE}={servers_per_node} needs every node to run the same number of ranks, "
                f"more than {servers_per_node} ({world} ranks, {local_world} on this node): start more "
                f"processes per node, or name the servers with {ev.SERVERS}=S instead")
        nodes = world // local_world
        total = nodes * servers_per_node
        if local_rank < servers_per_node:
            return "server", node * servers_per_node + local_rank, world - total, total
        return ("worker", node * (local_world - servers_per_node) + local_rank - servers_per_node,
                world - total, total)
    if servers >= world:
        raise ConfigError(f"{ev.SERVERS}={servers} leaves no worker among the job's {world} ranks: "
                          f"start more ranks, or give fewer servers")
    if engine_rank < servers:
        return "server", engine_rank, world - servers, servers
    return "worker", engine_rank - servers, world - servers, servers


def with_config_file(env):
    """`env` over the settings of the TOML file GERYON_CONFIG names (a variable set wins over the file).

    The file's keys are the variables' names without GERYON_, in either case (`mode = "ps"`,
    `servers = 2`, `classes = "high:46,low:0"`); the secret does not belong in it (give the file's path
    in GERYON_JOB_SECRET_FILE instead).
    """
    path = env.get(ev.CONFIG)
    if not path:
        return env
    try:
        with open(path, "rb") as handle:
            settings = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"{ev.CONFIG}={path!r}: cannot read it ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{ev.CONFIG}={path!r} is not valid TOML: {exc}") from None
    merged = {}
    for key, value in settings.items():
        name = ev.PREFIX + key.upper().replace("-", "_")
        if name not in CONFIG_FILE_VARIABLES:
            allowed = ", ".join(sorted(v[len(ev.PREFIX):].lower() for v in CONFIG_FILE_VARIABLES))
            raise ConfigError(f"{ev.CONFIG}={path!r}: unknown setting {key!r}; the file may set {allowed}")
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{ev.CONFIG}={path!r}: {key} must be a single value, not {value!r}")
        merged[name] = str(value).lower() if isinstance(value, bool) else str(value)
    merged.update(env)
    return merged


# what a job's settings file may hold: the job's settings, never the secret or a rank's own identity
CONFIG_FILE_VARIABLES = frozenset({
    ev.MODE, ev.SERVERS, ev.SERVERS_PER_NODE, ev.POLICY, ev.PRIORITY, ev.CLASSES, ev.JOB_ID, ev.TIMELINE,
    ev.PS_OPTIMIZER, ev.PS_PULL, ev.PS_PLACEMENT, ev.SERVER_DEVICE, ev.COLLECTIVES, ev.JOB_SECRET_FILE,
    ev.TRANSPORT_TIMEOUT, ev.CONNECT_TIMEOUT, ev.THREAD_RT, ev.SEARCH_RUN, *ev.SEARCH_VARIABLES})


def job_secret(env) -> str | None:
    """The job secret: GERYON_JOB_SECRET, else the first line of the file GERYON_JOB_SECRET_FILE names."""
    if env.get(ev.JOB_SECRET):
        return env[ev.JOB_SECRET]
    path = env.get(ev.JOB_SECRET_FILE)
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            secret = handle.read().strip()
    except OSError as exc:
        raise ConfigError(f"{ev.JOB_SECRET_FILE}={path!r}: cannot read the job secret ({exc.strerror}); "
                          "mount the secret there on every rank") from None
    if not secret:
        raise ConfigError(f"{ev.JOB_SECRET_FILE}={path!r} is empty: write the job secret into it")
    return secret


def slurm_tasks_per_node(env, world: int, nodes: int) -> int:
    """Ranks per node under Slurm: SLURM_NTASKS_PER_NODE, else the first count of SLURM_STEP_TASKS_PER_NODE
    ('2(x3)' -> 2), else the even share."""
    if env.get("SLURM_NTASKS_PER_NODE"):
        return _int(env, "SLURM_NTASKS_PER_NODE")
    text = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
    match = re.match(r"(\d+)", text)
    return int(match.group(1)) if match else max(1, world // max(nodes, 1))


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
