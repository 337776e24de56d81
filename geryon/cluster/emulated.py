"""Where `geryon cluster` dials from: inside an emulated cluster for its inventory, never into one otherwise.

An emulated cluster's addresses (10.199.0.0/16) exist only inside its network namespaces. Dialed from
the machine's own namespace they would leave by its default route, onto the real network. So:

- The inventory `geryon emulate up --sshd` writes says `emulated = "NAME"` in [defaults]; every SSH
  connection of that inventory is then made from inside the cluster (`dial_namespace`: the namespace of
  its first host, the cluster's head node), whatever namespace the command runs in. Needs root.
- Any other inventory is refused before a single host is contacted when one of its addresses lies in
  the subnet of an emulated cluster that is up (`refuse_emulated_addresses`).
"""

import ipaddress
import os
import socket

from geryon.emulate import fabric, state
from geryon.emulate.clean import cluster_of
from geryon.emulate.sshd import DIAL_HOST
from geryon.emulate.topology import SUBNET, check_name, netns_prefix
from geryon.errors import ConfigError, EmulationError, InventoryError, PermissionNeeded


def dial_namespace(where: str, cluster: str) -> str:
    """The namespace an inventory of emulated cluster `cluster` dials from; InventoryError when it is not up."""
    try:
        check_name(cluster)
    except ConfigError as exc:
        raise InventoryError(f"{where}: emulated = {cluster!r}: {exc}") from None
    if os.geteuid() != 0:
        raise PermissionNeeded(f"{where}: reaching emulated cluster {cluster!r} means entering its network "
                               "namespaces, which needs root; run it with sudo")
    netns = f"{netns_prefix(cluster)}{DIAL_HOST}"
    if not fabric.netns_exists(netns):
        raise InventoryError(f"{where}: emulated cluster {cluster!r} is not up (no namespace {netns}); bring it "
                             f"up with `geryon emulate up --name {cluster} --sshd` and use the inventory it writes")
    return netns


def running_subnets() -> dict[str, ipaddress.IPv4Network]:
    """Subnet of every emulated cluster that is up, by cluster name: from the state records, and from the
    namespaces themselves (a cluster whose record lives under another state directory still counts)."""
    found = {}
    for name in state.list_records():
        try:
            found[name] = ipaddress.ip_network(state.read_record(name).get("subnet", SUBNET))
        except (EmulationError, ValueError):
            found[name] = ipaddress.ip_network(SUBNET)
    for netns in fabric.list_netns("gy"):
        name = cluster_of(netns)
        if name is not None:
            found.setdefault(name, ipaddress.ip_network(SUBNET))
    return found


def _addresses_of(address: str) -> set:
    """The IP addresses `address` stands for (a literal, or what the resolver says for a name)."""
    try:
        return {ipaddress.ip_address(address)}
    except ValueError:
        pass
    try:
        return {ipaddress.ip_address(info[4][0].split("%")[0]) for info in socket.getaddrinfo(address, None)}
    except (OSError, ValueError):
        return set()  # unresolvable: the connection fails on its own, and never reaches an emulated address


def refuse_emulated_addresses(where: str, targets) -> None:
    """InventoryError when any (name, address) of `targets` lies in a running emulated cluster's subnet."""
    clusters_in: dict = {}
    for cluster, subnet in running_subnets().items():
        clusters_in.setdefault(subnet, []).append(cluster)
    for name, address in targets:
        for ip in _addresses_of(address):
            for subnet, clusters in clusters_in.items():
                if ip.version == subnet.version and ip in subnet:
                    raise InventoryError(
                        f"{where}: {name} at {address} is in {subnet}, the subnet of the emulated cluster(s) up "
                        f"now ({', '.join(sorted(clusters))}), but the inventory names none of them, so the "
                        "connection would leave through this machine's own network. Use the inventory "
                        "`geryon emulate up --sshd` wrote for the cluster, or add emulated = \"NAME\" (the "
                        "cluster's name) to its [defaults]")
