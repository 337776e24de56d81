"""The cluster inventory (TOML): which hosts and switches geryon manages, and how to reach them.

    [defaults]                       # optional; every host and switch inherits these
    user = "root"
    key = "~/.ssh/id_ed25519"
    known_hosts = "~/.ssh/known_hosts"
    python = "python3"               # on the hosts: runs the DSCP sniffer during `check`
    profile = "two-class"            # built-in or TOML path (relative to the inventory)
    rate = "25gbit"                  # host NIC rate (HTB shapes at it); optional
    emulated = "demo"                # only in an emulated cluster's inventory (`geryon emulate up --sshd`):
                                     # every connection is made from inside that cluster

    [[host]]
    name = "node1"
    address = "10.0.0.11"
    nic = "eth1"
    role = "worker"                  # worker | server | both (informational)

    [[switch]]
    name = "leaf1"
    kind = "sonic"                   # linux | sonic | eos | nxos | nvue | junos
    address = "10.0.0.2"
    ports = ["Ethernet0", "Ethernet4"]
    links = [ { port = "Ethernet0", host = "node1" } ]   # which port leads to which host

Everything is validated (and the profile checked against every switch kind) before any host is contacted.
An inventory without `emulated` whose addresses lie in a running emulated cluster's subnet is refused
(geryon.cluster.emulated says why).
"""

from dataclasses import dataclass, field, replace
from pathlib import Path

from geryon.cluster.emulated import dial_namespace, refuse_emulated_addresses
from geryon.errors import InventoryError, QosProfileError
from geryon.netconf.qos_profile import QosProfile, check_target, read_toml, resolve_profile
from geryon.netconf.remote import Endpoint
from geryon.netconf.render import TARGETS, target_module

ROLES = ("worker", "server", "both")


@dataclass(frozen=True)
class ManagedHost:
    name: str
    address: str
    nic: str
    role: str
    endpoint: Endpoint
    known_hosts: str
    python: str


@dataclass(frozen=True)
class ManagedSwitch:
    name: str
    kind: str
    address: str
    ports: tuple[str, ...]
    links: dict  # port -> host name
    endpoint: Endpoint
    known_hosts: str
    python: str = "python3"


@dataclass(frozen=True)
class Inventory:
    path: Path
    profile: QosProfile
    hosts: tuple[ManagedHost, ...]
    switches: tuple[ManagedSwitch, ...] = field(default=())

    def host(self, name: str) -> ManagedHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise InventoryError(f"{self.path}: no host {name!r}")

    def port_toward(self, host: str) -> tuple[ManagedSwitch, str] | None:
        """The switch port whose egress leads to `host` (the bottleneck for traffic into it)."""
        for switch in self.switches:
            for port, target in switch.links.items():
                if target == host:
                    return switch, port
        return None


def _expand(value: str | None, base: Path) -> str | None:
    if value is None:
        return None
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else base / path)


def load_inventory(path: "str | Path") -> Inventory:
    """Read and validate an inventory; InventoryError or QosProfileError says what is wrong."""
    path = Path(path)
    data = read_toml(path, "inventory", InventoryError, missing=" (examples: cluster/*.toml)")
    base = path.parent
    defaults = data.get("defaults", {})
    unknown = set(data) - {"defaults", "host", "switch"}
    if unknown:
        raise InventoryError(f"{path}: unknown table(s) {', '.join(sorted(unknown))}; "
                             "use [defaults], [[host]], [[switch]]")
    profile_name = defaults.get("profile", "two-class")
    if profile_name not in ("two-class", "four-class") and not Path(profile_name).is_absolute():
        profile_name = str(base / profile_name)
    try:
        profile = resolve_profile(profile_name, rate=defaults.get("rate"))
    except QosProfileError as exc:
        raise QosProfileError(f"{path}: {exc}") from None
    known_hosts = _expand(defaults.get("known_hosts", "~/.ssh/known_hosts"), base)
    emulated = defaults.get("emulated")
    if emulated is not None and not isinstance(emulated, str):
        raise InventoryError(f"{path}: emulated = {emulated!r} must be the emulated cluster's name (a string)")
    hosts, names = [], set()
    for index, entry in enumerate(data.get("host", [])):
        where = f"{path}: host #{index + 1}"
        for key in ("name", "address", "nic"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise InventoryError(f"{where} needs {key} (a string)")
        if entry["name"] in names:
            raise InventoryError(f"{where}: host name {entry['name']!r} is used twice")
        names.add(entry["name"])
        role = entry.get("role", "worker")
        if role not in ROLES:
            raise InventoryError(f"{where}: role {role!r} is not one of {', '.join(ROLES)}")
        user = entry.get("user", defaults.get("user"))
        endpoint = Endpoint("linux", entry["address"], int(entry.get("port", 22)), user,
                            _expand(entry.get("key", defaults.get("key")), base))
        hosts.append(ManagedHost(entry["name"], entry["address"], entry["nic"], role, endpoint,
                                 _expand(entry.get("known_hosts"), base) or known_hosts,
                                 entry.get("python", defaults.get("python", "python3"))))
    if len(hosts) < 2:
        raise InventoryError(f"{path}: give at least two [[host]] entries (check sends between hosts)")
    switches = []
    for index, entry in enumerate(data.get("switch", [])):
        where = f"{path}: switch #{index + 1}"
        kind = entry.get("kind")
        if kind not in TARGETS or kind == "openconfig":
            raise InventoryError(f"{where}: kind {kind!r} is not one of linux, sonic, eos, nxos, nvue, junos")
        ports = entry.get("ports", [])
        if not isinstance(ports, list) or not ports:
            raise InventoryError(f"{where} needs ports = [...]")
        links = {}
        for link in entry.get("links", []):
            if link.get("port") not in ports or link.get("host") not in names:
                raise InventoryError(f"{where}: link {link} names an unknown port or host")
            links[link["port"]] = link["host"]
        try:
            check_target(profile.with_ports(ports), target_module(kind).LIMITS)
        except QosProfileError as exc:
            raise QosProfileError(f"{where} ({kind}): {exc}") from None
        endpoint = Endpoint(kind, entry["address"], int(entry.get("port", 22)), entry.get("user", defaults.get("user")),
                            _expand(entry.get("key", defaults.get("key")), base))
        switches.append(ManagedSwitch(entry.get("name", f"switch{index + 1}"), kind, entry["address"], tuple(ports),
                                      links, endpoint, _expand(entry.get("known_hosts"), base) or known_hosts,
                                      entry.get("python", defaults.get("python", "python3"))))
    return _reachable(Inventory(path, profile, tuple(hosts), tuple(switches)), emulated)


def _reachable(inventory: Inventory, emulated: str | None) -> Inventory:
    """Every endpoint dialed from inside the emulated cluster the inventory names; an inventory naming
    none is refused if it points into one that is up."""
    targets = [(t.name, t.address) for t in (*inventory.hosts, *inventory.switches)]
    if emulated is None:
        refuse_emulated_addresses(str(inventory.path), targets)
        return inventory
    netns = dial_namespace(str(inventory.path), emulated)
    hosts = tuple(replace(h, endpoint=replace(h.endpoint, netns=netns)) for h in inventory.hosts)
    switches = tuple(replace(s, endpoint=replace(s.endpoint, netns=netns)) for s in inventory.switches)
    return replace(inventory, hosts=hosts, switches=switches)
