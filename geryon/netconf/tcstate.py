"""A Linux device's egress configuration as read back from `tc`: saved, compared, and restored.

`read_state(shell, dev)` dumps one device (qdiscs as `tc -j`; HTB classes as `tc -d` text, since iproute2
prints HTB classes only as text; u32 filters as text, since `tc -j` prints a filter's several keys as
repeated "match" members of one JSON object, of which a parser keeps only the last) into a `DeviceState`.
Its `canonical()` lines are what apply compares — before and after, and against a `QueuePlan`
(`plan_canonical`) to show the diff and to notice that applying again would change nothing.
`restore_commands()` rebuilds the saved configuration; a state this module cannot rebuild (a qdisc kind
it does not know) is refused when it is *saved*, before anything is touched. u32 keys at offsets tc
cannot write (pyroute2 packs them byte-wise, e.g. DSCP at offset 1) are restored through pyroute2 on the
host, so the dump afterwards is byte for byte the saved one. A filter is a list of keys (value, mask,
offset): one for a DSCP filter, several for a pure-ACK filter (`geryon.netconf.plan.AckFilterOp`).
"""

import json
import shlex
from dataclasses import dataclass, field

from geryon.errors import ApplyError
from geryon.netconf.plan import AckFilterOp, ClassOp, FilterOp, QdiscOp, QueuePlan, pyroute2_keys

SEPARATOR = "----geryon----"
_DEFAULT_ROOTS = {"noqueue", "pfifo_fast", "mq", "fq_codel", "fq", "sfq"}
_LEAF_KINDS = {"pfifo": "limit", "bfifo": "limit"}
_PARAMLESS_LEAVES = {"fq_codel", "sfq", "fq", "pfifo_fast"}
_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def dump_command(dev: str) -> str:
    """One shell line printing the three dumps, separated (run on the host, inside its namespace)."""
    return (f"tc -j qdisc show dev {dev} && echo {SEPARATOR} && tc -d class show dev {dev} && "
            f"echo {SEPARATOR} && tc filter show dev {dev}")


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
    filters: list = field(default_factory=list)  # dicts: parent protocol pref keys [{value mask off}] flowid
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
        return cls(data["dev"], data["qdiscs"], data["classes"], [_with_keys(f) for f in data["filters"]],
                   data.get("raw", ""))

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
            if any(key["off"] % 4 for key in f["keys"]):
                packed.append(f)
                continue
            if packed:
                lines.append(_pyroute2_filters(dev, packed, python))
                packed = []
            matches = " ".join(f"match u32 0x{key['value']:08x} 0x{key['mask']:08x} at {key['off']}"
                               for key in f["keys"])
            lines.append(f"tc filter add dev {dev} parent {f['parent']} protocol {f['protocol']} pref {f['pref']} "
                         f"u32 {matches} flowid {f['flowid']}")
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
              "keys": pyroute2_keys([(k["value"], k["mask"], k["off"]) for k in f["keys"]]), "flowid": f["flowid"]}
             for f in filters]
    script = ("import json,sys\nfrom pyroute2 import IPRoute\n"
              "h=lambda s:(int(s.split(':')[0] or '0',16)<<16)|int(s.split(':')[1] or '0',16)\n"
              "ipr=IPRoute();i=ipr.link_lookup(ifname=sys.argv[1])[0]\n"
              "for f in json.loads(sys.argv[2]):\n"
              " ipr.tc('add-filter','u32',index=i,parent=h(f['parent']),prio=f['pref'],protocol=f['proto'],"
              "target=h(f['flowid']),keys=f['keys'])\n")
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
    return _u32_line(f["parent"], f["protocol"], f["pref"], [(k["value"], k["mask"], k["off"]) for k in f["keys"]],
                     f["flowid"])


def _u32_line(parent: str, protocol: str, pref: int, keys, flowid: str) -> str:
    matches = " ".join(f"{value:08x}/{mask:08x} at {off}" for value, mask, off in sorted(keys, key=lambda k: k[2]))
    return f"filter {parent} {protocol} pref {pref} u32 {matches} flowid {flowid}"


def _with_keys(f: dict) -> dict:
    """A filter record with its `keys` list (records saved before filters had several keys had one key)."""
    if "keys" in f:
        return f
    rest = {k: v for k, v in f.items() if k not in ("value", "mask", "off")}
    return {**rest, "keys": [{"value": f["value"], "mask": f["mask"], "off": f["off"]}]}


def parse_state(dev: str, text: str) -> DeviceState:
    """Parse the output of `dump_command(dev)`."""
    parts = text.split(SEPARATOR)
    if len(parts) != 3:
        raise ApplyError(f"{dev}: unexpected `tc` output (is iproute2 installed there?): {text[:200]!r}")
    json_filters = parts[2].strip().startswith("[")  # older dumps: `tc -j filter show`
    try:
        qdiscs = json.loads(parts[0] or "[]")
        raw_filters = json.loads(parts[2]) if json_filters else []
    except ValueError as exc:
        raise ApplyError(f"{dev}: cannot read `tc -j` output: {exc}") from None
    root_handle = next((q["handle"] for q in qdiscs if q.get("root")), "1:")
    classes = [_parse_class(line, root_handle) for line in parts[1].splitlines() if line.startswith("class ")]
    filters = _json_filters(dev, raw_filters) if json_filters else _text_filters(dev, parts[2])
    return DeviceState(dev, qdiscs, classes, filters, text)


def _json_filters(dev: str, raw_filters: list) -> list:
    """Filters from a `tc -j filter show` dump (single-key u32 filters only: see the module docstring)."""
    filters = []
    for f in raw_filters:
        options = f.get("options", {})
        match = options.get("match")
        if not match:
            continue
        if isinstance(match, list) or "flowid" not in options:
            raise _unrestorable_filter(dev)
        filters.append({"parent": f["parent"], "protocol": f["protocol"], "pref": f["pref"],
                        "flowid": options["flowid"],
                        "keys": [{"value": int(match["value"], 16), "mask": int(match["mask"], 16),
                                  "off": match["off"]}]})
    return filters


def _text_filters(dev: str, text: str) -> list:
    """Filters from a `tc filter show` dump: a 'filter ... fh X::Y ... flowid C' line per u32 node, then its
    '  match VALUE/MASK at OFF' lines. Anything else under a node (actions, nexthdr offsets) is refused."""
    filters: list = []
    current = None
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        if words[0] == "filter":
            current = None
            if "u32" not in words:
                raise _unrestorable_filter(dev)
            if not _node_handle(words):
                continue  # the filter's head or its hash table, not a node with keys
            flowid = next((w2 for w1, w2 in zip(words, words[1:]) if w1.lstrip("*") == "flowid"), None)
            if flowid is None:
                raise _unrestorable_filter(dev)
            current = {"parent": _word_after(words, "parent"), "protocol": _word_after(words, "protocol"),
                       "pref": int(_word_after(words, "pref")), "flowid": flowid, "keys": []}
            filters.append(current)
        elif words[0] == "match" and current is not None and len(words) == 4 and words[2] == "at" \
                and words[3].isdigit():
            value, _, mask = words[1].partition("/")
            current["keys"].append({"value": int(value, 16), "mask": int(mask, 16), "off": int(words[3])})
        elif current is not None:
            raise _unrestorable_filter(dev)
    if any(not f["keys"] for f in filters):
        raise _unrestorable_filter(dev)
    return filters


def _node_handle(words: list[str]) -> bool:
    """Whether a filter line is a u32 node (handle HT:BUCKET:NODE, e.g. 800::800), not a head or a table."""
    handle = _word_after(words, "fh") or ""
    return handle.count(":") == 2 and not handle.endswith(":")


def _word_after(words: list[str], keyword: str) -> str | None:
    return next((b for a, b in zip(words, words[1:]) if a == keyword), None)


def _unrestorable_filter(dev: str) -> ApplyError:
    return ApplyError(f"{dev}: a filter other than u32 matches with a flowid (actions, hashing, nexthdr offsets) is "
                      "not something geryon can restore; remove it by hand first")


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
        elif isinstance(op, (FilterOp, AckFilterOp)):
            lines.append(_u32_line(op.parent, op.protocol, op.pref, op.keys(), op.flowid))
    return sorted(lines)
