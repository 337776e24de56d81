"""Applies a `Topology` to the kernel: namespaces, veth pairs, bridges, addresses, egress queues.

Division of labour: `topology.py` says what should exist; this module makes it exist (pyroute2
netlink, one socket per namespace) and takes it away again; `cluster.py` decides when. Veth pairs are
created directly inside their namespaces (peer placed by IFLA_NET_NS_FD), so nothing ever appears in
the root namespace, even if building stops halfway.
"""

import logging
import os
import signal
import time

from pyroute2 import IPRoute, netns

from geryon.emulate.topology import PREFIX_LEN, Endpoint, Topology
from geryon.errors import EmulationError
from geryon.netconf import forget_netns_state
from geryon.netnames import NETNS_DIR

log = logging.getLogger(__name__)

# offload=False: a veth whose gso_max_segs is 1 makes TCP emit MTU-sized packets, so HTB never holds a
# high-priority packet behind a 64 KB low-priority super-packet (5 ms at 100 Mbit/s). Set by netlink at
# creation, which is cheaper than running ethtool in every namespace. See geryon/emulate/__init__.py.
NO_OFFLOAD_GSO_SEGS = 1
# MTU of every emulated link (veth ends and bridges). 1500 is Ethernet's default; 9000 the jumbo frames
# of datacenter DL clusters, where TCP/IP headers take 0.7% of the wire instead of 4.4%.
DEFAULT_MTU = 1500
MIN_MTU, MAX_MTU = 1280, 65535   # IPv6's minimum; veth's maximum


def netns_exists(name: str) -> bool:
    return os.path.exists(os.path.join(NETNS_DIR, name))


def list_netns(prefix: str = "gy") -> list[str]:
    """Names of the namespaces whose name starts with `prefix`."""
    return sorted(n for n in netns.listnetns() if n.startswith(prefix))


class NamespaceSockets:
    """One open netlink socket per namespace, closed together."""

    def __init__(self):
        self._sockets: dict[str, IPRoute] = {}

    def __getitem__(self, name: str) -> IPRoute:
        if name not in self._sockets:
            self._sockets[name] = IPRoute(netns=name)
        return self._sockets[name]

    def close(self):
        for sock in self._sockets.values():
            try:
                sock.close()
            except Exception:  # closing must never hide the real error
                log.debug("closing netlink socket failed", exc_info=True)
        self._sockets.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _index(ipr: IPRoute, dev: str) -> int:
    found = ipr.link_lookup(ifname=dev)
    if not found:
        raise EmulationError(f"interface {dev!r} vanished while building the cluster")
    return found[0]


def build_fabric(topo: Topology, offload: bool = True, mtu: int = DEFAULT_MTU) -> None:
    """Create every namespace, link, bridge and address of `topo` (no queues yet).

    On failure the caller must run `remove_namespaces(topo.namespaces)`: partial state stays behind.
    """
    for name in topo.namespaces:
        netns.create(name)
    with NamespaceSockets() as sockets:
        for name in topo.namespaces:
            ipr = sockets[name]
            ipr.link("set", index=_index(ipr, "lo"), state="up")
        for switch in topo.switches:
            ipr = sockets[switch.netns]
            ipr.link("add", ifname=switch.bridge, kind="bridge", br_stp_state=0, br_forward_delay=0, mtu=mtu)
        for link in topo.links:
            _add_veth(sockets, link.a, link.b, offload, mtu)
        for host in topo.hosts:
            ipr = sockets[host.netns]
            index = _index(ipr, host.iface)
            ipr.addr("add", index=index, address=host.ip, prefixlen=PREFIX_LEN)
            ipr.link("set", index=index, state="up")
        for switch in topo.switches:
            ipr = sockets[switch.netns]
            bridge = _index(ipr, switch.bridge)
            for link in topo.links:
                for end in (link.a, link.b):
                    if end.netns == switch.netns and end.bridged:
                        ipr.link("set", index=_index(ipr, end.dev), master=bridge, state="up")
            ipr.link("set", index=bridge, state="up")


def _add_veth(sockets: NamespaceSockets, a: Endpoint, b: Endpoint, offload: bool, mtu: int) -> None:
    extra = {"mtu": mtu} if offload else {"mtu": mtu, "IFLA_GSO_MAX_SEGS": NO_OFFLOAD_GSO_SEGS}
    sockets[a.netns].link("add", ifname=a.dev, kind="veth",
                          peer={"ifname": b.dev, "net_ns_fd": b.netns, **extra}, **extra)


def netns_pids(names: list[str]) -> dict[str, list[int]]:
    """PIDs of processes living in each of the named namespaces (matched by namespace inode)."""
    wanted = {}
    for name in names:
        try:
            st = os.stat(os.path.join(NETNS_DIR, name))
        except OSError:
            continue
        wanted[(st.st_dev, st.st_ino)] = name
    found: dict[str, list[int]] = {name: [] for name in wanted.values()}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        name = wanted.get((st.st_dev, st.st_ino))
        if name is not None:
            found[name].append(int(entry))
    return found


def kill_netns_processes(names: list[str], grace_s: float = 0.5) -> list[int]:
    """Stop every process inside the named namespaces: SIGTERM, then SIGKILL after `grace_s`."""
    pids = [pid for group in netns_pids(names).values() for pid in group]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if _alive(pid)]
            if pids:
                time.sleep(0.02)
        if not pids:
            break
    return pids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def remove_namespaces(names: list[str]) -> list[str]:
    """Kill what runs in the named namespaces and remove them; returns the ones actually removed.

    Tolerates names that do not exist. Removing a namespace deletes its veth ends, and with them their
    peers in other namespaces.
    """
    present = [n for n in names if netns_exists(n)]
    if not present:
        return []
    survivors = kill_netns_processes(present)
    if survivors:
        log.warning("processes %s did not die; their namespaces linger until they exit", survivors)
    removed = []
    for name in present:
        try:
            netns.remove(name)
            removed.append(name)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise EmulationError(f"could not remove namespace {name}: {exc}") from exc
    forget_queue_records(names)
    return removed


def forget_queue_records(names: list[str]) -> None:
    """Drop geryon.netconf's per-device records of the named (removed) namespaces."""
    for name in names:
        if not netns_exists(name):
            forget_netns_state(name)
