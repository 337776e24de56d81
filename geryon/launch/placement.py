"""Which ranks a job has and where each one runs, as plain data (no processes are started here).

Workers are ranks 0..N-1 of the data-parallel job (RANK / WORLD_SIZE count workers only, so a
script shards its data the same way under torchrun); parameter servers are numbered separately
(server0..serverM-1). A `RankSpec.host` is an index into the backend's list of hosts.
"""

from dataclasses import dataclass

from geryon.launch.config import LaunchConfig


@dataclass(frozen=True)
class RankSpec:
    """One process of the job."""

    role: str          # "worker" | "server"
    index: int         # worker rank, or server number
    host: int          # index into the backend's hosts
    local_rank: int    # position among the workers (or servers) on the same host

    @property
    def name(self) -> str:
        """The prefix of its output lines, e.g. worker0, server1."""
        return f"{self.role}{self.index}"


def place_on_one_host(config: LaunchConfig) -> list[RankSpec]:
    """Local backend: every rank on host 0."""
    return ([RankSpec("worker", i, 0, i) for i in range(config.workers)]
            + [RankSpec("server", j, 0, j) for j in range(config.servers)])


def place_one_per_host(config: LaunchConfig) -> list[RankSpec]:
    """Emulated cluster: worker i on host i, server j on host workers+j (hosts sized to the job)."""
    return ([RankSpec("worker", i, i, 0) for i in range(config.workers)]
            + [RankSpec("server", j, config.workers + j, 0) for j in range(config.servers)])


def place_by_hostfile(config: LaunchConfig) -> list[RankSpec]:
    """SSH hosts: server j on host j; workers fill the hosts' slots in hostfile order."""
    slots = [h.slots for h in config.hosts]
    if config.servers > len(slots) or config.workers > sum(slots):  # config validation prevents this
        raise ValueError("the hostfile cannot hold this job")
    workers, host, used = [], 0, 0
    for i in range(config.workers):
        while used == slots[host]:
            host, used = host + 1, 0
        workers.append(RankSpec("worker", i, host, used))
        used += 1
    return workers + [RankSpec("server", j, j, 0) for j in range(config.servers)]
