"""`EmulatedCluster`: hosts in network namespaces behind priority-queued software switches.

The cluster's life cycle lives here: validate the request, claim the name, build the fabric
(`fabric.py`), program every egress with `geryon.netconf`, write the state record (`state.py`), run
commands in hosts, and take it all down again, always, even when building failed halfway.

    with EmulatedCluster("demo", hosts=3, bw="100mbit") as cluster:
        server = cluster.popen("h2", ["iperf3", "-s", "-1"])
        cluster.run("h1", ["iperf3", "-c", cluster.host("h2").ip, "-t", "3"])
"""

import logging
import os
import subprocess
import time
from dataclasses import asdict, dataclass

from geryon.emulate import fabric, state
from geryon.emulate.topology import (SUBNET, Topology, build_topology, check_host_count, check_name,
                                     netns_prefix)
from geryon.childproc import in_netns
from geryon.errors import ConfigError, EmulationError, NameInUse, require_root
from geryon.netconf import (PriorityClass, install_priority_queues, install_shaping, parse_classes)
from geryon.netconf.plan import ACK_MODES, parse_ack_priority
from geryon.rates import format_rate, parse_rate
from geryon.signals import interrupts_deferred

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Host:
    """One emulated host: its namespace, address and interface toward the switch."""

    name: str
    netns: str
    ip: str
    iface: str = "eth0"


def exec_argv(netns: str, argv: list[str]) -> list[str]:
    """`argv` wrapped so that it runs inside `netns` (nsenter execs it: the PID stays the command's)."""
    if not argv:
        raise ConfigError("no command given to run in the host")
    return in_netns(netns, argv)


def check_mtu(mtu) -> int:
    """The links' MTU as an int; ConfigError outside what a veth takes."""
    try:
        value = int(mtu)
    except (TypeError, ValueError):
        raise ConfigError(f"MTU {mtu!r} is not a number of bytes; give e.g. 1500 or 9000") from None
    if not fabric.MIN_MTU <= value <= fabric.MAX_MTU:
        raise ConfigError(f"MTU {value} is out of range: give {fabric.MIN_MTU}-{fabric.MAX_MTU} bytes "
                          "(1500 is Ethernet's default, 9000 jumbo frames)")
    return value


def _read_proc(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return "unknown"


# Where TCP pure ACKs ride on every priority-queued egress (host and switch port), so that a receiver's
# ACKs do not wait behind bulk data going the other way: "off", "top" (the top priority class) or "own" (a
# class above it; geryon.netconf.plan). Measured in docs/transport.md.
DEFAULT_ACK_PRIORITY = "own"


def add_ack_priority_argument(parser, scope: str) -> None:
    """`--ack-priority off|top|own` (default DEFAULT_ACK_PRIORITY) on a command building emulated clusters;
    `scope` says whose traffic it applies to, e.g. "for every policy alike"."""
    parser.add_argument("--ack-priority", choices=ACK_MODES, default=DEFAULT_ACK_PRIORITY,
                        help=f"TCP pure ACKs on every emulated egress, {scope}: off, top (the top class) or own "
                             f"(a class above it; default {DEFAULT_ACK_PRIORITY})")


class EmulatedCluster:
    """N hosts in namespaces behind a switch; every link shaped at `bw` with priority queues.

    With priority queues, `ack_priority` (default DEFAULT_ACK_PRIORITY; see `parse_ack_priority`) also
    lifts TCP pure ACKs on every egress; the shaping-only cluster (`priority=False`) has one FIFO, no filter."""

    def __init__(self, name: str, hosts: int = 3, bw: int | str = "100mbit", classes=None,
                 priority: bool = True, topology: str = "star", tcp_congestion: str | None = None,
                 uplink_fraction: float | None = None, offload: bool = True, mtu: int = fabric.DEFAULT_MTU,
                 ack_priority: "bool | str" = DEFAULT_ACK_PRIORITY):
        self.name = check_name(name)
        check_host_count(hosts)
        self.rate = parse_rate(bw)
        self.classes = parse_classes(classes)
        self.priority = bool(priority)
        self.ack_priority = parse_ack_priority(ack_priority) if self.priority else "off"
        self.tcp_congestion = tcp_congestion
        self.offload = bool(offload)
        self.mtu = check_mtu(mtu)
        self.topology: Topology = build_topology(topology, name, hosts, self.rate, uplink_fraction)
        self.hosts = [Host(h.name, h.netns, h.ip, h.iface) for h in self.topology.hosts]
        self.timings: dict[str, float] = {}
        self._up = False
        self._owned = False  # True once this object holds the name: only then may down() remove it
        self._builder_pid = os.getpid()

    # life cycle -------------------------------------------------------------------------------

    def up(self) -> "EmulatedCluster":
        """Build the cluster; on any failure remove whatever was built and re-raise.

        A Ctrl-C or SIGTERM while building is taken once the build is whole (or undone): up() then raises
        KeyboardInterrupt with the cluster built, and `down()` (a `finally`, or `with`, which does it for
        you) removes it."""
        require_root("building an emulated cluster (network namespaces and tc)")
        if self._up:
            return self
        with interrupts_deferred():
            self._build()
        log.info("cluster %s up: %d hosts in %.2f s", self.name, len(self.hosts), self.timings["up_s"])
        return self

    def _build(self) -> None:
        if not state.claim_record(self.name):
            raise NameInUse(f"an emulated cluster named {self.name!r} already exists; pick another name "
                            f"or remove it with `geryon emulate down {self.name}`")
        self._owned = True
        leftovers = fabric.list_netns(netns_prefix(self.name))
        if leftovers:
            state.remove_record(self.name)
            self._owned = False
            raise NameInUse(f"namespaces {', '.join(leftovers)} already exist; remove them with "
                            f"`geryon emulate clean --name {self.name}` or pick another name")
        started = time.monotonic()
        try:
            fabric.build_fabric(self.topology, offload=self.offload, mtu=self.mtu)
            self.timings["fabric_s"] = time.monotonic() - started
            self._install_queues()
            self._set_congestion()
            self.timings["up_s"] = time.monotonic() - started
            self._up = True
            state.write_record(self.name, self.describe())
        except BaseException:
            self._remove()
            raise

    def _install_queues(self) -> None:
        """Shape every egress (both ends of every link), with priority classes unless priority is off."""
        for link in self.topology.links:
            for end in (link.a, link.b):
                if self.priority:
                    install_priority_queues(end.dev, self.classes, rate=link.rate, netns=end.netns,
                                            ack_priority=self.ack_priority)
                else:
                    install_shaping(end.dev, link.rate, netns=end.netns)

    def _set_congestion(self) -> None:
        """Every host's default TCP congestion control (a per-namespace sysctl), when one was asked for:
        then every TCP sender in the cluster (iperf3, gloo, geryon flows without their own) uses it.

        The kernel lets a namespace other than the host's default only to an algorithm in the host's
        net.ipv4.tcp_allowed_congestion_control (reno, and here bbr); for any other this raises."""
        if not self.tcp_congestion:
            return
        setting = f"net.ipv4.tcp_congestion_control={self.tcp_congestion}"
        for host in self.hosts:
            result = subprocess.run(exec_argv(host.netns, ["sysctl", "-q", "-w", setting]), capture_output=True,
                                    text=True, timeout=30)
            if result.returncode != 0:
                allowed = _read_proc("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
                raise EmulationError(f"cannot make {self.tcp_congestion!r} the default TCP congestion control of "
                                     f"{host.name} ({result.stderr.strip()}): a namespace may only default to "
                                     f"one of the host's allowed ones ({allowed}); pick one of those, or allow it "
                                     "on the host (sysctl net.ipv4.tcp_allowed_congestion_control)")

    def congestion_control(self, host: str | Host) -> str:
        """The TCP congestion control a host's sockets get by default."""
        return self.run(host, ["sysctl", "-n", "net.ipv4.tcp_congestion_control"], timeout=30,
                        capture_output=True, text=True).stdout.strip()

    def down(self) -> None:
        """Remove every namespace of this cluster (and the processes in them) and its record.

        Safe to call twice, and after a build that failed halfway. A no-op for an object that never
        held the name (its up() raised NameInUse): someone else's cluster is not ours to remove; use
        `EmulatedCluster.from_record(name).down()` or `clean(name=...)` for that.
        """
        if not self._owned:
            return
        require_root("removing an emulated cluster (network namespaces and tc)")
        started = time.monotonic()
        with interrupts_deferred():   # a second Ctrl-C or SIGTERM cannot leave it half-removed
            self._remove()
        self.timings["down_s"] = time.monotonic() - started

    def _remove(self) -> None:
        self._up = False
        names = sorted(set(self.topology.namespaces) | set(fabric.list_netns(netns_prefix(self.name))))
        fabric.remove_namespaces(names)  # on failure the record stays, so `list` and `clean` see it
        state.remove_record(self.name)
        self._owned = False

    def __enter__(self) -> "EmulatedCluster":
        try:
            return self.up()
        except BaseException:   # interrupted as the build ended: `with` never gets to call __exit__
            self.down()
            raise

    def __exit__(self, *exc) -> None:
        self.down()

    @classmethod
    def from_record(cls, name: str) -> "EmulatedCluster":
        """The cluster `name` that some process brought up (read from its state record)."""
        check_name(name)
        record = state.read_record(name)
        if record.get("state") == "building":
            raise EmulationError(f"cluster {name!r} is still being built by PID {record.get('pid')} "
                                 f"(or that process died: `geryon emulate clean --name {name}`)")
        cluster = cls(name, hosts=len(record["hosts"]), bw=record["rate"],
                      classes=tuple(PriorityClass(c["name"], c["dscp"]) for c in record["classes"]),
                      priority=record["priority"], topology=record["topology"],
                      tcp_congestion=record.get("tcp_congestion"),
                      uplink_fraction=record.get("uplink_fraction"), offload=record.get("offload", True),
                      mtu=record.get("mtu", fabric.DEFAULT_MTU),
                      ack_priority=record.get("ack_priority", "off"))
        cluster._up = cluster._owned = True
        cluster._builder_pid = record.get("pid", cluster._builder_pid)
        return cluster

    # using it ---------------------------------------------------------------------------------

    def host(self, name: str | Host) -> Host:
        """The host called `name` ('h1', ...)."""
        if isinstance(name, Host):
            return name
        for host in self.hosts:
            if host.name == name:
                return host
        known = ", ".join(h.name for h in self.hosts)
        raise ConfigError(f"cluster {self.name!r} has no host {name!r} (hosts: {known})")

    def popen(self, host: str | Host, argv: list[str], **kw) -> subprocess.Popen:
        """Start `argv` inside the host's namespace; keyword arguments go to subprocess.Popen."""
        return subprocess.Popen(exec_argv(self.host(host).netns, argv), **kw)

    def run(self, host: str | Host, argv: list[str], timeout: float | None = None,
            **kw) -> subprocess.CompletedProcess:
        """Run `argv` inside the host's namespace to completion; keyword arguments go to subprocess.run."""
        return subprocess.run(exec_argv(self.host(host).netns, argv), timeout=timeout, **kw)

    def switch_port(self, host: str | Host) -> tuple[str, str]:
        """(netns, dev) of the switch egress port toward `host`: the bottleneck for traffic into it."""
        port = self.topology.switch_port(self.host(host).name)
        return port.netns, port.dev

    def describe(self) -> dict:
        """Plain-data description (what `geryon emulate up` prints and the state record holds)."""
        topo = self.topology
        hosts = []
        for host in self.hosts:
            netns, dev = self.switch_port(host)
            hosts.append({**asdict(host), "switch": topo.host(host.name).switch,
                          "switch_port": {"netns": netns, "dev": dev}})
        switches = []
        for switch in topo.switches:
            ports = [end.dev for link in topo.links for end in (link.a, link.b) if end.netns == switch.netns]
            switches.append({"name": switch.name, "netns": switch.netns, "bridge": switch.bridge, "ports": ports})
        links = [{"a": {"netns": link.a.netns, "dev": link.a.dev}, "b": {"netns": link.b.netns, "dev": link.b.dev},
                  "rate": link.rate, "rate_text": format_rate(link.rate)} for link in topo.links]
        description = {
            "name": self.name,
            "topology": topo.kind,
            "rate": self.rate,
            "rate_text": format_rate(self.rate),
            "priority": self.priority,
            "ack_priority": self.ack_priority,
            "queues": "priority" if self.priority else "shaping",
            "classes": [{"name": c.name, "dscp": c.dscp} for c in self.classes],
            "tcp_congestion": self.tcp_congestion,
            "offload": self.offload,
            "mtu": self.mtu,
            "subnet": SUBNET,
            "hosts": hosts,
            "switches": switches,
            "links": links,
            "pid": self._builder_pid,
            "state": "up" if self._up else "down",
        }
        if topo.kind == "leafspine":
            description["uplink_rate"] = topo.uplink_rate
            description["uplink_fraction"] = topo.extra["uplink_fraction"]
        return description

    def __repr__(self) -> str:
        return (f"EmulatedCluster({self.name!r}, hosts={len(self.hosts)}, bw={format_rate(self.rate)!r}, "
                f"topology={self.topology.kind!r}, priority={self.priority}, ack_priority={self.ack_priority})")
