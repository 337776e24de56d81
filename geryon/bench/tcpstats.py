"""TCP counters of emulated hosts (what `nstat` shows), read before and after a benchmark's phase.

Each host is a network namespace with its own SNMP counters; `read_counters` cats /proc/net/netstat and
/proc/net/snmp inside it (cheap: one short process per host, outside any timed window) and keeps the
counters that tell loss from spurious recovery: retransmissions, RTOs, tail-loss probes, undos, DSACKs.
"""

from geryon.errors import EmulationError

# (section, counter) -> the name a row reports
COUNTERS = {
    ("Tcp", "OutSegs"): "out_segs",
    ("Tcp", "RetransSegs"): "retrans_segs",
    ("TcpExt", "TCPTimeouts"): "timeouts",
    ("TcpExt", "TCPSpuriousRTOs"): "spurious_rtos",
    ("TcpExt", "TCPLossProbes"): "loss_probes",
    ("TcpExt", "TCPLossUndo"): "loss_undo",
    ("TcpExt", "TCPDSACKRecv"): "dsack_recv",
    ("TcpExt", "TCPFastRetrans"): "fast_retrans",
}


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


def read_counters(cluster, host: str) -> dict[str, int]:
    """The COUNTERS of one host, as absolute values since its namespace was made."""
    done = cluster.run(host, ["cat", "/proc/net/netstat", "/proc/net/snmp"], timeout=30, capture_output=True,
                       text=True)
    if done.returncode != 0:
        raise EmulationError(f"cannot read {host}'s TCP counters: {done.stderr.strip()}")
    # netstat and snmp each pair their lines; concatenated they still alternate names/values
    values = parse_snmp(done.stdout)
    return {label: values.get(key, 0) for key, label in COUNTERS.items()}


def read_all(cluster, hosts: list[str]) -> dict[str, dict[str, int]]:
    return {host: read_counters(cluster, host) for host in hosts}


def deltas(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Per host, what each counter grew by between two `read_all` snapshots."""
    return {host: {name: after[host][name] - before[host][name] for name in after[host]} for host in after}


def counted(cluster, hosts: list[str], run):
    """`run()`'s result, and the COUNTERS each of `hosts` added while it ran (`deltas`)."""
    before = read_all(cluster, hosts)
    result = run()
    return result, deltas(before, read_all(cluster, hosts))
