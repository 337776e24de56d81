"""Names that reach a path or another program's command line: network namespaces and interfaces.

A namespace name becomes `/run/netns/<name>` (and a state directory under /run/geryon), an
interface name a state file; both are checked whole (`re.fullmatch`), so a `/`, `..` or a trailing
newline never gets through.
"""

import re

from geryon.errors import ConfigError

_NETNS = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_IFNAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,14}")


def check_netns_name(name: str) -> str:
    """Return `name` if it is a safe network namespace name, else raise ConfigError."""
    if not isinstance(name, str) or not _NETNS.fullmatch(name):
        raise ConfigError(f"bad network namespace name {name!r}: use up to 64 letters, digits, "
                          "'_', '.' or '-', not starting with '.' or '-' (see `ip netns list`)")
    return name


def check_ifname(name: str) -> str:
    """Return `name` if it is a valid interface name (at most 15 characters, no '/'), else raise."""
    if not isinstance(name, str) or not _IFNAME.fullmatch(name):
        raise ConfigError(f"bad interface name {name!r}: use up to 15 letters, digits, '_', '.', '@' "
                          "or '-' (see `ip link`)")
    return name
