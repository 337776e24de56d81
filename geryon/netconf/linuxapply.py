"""Apply a QoS profile to a Linux host or Linux-based switch over SSH: save, diff, apply, read back, roll back.

For each device: dump its queues (`tcstate.read_state`) and refuse now if they could not be restored;
show the difference between what is there and what the profile wants; if nothing differs, stop (applying
twice changes nothing); otherwise save the dump locally (`SavedStates`, kept from the first apply on, so
`restore_linux` — `geryon cluster down` — returns the host to how it was before geryon), replace the root
qdisc with the plan through `tc -batch`, read back, and compare. Any failure restores every device of
that host from its dump and checks the restore before the error is raised.
"""

import difflib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from geryon.errors import ApplyError, GeryonError
from geryon.netconf.qos_profile import QosProfile
from geryon.netconf.remote import Endpoint
from geryon.netconf.render.linux import build_plan
from geryon.netconf.tcstate import DeviceState, plan_canonical, read_state
from geryon.netnames import state_base


@dataclass
class ApplyResult:
    """What happened on one target."""

    target: str
    changed: bool = False
    diff: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    rolled_back: bool = False
    error: str | None = None

    def as_dict(self) -> dict:
        return {"target": self.target, "changed": self.changed, "diff": self.diff, "steps": self.steps,
                "rolled_back": self.rolled_back, "error": self.error}


class SavedStates:
    """Local copies of each device's state before geryon first changed it: DIR/<host>_<port>/<dev>.json."""

    def __init__(self, root: "str | Path | None" = None):
        self.root = Path(root) if root else state_base() / "qos"

    def _path(self, endpoint: Endpoint, dev: str) -> Path:
        return self.root / f"{endpoint.host}_{endpoint.port}" / f"{dev}.json"

    def has(self, endpoint: Endpoint, dev: str) -> bool:
        return self._path(endpoint, dev).exists()

    def save(self, endpoint: Endpoint, state: DeviceState) -> None:
        path = self._path(endpoint, state.dev)
        if path.exists():  # keep the state from before geryon's first change
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(state.as_dict(), indent=1))
        tmp.replace(path)

    def load(self, endpoint: Endpoint, dev: str) -> DeviceState | None:
        try:
            return DeviceState.from_dict(json.loads(self._path(endpoint, dev).read_text()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError) as exc:
            raise ApplyError(f"saved state {self._path(endpoint, dev)} is unreadable: {exc}") from None

    def forget(self, endpoint: Endpoint, dev: str) -> None:
        try:
            self._path(endpoint, dev).unlink()
        except FileNotFoundError:
            pass


def _diff(current: list[str], desired: list[str], where: str) -> list[str]:
    return list(difflib.unified_diff(current, desired, fromfile=f"{where} (now)", tofile=f"{where} (profile)",
                                     lineterm=""))


def apply_linux(profile: QosProfile, endpoint: Endpoint, shell, devs: list[str], dry_run: bool = False,
                store: SavedStates | None = None, python: str = "python3") -> ApplyResult:
    """Apply `profile` to `devs` on the host behind `shell`; ApplyError (after rolling back) on failure."""
    store = store or SavedStates()
    result = ApplyResult(f"linux@{endpoint.address}")
    plans = {dev: build_plan(profile, dev) for dev in devs}
    before = {}
    for dev in devs:
        state = read_state(shell, dev)
        state.check_restorable()  # refuse before touching anything
        before[dev] = state
    pending = []
    for dev in devs:
        desired = plan_canonical(plans[dev])
        if before[dev].canonical() != desired:
            pending.append(dev)
            result.diff += _diff(before[dev].canonical(), desired, f"{endpoint.host} {dev}")
    if not pending:
        result.steps.append("no change: every device already has this profile")
        return result
    if dry_run:
        result.steps.append(f"dry run: would change {', '.join(pending)}")
        return result
    for dev in pending:
        store.save(endpoint, before[dev])
    result.steps.append(f"saved {', '.join(pending)}")
    try:
        for dev in pending:
            commands = "\n".join(line[len("tc "):] for line in plans[dev].commands()) + "\n"
            shell.check(f"tc qdisc del dev {dev} root 2>/dev/null; tc -batch -", stdin=commands)
            result.steps.append(f"applied {dev}")
        for dev in pending:
            now = read_state(shell, dev).canonical()
            if now != plan_canonical(plans[dev]):
                raise ApplyError(f"{endpoint.address} {dev}: read back differs from the profile:\n" +
                                 "\n".join(_diff(now, plan_canonical(plans[dev]), dev)))
            result.steps.append(f"read back {dev}: matches")
        result.changed = True
        return result
    except GeryonError as exc:
        result.error = str(exc)
        _roll_back(shell, endpoint, {dev: before[dev] for dev in pending}, python, result)
        raise ApplyError(f"applying to {endpoint.address} failed: {exc}; rolled back "
                         f"{', '.join(pending)} to the saved state") from exc


def _roll_back(shell, endpoint, states: dict[str, DeviceState], python: str, result: ApplyResult) -> None:
    for dev, state in states.items():
        for line in state.restore_commands(python):
            shell.check(line)
        if read_state(shell, dev).canonical() != state.canonical():
            raise ApplyError(f"{endpoint.address} {dev}: rolling back did not restore the saved state; "
                             f"restore it by hand:\n" + "\n".join(state.restore_commands(python)))
        result.steps.append(f"rolled back {dev}")
    result.rolled_back = True


def restore_linux(endpoint: Endpoint, shell, devs: list[str], store: SavedStates | None = None,
                  python: str = "python3") -> ApplyResult:
    """Put each device back into the state saved before geryon first changed it, then forget that state."""
    store = store or SavedStates()
    result = ApplyResult(f"linux@{endpoint.address}")
    for dev in devs:
        state = store.load(endpoint, dev)
        if state is None:
            result.steps.append(f"{dev}: nothing saved, left as it is")
            continue
        if read_state(shell, dev).canonical() != state.canonical():
            for line in state.restore_commands(python):
                shell.check(line)
            if read_state(shell, dev).canonical() != state.canonical():
                raise ApplyError(f"{endpoint.address} {dev}: restore did not bring back the saved state")
            result.changed = True
        store.forget(endpoint, dev)
        result.steps.append(f"restored {dev}")
    return result
