"""Where an applied plan's class names are remembered, so another process can read counters later.

The kernel keeps class ids and filters but not names, so `apply` writes a small JSON sidecar per device,
`$GERYON_STATE_DIR/netconf/<netns or ->/<dev>.json` (default `/run/geryon/netconf/...`, cleared at boot
like the queues themselves). It records the namespace's inode: a namespace deleted and re-created under
the same name has a new inode, which marks the sidecar stale instead of mislabelling a new device.
"""

import json
import os
import shutil
from pathlib import Path

from geryon.netconf.classes import PriorityClass
from geryon.netconf.plan import QueuePlan
from geryon.netnames import check_ifname, check_netns_name, netns_path, state_base
from geryon.safefiles import replace_file

_ROOT_NETNS = "-"


def state_dir() -> Path:
    """The directory holding every namespace's sidecars."""
    return state_base() / "netconf"


def _state_path(dev: str, netns: str | None) -> Path:
    if netns:
        check_netns_name(netns)
    return state_dir() / (netns or _ROOT_NETNS) / f"{check_ifname(dev)}.json"


def netns_inode(netns: str | None) -> int | None:
    """Identity of a namespace (None if it does not exist)."""
    path = netns_path(netns) if netns else "/proc/1/ns/net"
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def save_plan_state(plan: QueuePlan) -> None:
    """Record which class id holds which priority class for plan.dev."""
    path = _state_path(plan.dev, plan.netns)
    record = {
        "dev": plan.dev, "netns": plan.netns, "netns_inode": netns_inode(plan.netns),
        "layout": plan.layout, "rate": plan.rate,
        "classes": [{"name": cls.name, "dscp": cls.dscp, "classid": classid}
                    for cls, classid in zip(plan.classes, plan.class_ids)],
        "class_ids": list(plan.class_ids),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, json.dumps(record, indent=1))   # several processes may apply at once
    except OSError:
        pass  # names are a convenience: counters still work (by class id) without them


def load_plan_state(dev: str, netns: str | None) -> dict | None:
    """The recorded state for dev, or None if missing or stale."""
    try:
        record = json.loads(_state_path(dev, netns).read_text())
    except (OSError, ValueError):
        return None
    if record.get("netns_inode") != netns_inode(netns):
        return None
    return record


def recorded_classes(record: dict) -> dict[str, PriorityClass]:
    """Map class id -> PriorityClass from a state record."""
    return {item["classid"]: PriorityClass(item["name"], item["dscp"]) for item in record.get("classes", [])}


def forget_plan_state(dev: str, netns: str | None) -> None:
    """Drop the sidecar of one device, and its namespace's directory once it holds no other."""
    path = _state_path(dev, netns)
    try:
        path.unlink()
    except OSError:
        pass
    try:
        path.parent.rmdir()   # fails, as it should, while another device's sidecar is there
    except OSError:
        pass


def forget_netns_state(netns: str) -> None:
    """Drop every sidecar of a namespace (call when deleting the namespace)."""
    shutil.rmtree(state_dir() / netns, ignore_errors=True)
