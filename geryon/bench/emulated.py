"""Running transport roles on the hosts of an emulated cluster and collecting their JSON lines.

The cluster (geryon.emulate) is built by the caller; this module only starts
`python -m geryon.bench.transport_roles ...` inside host namespaces, waits, and parses stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from geryon.errors import TransportError

BASE_PORT = 29400
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def role_argv(role: str, *args) -> list[str]:
    return [sys.executable, "-m", "geryon.bench.transport_roles", role, *map(str, args)]


def _env(extra=None) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_PACKAGE_ROOT,
                                                                     os.environ.get("PYTHONPATH")])))
    env.update(extra or {})
    return env


def run_roles(cluster, placements: list[tuple[str, list[str]]], timeout: float = 600,
              env: dict | None = None) -> list[list[dict]]:
    """Start each (host, argv) at once; wait for all; return each process's JSON records."""
    procs = [cluster.popen(host, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=_env(env)) for host, argv in placements]
    deadline = time.monotonic() + timeout
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outputs.append((proc.returncode, out, err))
    except subprocess.TimeoutExpired:
        raise TransportError(f"transport roles did not finish within {timeout:g} s") from None
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    records = []
    for (host, argv), (rc, out, err) in zip(placements, outputs):
        if rc != 0:
            raise TransportError(f"{argv[3]} on {host} exited {rc}: {err.strip()[-800:]}")
        records.append([json.loads(line) for line in out.splitlines() if line.startswith("{")])
    return records


def ring_placements(cluster, hosts: list[str], ranks: int, *args) -> list[tuple[str, list[str]]]:
    """Ranks spread round-robin over `hosts`, each listening on its own port."""
    where = [hosts[r % len(hosts)] for r in range(ranks)]
    peers = ",".join(f"{cluster.host(h).ip}:{BASE_PORT + r}" for r, h in enumerate(where))
    return [(h, role_argv("allreduce", "--rank", r, "--peers", peers, *args)) for r, h in enumerate(where)]


def gloo_placements(cluster, hosts: list[str], ranks: int, *args) -> list[tuple[str, list[str]]]:
    where = [hosts[r % len(hosts)] for r in range(ranks)]
    master = f"{cluster.host(where[0]).ip}:{BASE_PORT + 99}"
    return [(h, role_argv("gloo", "--rank", r, "--world", ranks, "--master", master, *args))
            for r, h in enumerate(where)]
