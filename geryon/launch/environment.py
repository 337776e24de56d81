"""What each rank starts with: its command line, and its environment (torch's variables plus geryon's).

Workers see what torchrun gives them (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, TORCHELASTIC_RESTART_COUNT, and TORCHELASTIC_USE_AGENT_STORE=True because the launcher
hosts the TCPStore), so a plain `torch.distributed.init_process_group("gloo")` works.
Servers get no RANK: they are not part of the workers' process group. Every rank gets the variables
of geryon.envvars.JOB_VARIABLES, which geryon.runtime.env.RankEnv reads back.
"""

import sys

from geryon import envvars as ev
from geryon.envvars import JOB_VARIABLES
from geryon.launch.config import ENV_TWINS, LaunchConfig
from geryon.launch.placement import RankSpec

TORCH_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")
# Launcher-only twins: meaningless inside a rank, and a nested launcher must not inherit them.
_LAUNCHER_ONLY = tuple(ENV_TWINS[k] for k in ("emulate", "local", "hostfile", "known_hosts", "timeout",
                                              "grace", "bw", "topology", "max_classes", "tls",
                                              "max_restarts", "tenants", "tenant", "start"))


def rank_argv(config: LaunchConfig, spec: RankSpec, python: str | None = None) -> list[str]:
    """Workers run the user's script; servers run geryon's server role."""
    python = python or sys.executable
    if spec.role == "server":
        return [python, "-u", "-m", "geryon.runtime.server"]
    return [python, "-u", config.script, *config.script_args]


def job_environment(config: LaunchConfig, spec: RankSpec, master_addr: str, master_port: int,
                    local_world_size: int, host_ip: str | None = None,
                    iface: str | None = None) -> dict[str, str]:
    """The variables geryon sets for one rank (to be laid over the inherited environment)."""
    env = {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "PYTHONUNBUFFERED": "1",
        ev.ROLE: spec.role,
        ev.RANK_NAME: spec.name,
        ev.WORKERS: str(config.workers),
        ev.SERVERS: str(config.servers),
        ev.MODE: config.mode,
        ev.POLICY: config.policy,
        ev.PRIORITY: config.priority,
        ev.CLASSES: config.classes or "",
        ev.JOB_ID: config.job_id,
        ev.JOB_SECRET: config.secret,
        ev.BACKEND: config.backend,
        ev.TIMELINE: config.timeline or "",
        ev.STORE_PREFIX: ev.DEFAULT_STORE_PREFIX,
        ev.PS_OPTIMIZER: config.ps_optimizer,
        ev.PS_PULL: config.ps_pull,
        ev.PS_PLACEMENT: config.ps_placement,
        ev.SERVER_DEVICE: config.server_device,
        ev.COLLECTIVES: config.collectives,
        ev.OVERLAP: config.overlap,
        ev.PLAIN_DDP: "1" if config.plain_ddp else "",
        ev.PS_CHECKPOINT_EVERY: str(config.ps_checkpoint_every),
        ev.PS_CHECKPOINT_DIR: config.ps_checkpoint_dir or "",
        ev.RESTART_COUNT: str(config.restart_count),
        ev.TORCH_RESTART_COUNT: str(config.restart_count),
        ev.SYNC: config.sync,
        ev.STRAGGLER: config.straggler or "",
        "WORLD_SIZE": str(config.workers),
    }
    if config.max_classes:
        env[ev.SEARCH_CLASSES] = str(config.max_classes)  # the search's K (rank 0's is everyone's)
    if spec.role == "worker":
        env.update(RANK=str(spec.index), LOCAL_RANK=str(spec.local_rank), GROUP_RANK=str(spec.host),
                   LOCAL_WORLD_SIZE=str(local_world_size))
        env[ev.WORKER_RANK] = str(spec.index)
    else:
        env[ev.SERVER_RANK] = str(spec.index)
    if config.tls_file:
        env[ev.TLS_FILE] = config.tls_file
    if host_ip:
        env[ev.HOST_IP] = host_ip
    if iface:
        env[ev.IFACE] = iface
        env["GLOO_SOCKET_IFNAME"] = iface
    return env


def merged_environment(inherited, job_env: dict[str, str]) -> dict[str, str]:
    """`inherited` (e.g. os.environ) without stale rank/launcher variables, overlaid with `job_env`."""
    env = {k: v for k, v in inherited.items()
           if k not in TORCH_RANK_VARIABLES and k not in _LAUNCHER_ONLY and k not in JOB_VARIABLES}
    env.update(job_env)
    return env


def local_world_sizes(specs: list[RankSpec]) -> dict[int, int]:
    """Workers per host index."""
    sizes: dict[int, int] = {}
    for spec in specs:
        if spec.role == "worker":
            sizes[spec.host] = sizes.get(spec.host, 0) + 1
    return sizes
