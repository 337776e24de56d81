"""Topologies as plain data: which namespaces exist, which links join them, at what rate.

A topology knows nothing about the kernel; `cluster.py` applies it. Every name it produces starts
with ``gy<cluster name>-`` so that `clean.py` can find it again.

- `star`: N hosts, one switch namespace ``gy<name>-sw`` with a bridge; one link per host.
- `leafspine`: two leaf switches ``gy<name>-l1``/``-l2`` and a spine ``gy<name>-sp``; hosts alternate
  between the leaves (h1 on l1, h2 on l2, ...); each leaf has one uplink to the spine running at a
  fraction of the host rate (by default half the aggregate of the bigger leaf's hosts: 2:1
  oversubscribed). All switches bridge into one L2 segment; the tree has no loops, so no STP.

Addresses: host hi gets 10.199.0.i/16 (one subnet, one L2 segment); switches have no address.
"""

import math
import re
from dataclasses import dataclass, field

from geryon.errors import ConfigError
from geryon.rates import parse_rate

MIN_HOSTS = 2
MAX_HOSTS = 64
MAX_NAME_LEN = 6
SUBNET = "10.199.0.0/16"
PREFIX_LEN = 16
HOST_IFACE = "eth0"
BRIDGE = "br0"
TOPOLOGIES = ("star", "leafspine")
_NAME = re.compile(r"^[a-z0-9]{1,%d}$" % MAX_NAME_LEN)


@dataclass(frozen=True)
class HostSpec:
    """A host: its own namespace with one interface toward its switch."""

    name: str
    netns: str
    ip: str
    iface: str = HOST_IFACE
    switch: str = ""  # name of the switch it hangs off


@dataclass(frozen=True)
class SwitchSpec:
    """A switch: a namespace holding one Linux bridge over all its ports."""

    name: str
    netns: str
    bridge: str = BRIDGE


@dataclass(frozen=True)
class Endpoint:
    """One end of a link: a device in a namespace; `bridged` ends are enslaved to the bridge there."""

    netns: str
    dev: str
    bridged: bool


@dataclass(frozen=True)
class LinkSpec:
    """A veth pair; each end's egress is shaped at `rate` bits/s."""

    a: Endpoint
    b: Endpoint
    rate: int


@dataclass(frozen=True)
class Topology:
    """Everything needed to build one cluster, with nothing applied yet."""

    name: str
    kind: str
    rate: int
    hosts: tuple[HostSpec, ...]
    switches: tuple[SwitchSpec, ...]
    links: tuple[LinkSpec, ...]
    uplink_rate: int | None = None
    extra: dict = field(default_factory=dict)

    @property
    def namespaces(self) -> list[str]:
        return [h.netns for h in self.hosts] + [s.netns for s in self.switches]

    def host(self, name: str) -> HostSpec:
        for host in self.hosts:
            if host.name == name:
                return host
        known = ", ".join(h.name for h in self.hosts)
        raise ConfigError(f"cluster {self.name!r} has no host {name!r} (hosts: {known})")

    def switch_port(self, host_name: str) -> Endpoint:
        """The switch-side end of the link to `host_name`: the bottleneck for traffic into that host."""
        host = self.host(host_name)
        for link in self.links:
            if link.a.netns == host.netns:
                return link.b
        raise ConfigError(f"host {host_name!r} has no link")  # cannot happen for built topologies


def check_name(name: str) -> str:
    """Return `name` if it is a valid cluster name, else raise ConfigError saying what is allowed."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(
            f"bad cluster name {name!r}: use 1 to {MAX_NAME_LEN} lowercase letters or digits, e.g. 'demo'")
    return name


def check_host_count(hosts) -> int:
    """Return `hosts` if it is a supported number of hosts, else raise ConfigError."""
    if isinstance(hosts, bool) or not isinstance(hosts, int) or not MIN_HOSTS <= hosts <= MAX_HOSTS:
        raise ConfigError(f"bad host count {hosts!r}: an emulated cluster has {MIN_HOSTS} to {MAX_HOSTS} hosts")
    return hosts


def netns_prefix(name: str) -> str:
    """Every namespace of cluster `name` starts with this."""
    return f"gy{name}-"


def host_ip(index: int) -> str:
    """Address of host `index` (1-based) inside 10.199.0.0/16."""
    return f"10.199.{index // 256}.{index % 256}"


def _hosts(name: str, count: int, switch_of) -> tuple[HostSpec, ...]:
    prefix = netns_prefix(name)
    return tuple(HostSpec(name=f"h{i}", netns=f"{prefix}h{i}", ip=host_ip(i), switch=switch_of(i))
                 for i in range(1, count + 1))


def _host_link(host: HostSpec, switch: SwitchSpec, rate: int) -> LinkSpec:
    # the switch port is named after the host it leads to, so `tc -n gyX-sw qdisc show dev h3` reads well
    return LinkSpec(a=Endpoint(host.netns, host.iface, bridged=False),
                    b=Endpoint(switch.netns, host.name, bridged=True), rate=rate)


def star(name: str, hosts: int, rate) -> Topology:
    """N hosts on one switch."""
    check_name(name)
    check_host_count(hosts)
    rate = parse_rate(rate)
    switch = SwitchSpec(name="sw", netns=f"{netns_prefix(name)}sw")
    host_specs = _hosts(name, hosts, lambda i: switch.name)
    links = tuple(_host_link(h, switch, rate) for h in host_specs)
    return Topology(name=name, kind="star", rate=rate, hosts=host_specs, switches=(switch,), links=links)


def default_uplink_fraction(hosts: int) -> float:
    """Uplink rate as a fraction of the host rate: half of the bigger leaf's aggregate (2:1 oversubscribed)."""
    return math.ceil(hosts / 2) / 2


def leafspine(name: str, hosts: int, rate, uplink_fraction: float | None = None) -> Topology:
    """Two leaves and a spine; leaf-spine links run at `uplink_fraction` x host rate."""
    check_name(name)
    check_host_count(hosts)
    rate = parse_rate(rate)
    if uplink_fraction is None:
        uplink_fraction = default_uplink_fraction(hosts)
    if not isinstance(uplink_fraction, (int, float)) or isinstance(uplink_fraction, bool) \
            or not 0 < uplink_fraction <= MAX_HOSTS:
        raise ConfigError(f"bad uplink fraction {uplink_fraction!r}: give a positive number such as 0.5")
    uplink_rate = parse_rate(int(round(rate * uplink_fraction)))
    prefix = netns_prefix(name)
    leaves = (SwitchSpec(name="l1", netns=f"{prefix}l1"), SwitchSpec(name="l2", netns=f"{prefix}l2"))
    spine = SwitchSpec(name="sp", netns=f"{prefix}sp")
    host_specs = _hosts(name, hosts, lambda i: leaves[(i - 1) % 2].name)
    leaf_of = {leaf.name: leaf for leaf in leaves}
    links = [_host_link(h, leaf_of[h.switch], rate) for h in host_specs]
    for leaf in leaves:
        links.append(LinkSpec(a=Endpoint(leaf.netns, "up", bridged=True),
                              b=Endpoint(spine.netns, leaf.name, bridged=True), rate=uplink_rate))
    return Topology(name=name, kind="leafspine", rate=rate, hosts=host_specs,
                    switches=(*leaves, spine), links=tuple(links), uplink_rate=uplink_rate,
                    extra={"uplink_fraction": uplink_fraction})


def build_topology(kind: str, name: str, hosts: int, rate, uplink_fraction: float | None = None) -> Topology:
    """Dispatch on the topology name ('star' or 'leafspine')."""
    if kind == "star":
        if uplink_fraction is not None:
            raise ConfigError("an uplink fraction only applies to the leafspine topology")
        return star(name, hosts, rate)
    if kind == "leafspine":
        return leafspine(name, hosts, rate, uplink_fraction)
    raise ConfigError(f"unknown topology {kind!r}: choose one of {', '.join(TOPOLOGIES)}")
