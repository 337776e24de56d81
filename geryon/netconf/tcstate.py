"""A Linux device's egress configuration as read back from `tc`: saved, compared, and restored.

`read_state(shell, dev)` dumps one device (qdiscs and u32 filters as `tc -j`, HTB classes as `tc -d` text,
since iproute2 prints HTB classes only as text) into a `DeviceState`. Its `canonical()` lines are what
apply compares — before and after, and against a `QueuePlan` (`plan_canonical`) to show the diff and to
notice that applying again would change nothing. `restore_commands()` rebuilds the saved configuration;
a state this module cannot rebuild (a qdisc kind it does not know) is refused when it is *saved*, before
anything is touched. u32 keys at offsets tc cannot write (pyroute2 packs them byte-wise, e.g. DSCP at
offset 1) are restored through pyroute2 on the host, so the dump afterwards is byte for byte the saved one.
"""

import json
import shlex
from dataclasses import dataclass, field

from geryon.errors import ApplyError
from geryon.netconf.plan import ClassOp, FilterOp, QdiscOp, QueuePlan

SEPARATOR = "----geryon----"
_DEFAULT_ROOTS = {"noqueue", "pfifo_fast", "mq", "fq_codel", "fq", "sfq"}
_LEAF_KINDS = {"pfifo": "limit", "bfifo": "limit"}
_PARAMLESS_LEAVES = {"fq_codel", "sfq", "fq", "pfifo_fast"}
_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def dump_command(dev: str) -> str:
    """One shell line printing the three dumps, separated (run on the host, inside its namespace)."""
    return (f"tc -j qdisc show dev {dev} && echo {SEPARATOR} && tc -d class show dev {dev} && "
            f"echo {SEPARATOR} && tc -j filter show dev {dev}")


def tc_rate(bits: int) -> str:
    """Rate the way `tc` prints it (iproute2 sprint_rate on the kernel's bytes/s: 99Mbit, 12345Kbit)."""
    value, unit = (bits // 8) * 8, ""
    for next_unit in ("K", "M", "G", "T"):
        if value < 1000 or (value % 1000 and value < 10**6):
            break
        value, unit = value // 1000, next_unit
    return f"{value}{unit}bit"


def parse_tc_rate(text: str) -> int:
    number = text[:-3] if text.endswith("bit") else text
    unit = number[-1] if number and number[-1] in "KMGT" else ""
    return int(float(number[:-1] if unit else number) * _UNITS[unit])


@dataclass
class DeviceState:
    """One device's qdiscs, HTB classes and u32 filters, as dumped."""

    dev: str
    qdiscs: list = field(default_factory=list)
    classes: list = field(default_factory=list)  # dicts: kind classid parent leaf prio quantum rate ceil burst cburst
    filters: list = field(default_factory=list)  # dicts: parent protocol pref value mask off flowid
    raw: str = ""

    @property
    def root(self) -> dict | None:
        return next((q for q in self.qdiscs if q.get("root")), None)

    @property
    def is_default(self) -> bool:
        root = self.root
        return root is None or root.get("handle") in ("0:", None) or root.get("kind") in ("noqueue",)

    def canonical(self) -> list[str]:
        if self.is_default:
            return ["qdisc kernel-default"]
        lines = [_qdisc_line(q) for q in self.qdiscs]
        parents = {c["parent"] for c in self.classes}
        lines += [_class_line(c, c["classid"] in parents) for c in self.classes]
        lines += [_filter_line(f) for f in self.filters]
        return sorted(lines)

    def as_dict(self) -> dict:
        return {"dev": self.dev, "qdiscs": self.qdiscs, "classes": self.classes, "filters": self.filters,
                "raw": self.raw}

    @classmethod
    def from_dict(cls, data: dict) -> "DeviceState":
        return cls(data["dev"], data["qdiscs"], data["classes"], data["filters"], data.get("raw", ""))

    def check_restorable(self) -> None:
        """ApplyError now (before anything changes) if restore_commands could not rebuild this state."""
        self.restore_commands()

    def restore_commands(self, python: str = "python3") -> list[str]:
        """Shell lines that turn the device back into this state."""
        dev = self.dev
        lines = [f"tc qdisc del dev {dev} root 2>/dev/null || true"]
        if self.is_default:
            return lines
        root = self.root
        if root["kind"] == "htb":
            options = root.get("options", {})
            extra = f" r2q {options['r2q']}" if options.get("r2q", 10) != 10 else ""
            lines.append(f"tc qdisc add dev {dev} root handle {root['handle']} htb default "
                         f"{int(str(options.get('default', '0')), 16):x}{extra}")
        elif root["kind"] in _LEAF_KINDS:
            lines.append(f"tc qdisc add dev {dev} root handle {root['handle']} {root['kind']} "
                         f"limit {root['options']['limit']}")
        else:
            raise self._unsupported(f"root qdisc {root['kind']}")
        lines += [self._class_command(c) for c in _parents_first(self.classes)]
        for qdisc in self.qdiscs:
            if qdisc is root:
                continue
            kind = qdisc["kind"]
            where = f"parent {qdisc['parent']} handle {qdisc['handle']}"
            if kind in _LEAF_KINDS:
                lines.append(f"tc qdisc add dev {dev} {where} {kind} limit {qdisc['options']['limit']}")
            elif kind in _PARAMLESS_LEAVES:
                lines.append(f"tc qdisc add dev {dev} {where} {kind}")
            else:
                raise self._unsupported(f"qdisc {kind} under {qdisc['parent']}")
        packed: list = []  # in dump order: the kernel numbers u32 hash tables (800:, 801:) as they come
        for f in self.filters:
            if f["off"] % 4:
                packed.append(f)
                continue
            if packed:
                lines.append(_pyroute2_filters(dev, packed, python))
                packed = []
            lines.append(f"tc filter add dev {dev} parent {f['parent']} protocol {f['protocol']} pref {f['pref']} "
                         f"u32 match u32 0x{f['value']:08x} 0x{f['mask']:08x} at {f['off']} flowid {f['flowid']}")
        if packed:
            lines.append(_pyroute2_filters(dev, packed, python))
        return lines

    def _class_command(self, c: dict) -> str:
        if c["kind"] != "htb":
            raise self._unsupported(f"class kind {c['kind']}")
        words = [f"tc class add dev {self.dev} parent {c['parent_handle']} classid {c['classid']} htb",
                 f"rate {c['rate']}bit ceil {c['ceil']}bit"]
        if c.get("prio") is not None:
            words.append(f"prio {c['prio']}")
        if c.get("quantum") is not None:
            words.append(f"quantum {c['quantum']}")
        if c.get("burst"):
            words.append(f"burst {c['burst']} cburst {c['cburst']}")
        return " ".join(words)

    def _unsupported(self, what: str) -> ApplyError:
        return ApplyError(f"{self.dev}: its current {what} is not something geryon can save and restore, so it "
                          "will not replace it: remove it by hand (`tc qdisc del dev DEV root`) or keep it")


def _parents_first(classes: list) -> list:
    done, ordered, pending = set(), [], list(classes)
    while pending:
        progressed = False
        for c in list(pending):
            if c["parent"] == "root" or c["parent"] in done or c["parent"] not in {x["classid"] for x in classes}:
                ordered.append(c)
                done.add(c["classid"])
                pending.remove(c)
                progressed = True
        if not progressed:
            ordered += pending
            break
    return ordered


def _pyroute2_filters(dev: str, filters: list, python: str) -> str:
    specs = [{"parent": f["parent"], "proto": 0x0800 if f["protocol"] == "ip" else 0x86DD, "pref": f["pref"],
              "key": f"0x{f['value']:08x}/0x{f['mask']:08x}+{f['off']}", "flowid": f["flowid"]} for f in filters]
    script = ("import json,sys\nfrom pyroute2 import IPRoute\n"
              "h=lambda s:(int(s.split(':')[0] or '0',16)<<16)|int(s.split(':')[1] or '0',16)\n"
              "ipr=IPRoute();i=ipr.link_lookup(ifname=sys.argv[1])[0]\n"
              "for f in json.loads(sys.argv[2]):\n"
              " ipr.tc('add-filter','u32',index=i,parent=h(f['parent']),prio=f['pref'],protocol=f['proto'],"
              "target=h(f['flowid']),keys=[f['key']])\n")
    return f"{python} -c {shlex.quote(script)} {dev} {shlex.quote(json.dumps(specs))}"


def _qdisc_line(q: dict) -> str:
    where = "root" if q.get("root") else f"parent {q.get('parent')}"
    options = q.get("options", {})
    extra = ""
    if q["kind"] == "htb":
        extra = f" default 0x{int(str(options.get('default', '0')), 16):x}"
    elif q["kind"] in _LEAF_KINDS:
        extra = f" limit {options.get('limit')}"
    return f"qdisc {q['kind']} {q['handle']} {where}{extra}"


def _class_line(c: dict, inner: bool) -> str:
    line = f"class {c['kind']} {c['classid']} parent {c['parent']}"
    if not inner:
        line += f" prio {c.get('prio')} quantum {c.get('quantum')}"
    return line + f" rate {tc_rate(c['rate'])} ceil {tc_rate(c['ceil'])}"


def _filter_line(f: dict) -> str:
    return (f"filter {f['parent']} {f['protocol']} pref {f['pref']} u32 "
            f"{f['value']:08x}/{f['mask']:08x} at {f['off']} flowid {f['flowid']}")


def parse_state(dev: str, text: str) -> DeviceState:
    """Parse the output of `dump_command(dev)`."""
    parts = text.split(SEPARATOR)
    if len(parts) != 3:
        raise ApplyError(f"{dev}: unexpected `tc` output (is iproute2 installed there?): {text[:200]!r}")
    try:
        qdiscs = json.loads(parts[0] or "[]")
        raw_filters = json.loads(parts[2] or "[]")
    except ValueError as exc:
        raise ApplyError(f"{dev}: cannot read `tc -j` output: {exc}") from None
    root_handle = next((q["handle"] for q in qdiscs if q.get("root")), "1:")
    classes = [_parse_class(line, root_handle) for line in parts[1].splitlines() if line.startswith("class ")]
    filters = []
    for f in raw_filters:
        options = f.get("options", {})
        match = options.get("match")
        if not match:
            continue
        if isinstance(match, list) or "flowid" not in options:
            raise ApplyError(f"{dev}: a u32 filter with several keys or without a flowid is not something geryon "
                             "can restore; remove it by hand first")
        filters.append({"parent": f["parent"], "protocol": f["protocol"], "pref": f["pref"],
                        "value": int(match["value"], 16), "mask": int(match["mask"], 16), "off": match["off"],
                        "flowid": options["flowid"]})
    return DeviceState(dev, qdiscs, classes, filters, text)


def _parse_class(line: str, root_handle: str) -> dict:
    words = line.split()
    c = {"kind": words[1], "classid": words[2], "parent": "root", "parent_handle": root_handle, "prio": None,
         "quantum": None, "rate": 0, "ceil": 0, "burst": None, "cburst": None}
    i = 3
    while i < len(words):
        word = words[i]
        if word == "root":
            i += 1
            continue
        value = words[i + 1] if i + 1 < len(words) else ""
        if word == "parent":
            c["parent"] = c["parent_handle"] = value
        elif word in ("prio", "quantum"):
            c[word] = int(value)
        elif word in ("rate", "ceil"):
            c[word] = parse_tc_rate(value)
        elif word in ("burst", "cburst"):
            c[word] = value.split("/")[0]
        i += 2 if word in ("parent", "leaf", "prio", "quantum", "rate", "ceil", "burst", "cburst", "mpu",
                           "linklayer", "level", "overhead") else 1
    return c


def read_state(shell, dev: str) -> DeviceState:
    """Dump `dev` on the host behind `shell` (an SshShell)."""
    rc, out, err = shell.run(dump_command(dev))
    if rc != 0:
        raise ApplyError(f"{shell.endpoint.address}: cannot read the queues of {dev}: {err.strip() or out.strip()} "
                         "(does the interface exist there?)")
    return parse_state(dev, out)


def plan_canonical(plan: QueuePlan) -> list[str]:
    """The canonical lines a device shows once `plan` is applied with tc (see DeviceState.canonical)."""
    lines = []
    parents = {op.parent for op in plan.ops if isinstance(op, ClassOp)}
    for op in plan.ops:
        params = dict(op.params) if hasattr(op, "params") else {}
        if isinstance(op, QdiscOp):
            where = "root" if op.parent == "root" else f"parent {op.parent}"
            extra = f" default 0x{int(params['default'], 16):x}" if op.kind == "htb" else \
                f" limit {params['limit']}" if op.kind in _LEAF_KINDS else ""
            lines.append(f"qdisc {op.kind} {op.handle} {where}{extra}")
        elif isinstance(op, ClassOp):
            parent = "root" if op.parent.endswith(":") else op.parent
            line = f"class {op.kind} {op.classid} parent {parent}"
            if op.classid not in parents:
                line += f" prio {params.get('prio', 0)} quantum {params.get('quantum')}"
            lines.append(line + f" rate {tc_rate(params['rate'])} ceil {tc_rate(params['ceil'])}")
        elif isinstance(op, FilterOp):
            shift = 16 if op.protocol == "ip" else 20
            lines.append(f"filter {op.parent} {op.protocol} pref {op.pref} u32 "
                         f"{(op.dscp << 2) << shift:08x}/{0xfc << shift:08x} at 0 flowid {op.flowid}")
    return sorted(lines)
