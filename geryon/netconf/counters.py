"""Per-class counters of an interface's priority queues, read back from the kernel.

Bytes and packets sent, drops, overlimits and the current backlog of each priority class, labelled
with the class name and DSCP recorded when the plan was applied (`geryon.netconf.state`). Devices
configured by something else, or whose record is gone, are still read: their leaf classes are listed by
class id with `name` set to the class id and `dscp` None. A shaping-only device has one class, "all".
"""

from dataclasses import asdict, dataclass

from pyroute2.netlink.exceptions import NetlinkError

from geryon.errors import NetconfError
from geryon.netconf.apply import open_device
from geryon.netconf.plan import int_to_handle
from geryon.netconf.state import load_plan_state, recorded_classes


@dataclass(frozen=True)
class ClassCounters:
    """Counters of one tc class since it was created."""

    name: str
    dscp: int | None
    classid: str
    bytes: int
    packets: int
    drops: int
    overlimits: int
    backlog_bytes: int
    backlog_packets: int

    def as_dict(self) -> dict:
        return asdict(self)


def read_class_counters(dev: str, netns: str | None = None) -> list[ClassCounters]:
    """Counters of dev's priority classes, highest priority first (empty if dev has no classes)."""
    ipr, index = open_device(dev, netns)
    try:
        messages = list(ipr.get_classes(index=index))
    except NetlinkError as exc:
        raise NetconfError(f"cannot read the classes of {dev!r}: {exc.args[-1]}") from exc
    finally:
        ipr.close()
    stats = {int_to_handle(msg["handle"]): _stats_of(msg) for msg in messages}
    parents = {int_to_handle(msg["parent"]) for msg in messages}
    record = load_plan_state(dev, netns)
    if record and all(classid in stats for classid in record["class_ids"]):
        names = recorded_classes(record)
        wanted = record["class_ids"]
        unnamed = "all" if record.get("layout") == "shaping" else None
    else:  # not ours, or the record is stale: every leaf class, in class-id order
        names = {}
        wanted = sorted((classid for classid in stats if classid not in parents), key=_classid_key)
        unnamed = None
    counters = []
    for classid in wanted:
        cls = names.get(classid)
        name = cls.name if cls else unnamed or classid
        counters.append(ClassCounters(name, cls.dscp if cls else None, classid, **stats[classid]))
    return counters


def counters_by_name(counters: list[ClassCounters]) -> dict[str, ClassCounters]:
    """Index counters by class name."""
    return {counter.name: counter for counter in counters}


def _classid_key(classid: str) -> tuple[int, int]:
    major, _, minor = classid.partition(":")
    return int(major, 16), int(minor or "0", 16)


def _stats_of(msg) -> dict:
    stats2 = msg.get_attr("TCA_STATS2")
    basic = stats2.get_attr("TCA_STATS_BASIC") if stats2 else None
    queue = stats2.get_attr("TCA_STATS_QUEUE") if stats2 else None
    if basic is None or queue is None:  # old kernels only send TCA_STATS
        legacy = msg.get_attr("TCA_STATS") or {}
        basic = basic or legacy
        queue = queue or legacy
    return {
        "bytes": int(basic.get("bytes", 0)), "packets": int(basic.get("packets", 0)),
        "drops": int(queue.get("drops", 0)), "overlimits": int(queue.get("overlimits", 0)),
        "backlog_bytes": int(queue.get("backlog", 0)), "backlog_packets": int(queue.get("qlen", 0)),
    }
