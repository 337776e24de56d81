"""Names that reach a path or another program's command line, and the directories they reach.

A namespace name becomes `NETNS_DIR/<name>` (iproute2's `ip netns` directory; `netns_path`), and
geryon keeps its state (cluster records, saved tc states) under `state_base()`; an interface name
becomes a state file. Names are checked whole (`re.fullmatch`), so a `/`, `..` or a trailing newline
never gets through.
"""

import os
import re
from pathlib import Path

from geryon import envvars
from geryon.errors import ConfigError

NETNS_DIR = "/run/netns"             # where `ip netns add` bind-mounts a named network namespace
DEFAULT_STATE_BASE = "/run/geryon"   # tmpfs: cleared at boot, like the namespaces the state describes

_NETNS = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_IFNAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,14}")


def check_netns_name(name: str) -> str:
    """Return `name` if it is a safe network namespace name, else raise ConfigError."""
    if not isinstance(name, str) or not _NETNS.fullmatch(name):
        raise ConfigError(f"bad network namespace name {name!r}: use up to 64 letters, digits, "
                          "'_', '.' or '-', not starting with '.' or '-' (see `ip netns list`)")
    return name


def netns_path(name: str) -> str:
    """The file of network namespace `name` (checked), which `nsenter --net=` and setns(2) open."""
    return os.path.join(NETNS_DIR, check_netns_name(name))


def state_base() -> Path:
    """Where geryon keeps its state: $GERYON_STATE_DIR, else DEFAULT_STATE_BASE."""
    return Path(os.environ.get(envvars.STATE_DIR) or DEFAULT_STATE_BASE)


def check_ifname(name: str) -> str:
    """Return `name` if it is a valid interface name (at most 15 characters, no '/'), else raise."""
    if not isinstance(name, str) or not _IFNAME.fullmatch(name):
        raise ConfigError(f"bad interface name {name!r}: use up to 15 letters, digits, '_', '.', '@' "
                          "or '-' (see `ip link`)")
    return name
