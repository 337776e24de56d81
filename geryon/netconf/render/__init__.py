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

Each rendering also carries `verify`: the target's commands that show per-queue counters of its ports
(`--json` lists them; CLI renderings end with them as comments), and where the switch prints structured
output its module has `parse_queue_counters(text, port) -> {port: {queue: QueueCount}}` (`port`: the port
the command was run for, which names the result where the output itself does not). Parsed: SONiC, OpenConfig,
EOS, NX-OS, Junos and NVUE (each module's docstring names the document or public source of the format);
Linux's `tc -s class show` prints text only and has no parser.

`render(profile, target)` checks the profile against the target's limits first (TargetLimitError before
anything is produced, let alone applied).
"""

import importlib
import json
from dataclasses import dataclass, field

from geryon.errors import ConfigError
from geryon.netconf.qos_profile import CONTROL_DSCPS, QosProfile, check_target

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
    verify: tuple[str, ...] = ()  # the switch's commands that show per-queue counters of the ports

    def as_dict(self) -> dict:
        return {"target": self.target, "profile": self.profile.name, "notes": list(self.notes),
                "config": self.data if self.data is not None else self.text.splitlines(),
                "verify": list(self.verify)}


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


@dataclass(frozen=True)
class QueueCount:
    """Counters of one egress queue of one port, as the switch reports them (None: not available)."""

    packets: int | None
    bytes: int | None
    dropped_packets: int | None


def dscp_queues(profile: QosProfile, control_queue: int | None, keep: dict[int, int] | None = None) -> dict[int, int]:
    """Every DSCP 0..63 -> queue: the profile's classes (unlisted DSCPs to the default class), the DSCPs of
    `keep` (the platform's own, e.g. lossless RoCE) where no class lists them, and network control
    (CONTROL_DSCPS) to `control_queue` when the target has one."""
    listed = {dscp for cls in profile.classes for dscp in cls.dscps}
    out = {dscp: cls.queue for dscp, cls in profile.dscp_map().items()}
    out.update({dscp: queue for dscp, queue in (keep or {}).items() if dscp not in listed})
    if control_queue is not None:
        out.update({dscp: control_queue for dscp in CONTROL_DSCPS})
    return out


def by_queue(mapping: dict[int, int]) -> dict[int, list[int]]:
    """queue -> its DSCPs, ascending, from a DSCP -> queue map."""
    out: dict[int, list[int]] = {}
    for dscp in sorted(mapping):
        out.setdefault(mapping[dscp], []).append(dscp)
    return out


def counter(value) -> int | None:
    """A switch's counter value as an int: numbers, digit strings ("1,234" too), None for "N/A"."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    text = str(value).replace(",", "").strip()
    return int(text) if text.isdigit() else None


def counter_sum(values) -> int | None:
    """The sum of several counters of one queue (e.g. per drop precedence), None if any is unavailable."""
    values = [counter(value) for value in values]
    return None if not values or None in values else sum(values)


def load_json(text: str, command: str):
    """A switch's JSON output, or a ConfigError naming the command that should have printed it."""
    try:
        return json.loads(text)
    except ValueError:
        raise ConfigError(f"`{command}` did not print JSON: run it on the switch by hand and check that its "
                          "release has the JSON form") from None


def dump_json(data) -> str:
    return json.dumps(data, indent=2) + "\n"
