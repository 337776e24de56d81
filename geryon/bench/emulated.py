"""Running transport roles on the hosts of an emulated cluster and collecting their JSON lines.

The cluster (geryon.emulate) is built by the caller; this module only starts
`python -m geryon.bench.transport_roles ...` inside host namespaces, waits, and parses stdout.
"""

from __future__ import annotations

from geryon.childproc import ChildProcess, child_env, finish_all, module_argv
from geryon.errors import TransportError

BASE_PORT = 29400
ROLES_MODULE = "geryon.bench.transport_roles"


def role_argv(role: str, *args) -> list[str]:
    return module_argv(ROLES_MODULE, role, *args)


def run_roles(cluster, placements: list[tuple[str, list[str]]], timeout: float = 600,
              env: dict | None = None) -> list[list[dict]]:
    """Start each (host, argv) at once; wait for all; return each process's JSON records."""
    children = []
    try:
        for host, argv in placements:
            children.append(ChildProcess.start(argv, netns=cluster.host(host).netns, env=child_env(env),
                                               name=f"{argv[argv.index(ROLES_MODULE) + 1]} on {host}",
                                               error=TransportError))
    except BaseException:
        for child in children:
            child.close()
        raise
    return finish_all(children, timeout)


def _spread(cluster, hosts: list[str], ranks: int) -> tuple[list[str], str, str]:
    """Ranks round-robin over `hosts`: each rank's host, every rank's listening address (its own port),
    and the gloo rendezvous address (rank 0's host)."""
    where = [hosts[r % len(hosts)] for r in range(ranks)]
    peers = ",".join(f"{cluster.host(h).ip}:{BASE_PORT + r}" for r, h in enumerate(where))
    return where, peers, f"{cluster.host(where[0]).ip}:{BASE_PORT + 99}"


def ring_placements(cluster, hosts: list[str], ranks: int, *args) -> list[tuple[str, list[str]]]:
    """geryon's ring: ranks spread round-robin over `hosts`, each listening on its own port."""
    where, peers, _ = _spread(cluster, hosts, ranks)
    return [(h, role_argv("allreduce", "--rank", r, "--peers", peers, *args)) for r, h in enumerate(where)]


def gloo_placements(cluster, hosts: list[str], ranks: int, *args) -> list[tuple[str, list[str]]]:
    """torch.distributed gloo, placed as the ring's ranks."""
    where, _, master = _spread(cluster, hosts, ranks)
    return [(h, role_argv("gloo", "--rank", r, "--world", ranks, "--master", master, *args))
            for r, h in enumerate(where)]


def wire_ring_placements(cluster, hosts: list[str], ranks: int, *args) -> list[tuple[str, list[str]]]:
    """The wire-ring role (plain TCP streams round the ring), placed as the ring's ranks, with gloo's master."""
    where, peers, master = _spread(cluster, hosts, ranks)
    return [(h, role_argv("wire-ring", "--rank", r, "--world", ranks, "--master", master, "--peers", peers, *args))
            for r, h in enumerate(where)]
