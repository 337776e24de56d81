"""Remove everything geryon's emulation made (like Mininet's `mn -c`), also after a crash.

What counts as ours: namespaces named `gy*`, links named `gy*` left in the root namespace, the
processes still running inside those namespaces, and state records. `clean(name=...)` limits all of
it to one cluster, `clean(prefix=...)` to clusters whose name starts with a prefix; tests use only
those forms because other runs may be using other `gy*` names at the same time.
"""

import logging
from dataclasses import dataclass, field

from pyroute2 import IPRoute

from geryon.emulate import fabric, state
from geryon.emulate.topology import check_name
from geryon.errors import ConfigError, require_root
from geryon.netconf.state import state_dir as netconf_state_dir

log = logging.getLogger(__name__)


@dataclass
class CleanReport:
    """What `clean` removed."""

    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    records: list[str] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"namespaces": self.namespaces, "links": self.links, "records": self.records,
                "processes": self.processes}


def _matches(cluster: str, name: str | None, prefix: str | None) -> bool:
    if name is not None:
        return cluster == name
    return cluster.startswith(prefix or "")


def cluster_of(netns_name: str) -> str | None:
    """The cluster name a `gy<name>-...` namespace or link belongs to, or None if it is not ours."""
    if not netns_name.startswith("gy") or "-" not in netns_name:
        return None
    return netns_name[2:].split("-", 1)[0]


def clean(name: str | None = None, prefix: str | None = None) -> CleanReport:
    """Remove geryon's namespaces, processes, root-namespace links and records.

    name: only the cluster with exactly this name; prefix: only clusters whose name starts with it;
    neither: everything named gy*.
    """
    require_root("cleaning up emulated clusters")
    if name is not None and prefix is not None:
        raise ConfigError("give either a cluster name or a prefix, not both")
    if name is not None:
        check_name(name)
    if prefix is not None and (not prefix.isalnum() or prefix != prefix.lower()):
        raise ConfigError(f"bad prefix {prefix!r}: use lowercase letters and digits")
    report = CleanReport()

    doomed = [ns for ns in fabric.list_netns("gy") if _cluster_matches(ns, name, prefix)]
    if doomed:
        report.processes = sorted(pid for pids in fabric.netns_pids(doomed).values() for pid in pids)
        report.namespaces = fabric.remove_namespaces(doomed)

    report.links = _remove_root_links(name, prefix)

    _forget_stale_queue_records(name, prefix)
    for cluster in state.list_records():
        if _matches(cluster, name, prefix) and state.remove_record(cluster):
            report.records.append(cluster)
    if any((report.namespaces, report.links, report.records)):
        log.info("cleaned %s", report.as_dict())
    return report


def _cluster_matches(item: str, name: str | None, prefix: str | None) -> bool:
    if name is None and prefix is None:
        return item.startswith("gy")
    cluster = cluster_of(item)
    return cluster is not None and _matches(cluster, name, prefix)


def _remove_root_links(name: str | None, prefix: str | None) -> list[str]:
    """Delete gy* links in the root namespace (geryon never makes them now; older runs or tools may)."""
    removed = []
    with IPRoute() as ipr:
        for link in ipr.link("dump"):
            ifname = link.get("ifname") or ""
            if ifname.startswith("gy") and _cluster_matches(ifname, name, prefix):
                try:
                    ipr.link("del", index=link["index"])
                    removed.append(ifname)
                except Exception as exc:  # its peer's removal may already have taken it
                    log.debug("could not delete %s: %s", ifname, exc)
    return removed


def _forget_stale_queue_records(name: str | None, prefix: str | None) -> None:
    """geryon.netconf's records of devices in namespaces of ours that no longer exist."""
    try:
        entries = [p.name for p in netconf_state_dir().iterdir() if p.is_dir()]
    except OSError:
        return
    fabric.forget_queue_records([e for e in entries if e.startswith("gy") and _cluster_matches(e, name, prefix)])
