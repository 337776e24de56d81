"""Hostfiles: the real hosts of an SSH job, one per line, parsed and checked before anything starts.

    # comment
    node1                       # port 22, slots=1, the current user, ssh's default keys
    node2:2222 slots=4 user=alice key=~/.ssh/id_ed25519 iface=eth1 python=/opt/venv/bin/python

`slots` is how many workers the host runs; `iface` names the interface the ranks should use for
training traffic (sets GLOO_SOCKET_IFNAME and GERYON_IFACE there); `python` is the interpreter on that
host (default: the launcher's own `sys.executable`, i.e. the same layout on every host).
"""

import os
import socket
from dataclasses import dataclass

from geryon.errors import ConfigError

OPTION_KEYS = ("slots", "user", "key", "iface", "python")


@dataclass(frozen=True)
class HostSpec:
    """One line of a hostfile."""

    host: str
    port: int = 22
    slots: int = 1
    user: str | None = None
    key: str | None = None
    iface: str | None = None
    python: str | None = None

    @property
    def address(self) -> str:
        """host:port as the user wrote it (IPv6 in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def known_hosts_name(self) -> str:
        """How known_hosts and ssh-keygen -R name this host: `host`, or `[host]:port` off port 22."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"


def parse_hostfile(path: str, resolve: bool = True) -> tuple[HostSpec, ...]:
    """Read `path`; raise ConfigError naming the file and line for a bad line or an unknown host."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise ConfigError(f"cannot read hostfile {path!r}: {exc.strerror}") from None
    hosts = parse_hostfile_text(text, origin=path)
    if resolve:
        for lineno, host in _numbered(text, hosts):
            check_resolvable(host, f"{path}:{lineno}")
    return hosts


def parse_hostfile_text(text: str, origin: str = "<hostfile>") -> tuple[HostSpec, ...]:
    """Parse hostfile content (no name resolution); raise ConfigError for bad lines or duplicates."""
    hosts: list[HostSpec] = []
    seen: dict[tuple[str, int], int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{origin}:{lineno}"
        host = _parse_line(words, where)
        if (host.host, host.port) in seen:
            raise ConfigError(f"{where}: host {host.address} is already listed on line "
                              f"{seen[(host.host, host.port)]}; give it once with slots=N")
        seen[(host.host, host.port)] = lineno
        hosts.append(host)
    if not hosts:
        raise ConfigError(f"hostfile {origin!r} lists no hosts; write one host per line: "
                          f"'host[:port] [slots=N] [user=U] [key=PATH]'")
    return tuple(hosts)


def check_resolvable(host: HostSpec, where: str) -> None:
    """Raise ConfigError if the host name does not resolve to an address."""
    try:
        socket.getaddrinfo(host.host, host.port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise ConfigError(f"{where}: unknown host {host.host!r} (the name does not resolve); "
                          f"fix the name or add it to /etc/hosts") from None


def _parse_line(words: list[str], where: str) -> HostSpec:
    host, port = _split_host_port(words[0], where)
    options: dict[str, str] = {}
    for word in words[1:]:
        key, sep, value = word.partition("=")
        if not sep or not value or key not in OPTION_KEYS:
            raise ConfigError(f"{where}: bad entry {word!r}; a line is 'host[:port]' followed by "
                              f"options among {', '.join(k + '=...' for k in OPTION_KEYS)}")
        if key in options:
            raise ConfigError(f"{where}: {key}= given twice")
        options[key] = value
    slots = 1
    if "slots" in options:
        try:
            slots = int(options["slots"])
        except ValueError:
            slots = 0
        if slots < 1:
            raise ConfigError(f"{where}: slots={options['slots']!r} must be a positive integer")
    key = os.path.expanduser(options["key"]) if "key" in options else None
    return HostSpec(host=host, port=port, slots=slots, user=options.get("user"), key=key,
                    iface=options.get("iface"), python=options.get("python"))


def _split_host_port(text: str, where: str) -> tuple[str, int]:
    if text.startswith("["):  # [IPv6]:port
        host, sep, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else None
        if not sep or (rest and port_text is None):
            raise ConfigError(f"{where}: bad address {text!r}; write [IPv6]:port")
    else:
        host, sep, port_text = text.partition(":")
        port_text = port_text if sep else None
    if not host or "=" in host:
        raise ConfigError(f"{where}: a line must start with a host name, got {text!r}")
    port = 22
    if port_text is not None:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ConfigError(f"{where}: bad port {port_text!r} in {text!r}; use 1..65535")
        port = int(port_text)
    return host, port


def _numbered(text: str, hosts: tuple[HostSpec, ...]):
    """Pair each parsed host with its line number again (for error messages after parsing)."""
    numbers = [n for n, line in enumerate(text.splitlines(), start=1) if line.split("#", 1)[0].split()]
    return zip(numbers, hosts)
