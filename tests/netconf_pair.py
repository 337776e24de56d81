"""Test helpers for geryon.netconf: a veth pair between two namespaces (the `veth_pair` fixture in
conftest.py), and real traffic across it.

Each helper runs a short Python program inside a namespace with `ip netns exec`, so the sockets (and the
DSCP marks they set with IP_TOS / IPV6_TCLASS) are real kernel traffic.
"""

import subprocess
import sys
import time
from dataclasses import dataclass



@dataclass(frozen=True)
class VethPair:
    """left_dev in left_ns <-> right_dev in right_ns, with IPv4 and IPv6 addresses."""

    left_ns: str
    right_ns: str
    left_dev: str = "gyl0"
    right_dev: str = "gyr0"
    left_ip: str = "10.198.0.1"
    right_ip: str = "10.198.0.2"
    left_ip6: str = "fd00:198::1"
    right_ip6: str = "fd00:198::2"


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


_UDP_SENDER = """
import socket, sys
dst, tos, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
family = socket.AF_INET6 if ":" in dst else socket.AF_INET
s = socket.socket(family, socket.SOCK_DGRAM)
if family == socket.AF_INET:
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
else:
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tos)
for _ in range(count):
    s.sendto(b"x" * size, (dst, 9))
"""

_UDP_FLOOD = """
import socket, sys, time
dst, tos, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
payload, end = b"z" * 1400, time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(100):
        try:
            s.sendto(payload, (dst, 9))
        except OSError:  # ENOBUFS when the queue is full
            pass
"""

_TCP_SERVER = """
import socket
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", 5999)); srv.listen(1)
print("ready", flush=True)
conn, _ = srv.accept()
total = 0
while chunk := conn.recv(65536):
    total += len(chunk)
print(total, flush=True)
"""

_TCP_CLIENT = """
import socket, sys
dst, tos, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket()
s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
s.connect((dst, 5999))
s.sendall(b"y" * size)
s.close()
"""


def in_netns(netns: str, program: str, *args) -> list[str]:
    """argv running a Python program inside netns."""
    return ["ip", "netns", "exec", netns, sys.executable, "-c", program, *map(str, args)]


def send_udp(netns: str, dst: str, dscp: int, count: int = 50, size: int = 1000) -> None:
    """Send `count` UDP datagrams of `size` bytes marked with `dscp` from netns to dst."""
    subprocess.run(in_netns(netns, _UDP_SENDER, dst, dscp << 2, count, size), check=True, timeout=60)


def flood_udp(netns: str, dst: str, dscp: int, seconds: float) -> subprocess.Popen:
    """Start sending UDP marked with `dscp` as fast as possible for `seconds`; returns the process."""
    return subprocess.Popen(in_netns(netns, _UDP_FLOOD, dst, dscp << 2, seconds))


def send_tcp(pair: VethPair, dscp: int, size: int) -> int:
    """Send `size` bytes over TCP marked with `dscp` from the left to the right namespace; bytes received."""
    server = subprocess.Popen(in_netns(pair.right_ns, _TCP_SERVER), stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        subprocess.run(in_netns(pair.left_ns, _TCP_CLIENT, pair.right_ip, dscp << 2, size), check=True,
                       timeout=60)
        received = int(server.stdout.readline().strip())
        server.wait(timeout=30)
        return received
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def wait_for(predicate, timeout: float = 5.0, interval: float = 0.05) -> bool:
    """Poll predicate until true or timeout (counters settle after the sender exits)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
