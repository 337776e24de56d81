"""TCP counters and packet drops of emulated hosts, read before and after a benchmark's phase.

Each host is a network namespace with its own SNMP counters; `read_counters` cats /proc/net/netstat and
/proc/net/snmp inside it (cheap: one short process per host, outside any timed window) and keeps the
counters that tell loss from spurious recovery: retransmissions, RTOs, tail-loss probes, DSACKs (`dsack_recv`
counts DSACK blocks, one of which can cover many segments; `dsack_recv_segs` the segments), and
the sender's undos (`full_undo`, `partial_undo`, `dsack_undo`, `loss_undo`: a recovery it found needless,
by DSACK or by the timestamps ACKs echo) with the reordering it detected (`sack_reorders`, `ts_reorders`).
A retransmission that no DSACK answers was not necessarily lost: the sender may have seen by timestamps
that the original arrived (at 1 Gbit/s the emulation's veth path reorders; docs/transport.md).

A retransmission says a segment was lost, not where. Each host's counters also say where its packets
can have been dropped: its own egress queues (`host_queue_drops`, the tc classes of its interface), the
switch's egress port toward it (`switch_port_drops`: where the traffic *into* the host queues), the
two ends of its link (`host_link_drops`, `switch_link_drops`: a veth's rx and tx drops), its IP input
(`ip_in_discards`) and its TCP receive path (`backlog_drops`: the socket was busy and its backlog full;
`rcvq_drops`: the receive buffer was full; `ofo_drops`: no room for an out-of-order segment;
`ofo_pruned`, `rcv_pruned`: segments thrown away to fit the receive buffer; `zero_window_drops`: a
segment beyond a zero window). Drops outside every namespace — a CPU's input backlog overflowing
(`/proc/net/softnet_stat`, what veth hands on lands there) — are machine-wide: `Counted.softnet_drops`.
"""

from dataclasses import dataclass

from geryon.errors import EmulationError
from geryon.netconf.apply import open_device
from geryon.netconf.counters import read_class_counters

# (section, counter) -> the name a row reports
COUNTERS = {
    ("Tcp", "OutSegs"): "out_segs",
    ("Tcp", "RetransSegs"): "retrans_segs",
    ("TcpExt", "TCPTimeouts"): "timeouts",
    ("TcpExt", "TCPSpuriousRTOs"): "spurious_rtos",
    ("TcpExt", "TCPLossProbes"): "loss_probes",
    ("TcpExt", "TCPLossUndo"): "loss_undo",
    ("TcpExt", "TCPDSACKRecv"): "dsack_recv",
    ("TcpExt", "TCPDSACKRecvSegs"): "dsack_recv_segs",
    ("TcpExt", "TCPFastRetrans"): "fast_retrans",
    ("TcpExt", "TCPBacklogDrop"): "backlog_drops",
    ("TcpExt", "TCPRcvQDrop"): "rcvq_drops",
    ("TcpExt", "TCPOFODrop"): "ofo_drops",
    ("TcpExt", "OfoPruned"): "ofo_pruned",
    ("TcpExt", "RcvPruned"): "rcv_pruned",
    ("TcpExt", "TCPZeroWindowDrop"): "zero_window_drops",
    ("Ip", "InDiscards"): "ip_in_discards",
    ("TcpExt", "TCPSACKReorder"): "sack_reorders",
    ("TcpExt", "TCPTSReorder"): "ts_reorders",
    ("TcpExt", "TCPFullUndo"): "full_undo",
    ("TcpExt", "TCPPartialUndo"): "partial_undo",
    ("TcpExt", "TCPDSACKUndo"): "dsack_undo",
}
SOFTNET_STAT = "/proc/net/softnet_stat"


def parse_snmp(text: str) -> dict[tuple[str, str], int]:
    """/proc/net/netstat or /proc/net/snmp text -> {(section, name): value} (each section is a header
    line of names followed by a line of values, both prefixed 'Section:')."""
    values: dict[tuple[str, str], int] = {}
    lines = [line.split() for line in text.splitlines() if line.strip()]
    for names, numbers in zip(lines[::2], lines[1::2]):
        if not names or names[0] != numbers[0]:
            raise EmulationError(f"unexpected /proc/net counters layout near {' '.join(names[:3])!r}")
        section = names[0].rstrip(":")
        for name, number in zip(names[1:], numbers[1:]):
            values[(section, name)] = int(number)
    return values


def queue_drops(dev: str, netns: str) -> int:
    """Packets the tc classes of `dev` (in `netns`) dropped since they were made; 0 without classes."""
    return sum(c.drops for c in read_class_counters(dev, netns))


def link_drops(dev: str, netns: str) -> int:
    """Packets the device `dev` (in `netns`) dropped, received and sent, since it was made: its
    IFLA_STATS64 rx_dropped + tx_dropped (a veth counts what it could not hand to its peer)."""
    ipr, index = open_device(dev, netns)
    try:
        stats = ipr.get_links(index)[0].get_attr("IFLA_STATS64")
    finally:
        ipr.close()
    if stats is None:
        raise EmulationError(f"{dev!r} in {netns!r} reports no link statistics")
    return stats["rx_dropped"] + stats["tx_dropped"]


def parse_softnet_drops(text: str) -> int:
    """Packets dropped because a CPU's input backlog was full, all CPUs: /proc/net/softnet_stat's second
    column (hexadecimal, one line per CPU)."""
    try:
        return sum(int(line.split()[1], 16) for line in text.splitlines() if line.strip())
    except (IndexError, ValueError) as exc:
        raise EmulationError(f"unexpected {SOFTNET_STAT} layout: {text[:80]!r}") from exc


def softnet_drops() -> int:
    with open(SOFTNET_STAT) as f:
        return parse_softnet_drops(f.read())


def read_counters(cluster, host: str) -> dict[str, int]:
    """The COUNTERS and queue drops of one host, as absolute values since its namespace was made."""
    done = cluster.run(host, ["cat", "/proc/net/netstat", "/proc/net/snmp"], timeout=30, capture_output=True,
                       text=True)
    if done.returncode != 0:
        raise EmulationError(f"cannot read {host}'s TCP counters: {done.stderr.strip()}")
    # netstat and snmp each pair their lines; concatenated they still alternate names/values
    values = parse_snmp(done.stdout)
    counters = {label: values.get(key, 0) for key, label in COUNTERS.items()}
    me = cluster.host(host)
    switch_netns, switch_dev = cluster.switch_port(host)
    counters["host_queue_drops"] = queue_drops(me.iface, me.netns)
    counters["switch_port_drops"] = queue_drops(switch_dev, switch_netns)
    counters["host_link_drops"] = link_drops(me.iface, me.netns)
    counters["switch_link_drops"] = link_drops(switch_dev, switch_netns)
    return counters


def read_all(cluster, hosts: list[str]) -> dict[str, dict[str, int]]:
    return {host: read_counters(cluster, host) for host in hosts}


def deltas(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Per host, what each counter grew by between two `read_all` snapshots."""
    return {host: {name: after[host][name] - before[host][name] for name in after[host]} for host in after}


@dataclass
class Counted:
    """What `counted` measured around one phase."""

    result: object
    per_host: dict[str, dict[str, int]]   # each host's counters' growth (`deltas`)
    softnet_drops: int                    # machine-wide: CPUs' input backlogs (every namespace, and others)


def counted(cluster, hosts: list[str], run) -> Counted:
    """`run()`'s result, the counters each of `hosts` added while it ran, and the machine's softnet drops."""
    before, softnet_before = read_all(cluster, hosts), softnet_drops()
    result = run()
    return Counted(result, deltas(before, read_all(cluster, hosts)), softnet_drops() - softnet_before)
