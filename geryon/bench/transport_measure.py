"""What every transport bench row is made of: the bench's emulated cluster, the flags its role processes
share, the iperf3 baseline, and the figures drawn from the roles' result records (iteration times,
CPU seconds per GB, steal). The benches themselves: geryon.bench.transport_ps (`bench transport`),
geryon.bench.transport_allreduce (`bench allreduce`), geryon.bench.transport (`bench priority`, flags).
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid

from geryon.transport.config import TransportConfig


def print_row(args, record: dict) -> None:
    """Print a result row (JSON with --json, else key=value), with the emulation settings it ran under."""
    if "bw" in record:
        record = {**record, "mtu": args.mtu, "ack_priority": args.ack_priority, "offload": args.offload}
    if args.json:
        print(json.dumps(record), flush=True)
    else:
        print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in record.items()), flush=True)


def bench_cluster(hosts: int, args, default_congestion: bool = False):
    """The bench's cluster; with `default_congestion`, --congestion is every host's default (for gloo,
    which cannot pick its sockets' congestion control)."""
    from geryon.emulate import EmulatedCluster
    return EmulatedCluster("b" + uuid.uuid4().hex[:5], hosts=hosts, bw=args.bw,
                           tcp_congestion=args.congestion if default_congestion else None, mtu=args.mtu,
                           ack_priority=args.ack_priority, offload=args.offload)


def class0_dscp(policy: str) -> int:
    """The DSCP of the flow that carries class 0 (every bench tensor's class) under `policy`."""
    config = TransportConfig(secret="bench", policy=policy)
    return config.flow_dscp(config.scheduling.flow_of(0))


def max_slice_bytes(args) -> int:
    """--max-slice-bytes, at least --slice-bytes (a larger --slice-bytes alone means fixed pieces of it)."""
    return max(args.max_slice_bytes, args.slice_bytes)


def role_flags(args) -> list[str]:
    """The transport flags every role process of a bench gets from the bench's own."""
    extra = ["--slice-bytes", args.slice_bytes, "--max-slice-bytes", max_slice_bytes(args),
             "--timeout", 120, "--notsent-lowat", args.notsent_lowat,
             "--rto-min-us", args.rto_min_us, "--thread-rt-priority", args.thread_rt_priority]
    if args.congestion:
        extra += ["--congestion", args.congestion]
    if args.full_headers:
        extra.append("--full-headers")
    return extra


IPERF3_SECONDS = 5   # an iperf3 baseline's run (`geryon bench transport --iperf-seconds`)


def iperf3_goodput(cluster, seconds: int = IPERF3_SECONDS, bidir: bool = False, congestion: str | None = None,
                   dscp: int = 0) -> float:
    """iperf3 goodput h1 -> h2 in bit/s, packets marked `dscp`; with `bidir`, the mean of both directions."""
    server = cluster.popen("h2", ["iperf3", "-s", "-1", "-p", "5399"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    extra = (["--bidir"] if bidir else []) + (["-C", congestion] if congestion else []) + ["-S", str(dscp << 2)]
    try:
        time.sleep(0.5)
        out = cluster.run("h1", ["iperf3", "-c", cluster.host("h2").ip, "-p", "5399", "-t", str(seconds),
                                 "-J", *extra], timeout=seconds + 30, capture_output=True, text=True)
        end = json.loads(out.stdout)["end"]
        if bidir:
            return (end["sum_received"]["bits_per_second"]
                    + end["sum_received_bidir_reverse"]["bits_per_second"]) / 2
        return float(end["sum_received"]["bits_per_second"])
    finally:
        server.kill()
        server.wait()


def median(values: list[float]) -> float:
    """The upper median (a measured value, never a mean of two)."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def iteration_seconds(records: list[list[dict]]) -> list[float]:
    """Per timed iteration, the slowest process's time (a collective ends when its last rank does)."""
    runs = [r[-1]["all_seconds"] for r in records if r and "all_seconds" in r[-1]]
    return [max(times) for times in zip(*runs)]


def coflow_periods(records: list[list[dict]]) -> list[float]:
    """Per timed PS iteration, the time from the last worker's end of the iteration before (of the
    warm-up, for the first) to the last worker's end of this one: the job's iteration period.

    A worker that finished the iteration before early starts its next push early and waits for the
    others' pushes, so its own duration carries the previous iteration's skew; the maximum of the
    workers' durations counts that skew, the period does not. The emulated hosts share one clock."""
    results = [r[-1] for r in records]
    lasts = [max(r["started"] for r in results)]
    lasts += [max(ends) for ends in zip(*(r["all_ends"] for r in results))]
    return [b - a for a, b in zip(lasts, lasts[1:])]


MACHINE = "machine_cpu_seconds"   # a result record's field: the machine's busy CPU seconds (rank 0 only)
USER = "user_cpu_seconds"         # ... the user-space part of cpu_seconds (the interpreter, numpy, torch)
SWITCHES = "context_switches"     # ... the process's context switches (a count, summed like seconds)
FAULTS = "minor_faults"            # ... a PS server's minor page faults while it served (a count)


def summed(records: list[list[dict]], key: str = "cpu_seconds") -> float:
    """A result-record field summed over every process: by default CPU seconds (user + system, every
    thread) of their measured part; with key=MACHINE, the machine's busy seconds over rank 0's timed
    collectives (transport_roles.machine_seconds); with USER, SWITCHES or FAULTS, the processes' user
    seconds, context switches or (PS servers) minor page faults."""
    return sum(record.get(key, 0.0) for r in records for record in r if record.get("event") == "result")


def steal_seconds(records: list[list[dict]]) -> list[float] | None:
    """Rank 0's CPU seconds stolen by the hypervisor during each timed collective (None: not measured)."""
    stolen = [record["all_steal_seconds"] for r in records for record in r
              if record.get("event") == "result" and "all_steal_seconds" in record]
    return stolen[0] if stolen else None


def per_gb(cpu_seconds: float, wire_bytes: float) -> float:
    """`cpu_seconds` per GB of `wire_bytes` (NaN when nothing went on the wire)."""
    return cpu_seconds / (wire_bytes / 1e9) if wire_bytes else float("nan")


def header_floor(mtu: int) -> float:
    """Wire bytes per TCP payload byte at `mtu`: Ethernet header (14) on top, IPv4 (20) and TCP with
    timestamps (32) inside; what HTB counts per full-size frame. 1500: 1.0456; 9000: 1.0074."""
    return (mtu + 14) / (mtu - 52)


def ring_bound_seconds(size: int, ranks: int, rate_bps: float) -> float:
    """The ring allreduce's line-rate bound: each rank sends 2(N-1)/N of the data through its port."""
    return 2 * (ranks - 1) / ranks * size * 8 / rate_bps
