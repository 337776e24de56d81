"""Loopback ports for the listeners the tests start themselves (a rendezvous, a rank's flows, sshd).

A port picked by binding to port 0 comes from the kernel's ephemeral range, where any outgoing
connection of a test running beside this one may take it as its source port between the moment the
port is picked and the moment the test's process binds it. These ports come from below that range,
where the kernel never picks, and from a span of their own per xdist worker, and each is checked
bindable when picked; a worker hands them out in turn, so a port comes back only after SPAN others.
"""

import itertools
import os
import socket
from pathlib import Path

SPAN = 4000                 # ports per xdist worker
GAP = 1000                  # kept free below the ephemeral range
LOWEST = 10000


def _worker_span() -> range | None:
    try:
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    start = ephemeral_low - GAP - SPAN * (index + 1)
    return range(start, start + SPAN) if start >= LOWEST else None


_SPAN = _worker_span()
_turn = itertools.count(os.getpid() % SPAN)


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports free now, outside the ephemeral range and this worker's own."""
    if _SPAN is None:        # an ephemeral range too low to leave room below it: the kernel's choice
        holders = [socket.socket() for _ in range(count)]
        try:
            for holder in holders:
                holder.bind(("127.0.0.1", 0))
            return [holder.getsockname()[1] for holder in holders]
        finally:
            for holder in holders:
                holder.close()
    ports: list[int] = []
    for _ in range(len(_SPAN)):
        port = _SPAN[next(_turn) % len(_SPAN)]
        if port not in ports and _bindable(port):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise OSError(f"no {count} free loopback ports in {_SPAN.start}-{_SPAN.stop - 1}")


def free_port() -> int:
    return free_ports(1)[0]
