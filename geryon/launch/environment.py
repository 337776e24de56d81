"""What each rank starts with: its command line, and its environment (torch's variables plus geryon's).

Workers see what torchrun gives them (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, and TORCHELASTIC_USE_AGENT_STORE=True because the launcher hosts the TCPStore), so a
plain `torch.distributed.init_process_group("gloo")` works. Servers get no RANK: they are not part
of the workers' process group. Every rank gets the GERYON_* variables listed in JOB_VARIABLES.
"""

import sys

from geryon.launch.config import ENV_TWINS, LaunchConfig
from geryon.launch.placement import RankSpec

JOB_VARIABLES = {
    "GERYON_ROLE": "worker or server",
    "GERYON_RANK_NAME": "worker0, server1, ... (the prefix of the rank's output lines)",
    "GERYON_WORKER_RANK": "workers: the same as RANK",
    "GERYON_SERVER_RANK": "servers: 0..M-1",
    "GERYON_WORKERS": "number of workers",
    "GERYON_SERVERS": "number of parameter servers (0 in allreduce mode)",
    "GERYON_MODE": "ps or allreduce",
    "GERYON_POLICY": "vanilla, slicing, endhost or geryon",
    "GERYON_PRIORITY": "coarse, search or threshold=T",
    "GERYON_CLASSES": "priority classes 'name:dscp,...' (empty: the default two)",
    "GERYON_JOB_ID": "this job's id (also the emulated cluster's name)",
    "GERYON_JOB_SECRET": "a per-job secret; the transport authenticates its connections with it",
    "GERYON_BACKEND": "local, emulate or ssh",
    "GERYON_HOST_IP": "the address this rank should bind its geryon flows to",
    "GERYON_IFACE": "the interface of that address, when known",
    "GERYON_TIMELINE": "where the job's trace goes (empty: no trace)",
    "GERYON_STORE_PREFIX": "key prefix in the TCPStore reserved for geryon's own rendezvous",
    "GERYON_PS_OPTIMIZER": "ps mode: auto, server or worker (who runs the optimizer)",
}
TORCH_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")
# Launcher-only twins: meaningless inside a rank, and a nested launcher must not inherit them.
_LAUNCHER_ONLY = tuple(ENV_TWINS[k] for k in ("emulate", "local", "hostfile", "known_hosts", "timeout",
                                              "grace", "bw", "topology"))
STORE_PREFIX = "geryon/"


def rank_argv(config: LaunchConfig, spec: RankSpec, python: str | None = None) -> list[str]:
    """Workers run the user's script; servers run geryon's server role."""
    python = python or sys.executable
    if spec.role == "server":
        return [python, "-u", "-m", "geryon.launch.server"]
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
        "GERYON_ROLE": spec.role,
        "GERYON_RANK_NAME": spec.name,
        "GERYON_WORKERS": str(config.workers),
        "GERYON_SERVERS": str(config.servers),
        "GERYON_MODE": config.mode,
        "GERYON_POLICY": config.policy,
        "GERYON_PRIORITY": config.priority,
        "GERYON_CLASSES": config.classes or "",
        "GERYON_JOB_ID": config.job_id,
        "GERYON_JOB_SECRET": config.secret,
        "GERYON_BACKEND": config.backend,
        "GERYON_TIMELINE": config.timeline or "",
        "GERYON_STORE_PREFIX": STORE_PREFIX,
        "GERYON_PS_OPTIMIZER": config.ps_optimizer,
        "WORLD_SIZE": str(config.workers),
    }
    if spec.role == "worker":
        env.update(RANK=str(spec.index), LOCAL_RANK=str(spec.local_rank), GROUP_RANK=str(spec.host),
                   LOCAL_WORLD_SIZE=str(local_world_size), GERYON_WORKER_RANK=str(spec.index))
    else:
        env["GERYON_SERVER_RANK"] = str(spec.index)
    if host_ip:
        env["GERYON_HOST_IP"] = host_ip
    if iface:
        env["GERYON_IFACE"] = iface
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
