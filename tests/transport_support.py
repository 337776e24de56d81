"""Helpers shared by the transport tests."""

import socket


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports that were free a moment ago (all bound at once, then released)."""
    holders = [socket.socket() for _ in range(count)]
    for s in holders:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in holders]
    for s in holders:
        s.close()
    return ports
