"""State records of running clusters, so that another process can `exec`, `down` or `list` them.

One JSON file per cluster, `<state dir>/<name>.json`, holding the cluster's description (the same dict
`geryon emulate up` prints) plus the PID that built it. The directory is `/run/geryon/clusters`, or
`$GERYON_STATE_DIR/clusters` when that environment variable is set (geryon.netconf keeps its own
records beside it, in `.../netconf`). /run is a tmpfs, so records vanish at reboot together with the
namespaces they describe.
"""

import json
import os
from pathlib import Path

from geryon.errors import EmulationError
from geryon.netnames import state_base
from geryon.safefiles import create_exclusive, replace_file



def state_dir() -> Path:
    """Where cluster records live."""
    return state_base() / "clusters"


def record_path(name: str) -> Path:
    return state_dir() / f"{name}.json"


def write_record(name: str, description: dict) -> Path:
    """Write the record atomically (a reader never sees half a file)."""
    path = record_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, json.dumps(description, indent=2, sort_keys=True) + "\n")
    return path


def read_record(name: str) -> dict:
    """The record of cluster `name`; EmulationError if there is none."""
    path = record_path(name)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise EmulationError(
            f"no emulated cluster named {name!r} is up (no record in {path.parent}); "
            "see `geryon emulate list`") from None
    except (OSError, ValueError) as exc:
        raise EmulationError(f"cannot read cluster record {path}: {exc}; "
                             f"run `geryon emulate clean --name {name}`") from exc


def record_exists(name: str) -> bool:
    return record_path(name).exists()


def remove_record(name: str) -> bool:
    try:
        record_path(name).unlink()
        return True
    except FileNotFoundError:
        return False


def list_records() -> list[str]:
    """Names of the clusters that have a record."""
    try:
        return sorted(p.stem for p in state_dir().glob("*.json"))
    except OSError:
        return []


def claim_record(name: str, pid: int | None = None) -> bool:
    """Atomically create a placeholder record; False if a record for `name` already exists.

    Two processes bringing up the same name race here, and exactly one wins.
    """
    path = record_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    return create_exclusive(path, json.dumps({"name": name, "state": "building", "pid": pid or os.getpid()}))
