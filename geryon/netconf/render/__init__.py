"""Renderers: one QoS profile -> one switch target's native configuration, built as data.

One module per target, each with the vendor document it follows and the target's hazards in its
docstring, each exposing `LIMITS` (a `TargetLimits`) and `render(profile) -> Rendering`:

  linux       tc (HTB + u32), the plan of `geryon netconf`, for hosts and Linux-based switches
  sonic       config_db.json tables, and the same data as a YANG instance (`--format yang`)
  openconfig  openconfig-qos, RFC 7951 JSON
  eos         Arista EOS CLI
  nxos        Cisco NX-OS CLI
  nvue        NVIDIA Cumulus Linux NVUE (`nv set qos ...`)
  junos       Juniper Junos `set class-of-service ...`

`render(profile, target)` checks the profile against the target's limits first (TargetLimitError before
anything is produced, let alone applied).
"""

import importlib
import json
from dataclasses import dataclass, field

from geryon.errors import ConfigError
from geryon.netconf.qos_profile import QosProfile, check_target

TARGETS = ("linux", "sonic", "openconfig", "eos", "nxos", "nvue", "junos")
FORMATS = ("native", "yang")


@dataclass(frozen=True)
class Rendering:
    """A target's configuration: `text` to show or paste, `data` when the target speaks JSON."""

    target: str
    profile: QosProfile  # as the target carries it (reserved queues moved)
    text: str
    data: object = None
    notes: tuple[str, ...] = field(default=())
    commands: tuple[str, ...] = ()  # CLI targets: one configuration line each, in order

    def as_dict(self) -> dict:
        return {"target": self.target, "profile": self.profile.name, "notes": list(self.notes),
                "config": self.data if self.data is not None else self.text.splitlines()}


def target_module(target: str):
    """The renderer module of `target`."""
    if target not in TARGETS:
        raise ConfigError(f"unknown target {target!r}: choose one of {', '.join(TARGETS)}")
    return importlib.import_module(f"geryon.netconf.render.{target}")


def render(profile: QosProfile, target: str, fmt: str = "native") -> Rendering:
    """Check `profile` against `target`'s limits, then render it (fmt 'yang': SONiC's YANG instance)."""
    module = target_module(target)
    if fmt not in FORMATS:
        raise ConfigError(f"unknown format {fmt!r}: choose native or yang")
    if fmt == "yang" and target not in ("sonic", "openconfig"):
        raise ConfigError(f"--format yang exists for sonic and openconfig, not {target}")
    carried = check_target(profile, module.LIMITS)
    if fmt == "yang" and target == "sonic":
        return module.render_yang(carried)
    return module.render(carried)


def dump_json(data) -> str:
    return json.dumps(data, indent=2) + "\n"
