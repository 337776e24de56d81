"""The emulated cluster's link MTU on real namespaces: every veth end and bridge, jumbo frames crossing
unfragmented, the state record, and bad values refused before anything is built."""

import sys

import pytest

from geryon.emulate import EmulatedCluster, fabric
from geryon.errors import ConfigError

pytestmark = pytest.mark.root

# one UDP datagram of argv[2] bytes to argv[1] with fragmentation forbidden; prints "sent" or the errno
SEND_DF = r"""
import errno, socket, sys
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.setsockopt(socket.IPPROTO_IP, 10, 2)   # IP_MTU_DISCOVER, IP_PMTUDISC_DO: never fragment
try:
    sock.sendto(b"x" * int(sys.argv[2]), (sys.argv[1], 5999))
    print("sent")
except OSError as exc:
    print(errno.errorcode[exc.errno])
"""

# receive one datagram on port 5999 and print its length (ready once it printed "listening")
RECEIVE = r"""
import socket
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind(("0.0.0.0", 5999))
sock.settimeout(20)
print("listening", flush=True)
print(len(sock.recv(65535)), flush=True)
"""

JUMBO_PAYLOAD = 9000 - 20 - 8      # IPv4 and UDP headers inside a 9000-byte MTU


def link_mtus(cluster) -> dict:
    from pyroute2 import IPRoute
    found = {}
    description = cluster.describe()
    devices = [(end["netns"], end["dev"]) for link in description["links"] for end in (link["a"], link["b"])]
    devices += [(switch["netns"], switch["bridge"]) for switch in description["switches"]]
    for netns, dev in devices:
        with IPRoute(netns=netns) as ipr:
            found[(netns, dev)] = ipr.link("get", ifname=dev)[0].get("IFLA_MTU")
    return found


def send_unfragmented(cluster, size: int) -> str:
    return cluster.run("h1", [sys.executable, "-c", SEND_DF, cluster.host("h2").ip, size], timeout=30,
                       capture_output=True, text=True, check=True).stdout.strip()


def test_jumbo_mtu_on_every_link_and_frames_cross_whole(unique_name):
    with EmulatedCluster(unique_name, hosts=2, topology="leafspine", mtu=9000) as cluster:
        mtus = link_mtus(cluster)
        assert len(mtus) == 2 * (2 + 2) + 3 and set(mtus.values()) == {9000}, mtus
        assert cluster.describe()["mtu"] == 9000
        assert EmulatedCluster.from_record(unique_name).mtu == 9000
        receiver = cluster.popen("h2", [sys.executable, "-c", RECEIVE], stdout=-1, text=True)
        try:
            assert receiver.stdout.readline().strip() == "listening"
            assert send_unfragmented(cluster, JUMBO_PAYLOAD) == "sent"
            assert receiver.stdout.readline().strip() == str(JUMBO_PAYLOAD)
        finally:
            receiver.kill()
            receiver.wait()


def test_default_mtu_refuses_a_jumbo_datagram(unique_name):
    with EmulatedCluster(unique_name, hosts=2) as cluster:
        assert set(link_mtus(cluster).values()) == {fabric.DEFAULT_MTU}
        assert cluster.describe()["mtu"] == fabric.DEFAULT_MTU
        assert send_unfragmented(cluster, JUMBO_PAYLOAD) == "EMSGSIZE"


@pytest.mark.parametrize("mtu", [1000, 70000, "jumbo"])
def test_bad_mtu_is_refused_before_building(unique_name, mtu):
    with pytest.raises(ConfigError, match="MTU"):
        EmulatedCluster(unique_name, hosts=2, mtu=mtu)
    assert not fabric.list_netns(f"gy{unique_name}-")
