"""`cluster up` and `cluster down`: every host NIC and switch of an inventory, all or nothing.

`up` applies the inventory's profile to each host's NIC (Linux tc over SSH) and then to each switch (Linux
tc, or the vendor session with its own safety net). If any target refuses, every target already changed
is restored from its saved state, in reverse order, and the report says which. `down` restores every
Linux target from the state saved before geryon first changed it (vendor switches keep their confirmed
configuration: roll them back with their own checkpoint, as the report says).
"""

import hashlib
from dataclasses import dataclass, field

from geryon.errors import GeryonError
from geryon.netconf.linuxapply import SavedStates, apply_linux, restore_linux
from geryon.netconf.remote import SshShell
from geryon.netconf.session import run_session
from geryon.cluster.inventory import Inventory


DETAILS = ("seen_dscps", "received", "bytes", "high_mbit", "low_mbit", "high_share")


@dataclass
class Report:
    """What one cluster command did, target by target, and what to do next."""

    action: str
    items: list = field(default_factory=list)  # dicts: target, name, ok, changed, steps, error, rolled_back
    advice: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(item["ok"] for item in self.items)

    def as_dict(self) -> dict:
        return {"action": self.action, "ok": self.ok, "items": self.items, "advice": self.advice}

    def text(self) -> str:
        lines = [f"cluster {self.action}: {'OK' if self.ok else 'FAILED'}"]
        for item in self.items:
            state = "ok" if item["ok"] else "FAILED"
            extra = " (changed)" if item.get("changed") else ""
            extra += " (rolled back)" if item.get("rolled_back") else ""
            lines.append(f"  {state:6} {item['name']:12} {item['target']}{extra}")
            for step in item.get("steps", []):
                lines.append(f"           - {step}")
            details = {k: v for k, v in item.items() if k in DETAILS}
            if details:
                lines.append("           " + ", ".join(f"{k} {v}" for k, v in details.items()))
            if item.get("error"):
                lines.append(f"           error: {item['error']}")
        lines += [f"  next: {advice}" for advice in self.advice]
        return "\n".join(lines)


def saved_states(inventory: Inventory) -> SavedStates:
    """Saved states are kept per inventory, so two clusters with the same addresses never mix."""
    digest = hashlib.sha1(str(inventory.path.resolve()).encode()).hexdigest()[:10]
    return SavedStates(SavedStates().root / f"{inventory.path.stem}-{digest}")


def _targets(inventory: Inventory):
    """(name, kind, endpoint, known_hosts, devices, python) for every host NIC, then every switch."""
    for host in inventory.hosts:
        yield host.name, "linux", host.endpoint, host.known_hosts, [host.nic], host.python
    for switch in inventory.switches:
        yield switch.name, switch.kind, switch.endpoint, switch.known_hosts, list(switch.ports), switch.python


def cluster_up(inventory: Inventory, dry_run: bool = False) -> Report:
    report = Report("up" + (" (dry run)" if dry_run else ""))
    store = saved_states(inventory)
    changed = []
    for name, kind, endpoint, known_hosts, devs, python in _targets(inventory):
        item = {"name": name, "target": f"{kind}@{endpoint.address}", "ok": False}
        report.items.append(item)
        profile = inventory.profile.with_ports(devs)
        try:
            if kind == "linux":
                with SshShell(endpoint, known_hosts) as shell:
                    result = apply_linux(profile, endpoint, shell, devs, dry_run, store, python)
            else:
                result = run_session(profile, endpoint, dry_run, known_hosts)
        except GeryonError as exc:
            item.update(error=str(exc), rolled_back=kind == "linux")
            _roll_back(report, changed, store)
            report.advice.append(f"fix {name} ({exc.__class__.__name__}) and run `geryon cluster up` again")
            return report
        item.update(ok=True, changed=result.changed, steps=result.steps, diff=result.diff)
        if result.changed:
            changed.append((name, kind, endpoint, known_hosts, devs, python))
    if not dry_run:
        report.advice.append("prove it with `geryon cluster check INVENTORY`")
    return report


def _roll_back(report: Report, changed: list, store: SavedStates) -> None:
    for name, kind, endpoint, known_hosts, devs, python in reversed(changed):
        item = next(i for i in report.items if i["name"] == name)
        if kind != "linux":
            report.advice.append(f"{name}: its {kind} session was confirmed; roll it back with the platform's "
                                 "checkpoint (see `geryon netconf apply --dry-run`)")
            continue
        try:
            with SshShell(endpoint, known_hosts) as shell:
                restore_linux(endpoint, shell, devs, store, python)
            item["rolled_back"] = True
            item["steps"] = item.get("steps", []) + ["rolled back: another target refused the change"]
        except GeryonError as exc:
            item["ok"] = False
            item["error"] = f"rollback failed: {exc}"
            report.advice.append(f"{name}: restore it by hand, the saved state is in {store.root}")


def cluster_down(inventory: Inventory) -> Report:
    report = Report("down")
    store = saved_states(inventory)
    for name, kind, endpoint, known_hosts, devs, python in _targets(inventory):
        item = {"name": name, "target": f"{kind}@{endpoint.address}", "ok": True}
        report.items.append(item)
        if kind != "linux":
            item["steps"] = ["vendor switch: left as configured"]
            report.advice.append(f"{name}: roll back with the {kind} checkpoint/revision taken by `apply`")
            continue
        try:
            with SshShell(endpoint, known_hosts) as shell:
                result = restore_linux(endpoint, shell, devs, store, python)
            item.update(changed=result.changed, steps=result.steps)
        except GeryonError as exc:
            item.update(ok=False, error=str(exc))
    return report
