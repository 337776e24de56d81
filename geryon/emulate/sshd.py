"""Real sshd daemons inside an emulated cluster, so an inventory can point at it as at real hosts.

`start_cluster_sshd(cluster)` makes a throwaway host key and client key in the cluster's state folder,
gives each switch bridge an address (10.199.255.N) so the Linux switch is reachable too, starts one sshd
per namespace (it daemonizes; `geryon emulate down` kills it with the namespace), writes known_hosts with
the real host key, and writes `inventory.toml` describing the cluster for `geryon cluster`. The inventory
names the cluster (`emulated = "NAME"`): geryon cluster then makes every connection from inside the
namespace of host DIAL_HOST, so it works from the machine's own shell and never dials the cluster's
addresses through the machine's own network. Everything an sshd needs is in NOTES.md: a minimal config,
`/run/sshd`, no PAM.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

from pyroute2 import IPRoute

from geryon.emulate import state
from geryon.childproc import in_netns
from geryon.emulate.topology import PREFIX_LEN
from geryon.errors import EmulationError

SSHD = "/usr/sbin/sshd"
PORT = 22
DIAL_HOST = "h1"  # the head node: `geryon cluster` connects to the cluster from inside this host's namespace


def switch_ip(index: int) -> str:
    return f"10.199.255.{index}"


def access_dir(name: str) -> Path:
    return state.state_dir() / f"{name}-ssh"


def _keygen(path: Path) -> None:
    if not path.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


def start_sshd(netns: str, address: str, folder: Path, port: int = PORT) -> Path:
    """Start sshd in `netns` listening on address:port; return its log file once it listens."""
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    tag = f"{netns}_{port}"
    config, log = folder / f"sshd_{tag}.conf", folder / f"sshd_{tag}.log"
    config.write_text(f"Port {port}\nListenAddress {address}\nHostKey {folder / 'host'}\n"
                      f"AuthorizedKeysFile {folder / 'authorized_keys'}\nPubkeyAuthentication yes\n"
                      "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                      f"PermitRootLogin prohibit-password\nPidFile {folder / f'sshd_{tag}.pid'}\n")
    log.unlink(missing_ok=True)
    subprocess.run(in_netns(netns, [SSHD, "-f", str(config), "-E", str(log)]),
                   check=True, timeout=10)
    deadline = time.monotonic() + 10
    while not (log.exists() and "Server listening" in log.read_text()):
        if time.monotonic() > deadline:
            raise EmulationError(f"sshd in {netns} did not start; see {log}")
        time.sleep(0.05)
    return log


def start_cluster_sshd(cluster) -> Path:
    """sshd in every host and switch of `cluster`; returns the inventory file describing it."""
    folder = access_dir(cluster.name)
    folder.mkdir(parents=True, exist_ok=True)
    _keygen(folder / "host")
    _keygen(folder / "client")
    (folder / "authorized_keys").write_text((folder / "client.pub").read_text())
    host_key = " ".join((folder / "host.pub").read_text().split()[:2])
    known = []
    for host in cluster.hosts:
        start_sshd(host.netns, host.ip, folder)
        known.append(host.ip)
    description = cluster.describe()
    switches = []
    for index, switch in enumerate(description["switches"], start=1):
        address = switch_ip(index)
        with IPRoute(netns=switch["netns"]) as ipr:
            bridge = ipr.link_lookup(ifname=switch["bridge"])[0]
            if not ipr.get_addr(index=bridge, address=address):
                ipr.addr("add", index=bridge, address=address, prefixlen=PREFIX_LEN)
        start_sshd(switch["netns"], address, folder)
        known.append(address)
        switches.append((switch, address))
    (folder / "known_hosts").write_text("".join(f"{ip} {host_key}\n" for ip in known))
    inventory = folder / "inventory.toml"
    inventory.write_text(_inventory(cluster, description, switches, folder))
    return inventory


def _inventory(cluster, description, switches, folder: Path) -> str:
    lines = [f"# emulated cluster {cluster.name}: written by `geryon emulate up --sshd`", "",
             "[defaults]", f'emulated = "{cluster.name}"  # connections leave from inside the cluster (host '
             f'{DIAL_HOST})', 'user = "root"', f'key = "{folder / "client"}"',
             f'known_hosts = "{folder / "known_hosts"}"', f'python = "{sys.executable}"',
             'profile = "two-class"', f'rate = "{description["rate_text"].lower()}"', ""]
    for host in description["hosts"]:
        lines += ["[[host]]", f'name = "{host["name"]}"', f'address = "{host["ip"]}"', f'nic = "{host["iface"]}"',
                  'role = "worker"', ""]
    for switch, address in switches:
        links = [h for h in description["hosts"] if h["switch"] == switch["name"]]
        lines += ["[[switch]]", f'name = "{switch["name"]}"', 'kind = "linux"', f'address = "{address}"',
                  f"ports = [{', '.join(repr(p).replace(chr(39), chr(34)) for p in switch['ports'])}]",
                  "links = [" + ", ".join(f'{{ port = "{h["switch_port"]["dev"]}", host = "{h["name"]}" }}'
                                          for h in links) + "]", ""]
    return "\n".join(lines)
