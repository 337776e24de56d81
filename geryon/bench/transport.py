"""Transport benchmarks on an emulated cluster, each printing one JSON object per result line.

    geryon bench transport --bw 100mbit [--ps 1x1,8x8]
                                             PS push/pull and allreduce goodput vs iperf3 (ratio_vs_iperf3);
                                             an N x N colocated PS vs the sum of iperf3 --bidir over host pairs;
                                             with --tls the 1x1 PS and the ring also over TLS (ps-tls,
                                             allreduce-tls: ratio_vs_plain, the cost of TLS)
    geryon bench allreduce --workers 4,8 --repeat 3
                                             allreduce time vs torch.distributed gloo (ratio_vs_gloo), vs
                                             the ring's line-rate bound 2(N-1)/N * size / rate (ratio_vs_line_rate)
                                             and vs the wire's ceiling (ratio_vs_wire_ring): plain TCP streams
                                             of the same bytes round the same ring, no reduction; a collective
                                             near 1.0 there is limited by the emulated wire and TCP, not by itself
Every row also gives `cpu_s_per_gb`: CPU seconds (user + system, all processes of the system measured,
time.process_time) per GB its transfers put on the wire; allreduce rows give gloo's alongside, and
`machine_cpu_s_per_gb` (gloo's, the wire ring's): every CPU's busy seconds over rank 0's timed
collectives (/proc/stat), so the kernel's softirq work that no process is charged for counts too. On
the emulated cluster that includes the switch's forwarding and queues, and any other load on the
machine; compare systems in the same run. Allreduce rows also split the processes' figure:
`user_cpu_s_per_gb` (gloo's) is its user-space part (the interpreter, numpy, torch; the rest is the
kernel's sockets and TCP), and `context_switches_per_gb` (gloo's) counts the times a thread slept or
was preempted, per GB. Steal time (a virtual machine's vCPUs ready to run while the
hypervisor runs another guest) is not counted as busy; instead `steal_all_seconds` (gloo's, the wire
ring's) gives the CPU seconds stolen during each timed collective, in the order of `all_seconds`.
While a vCPU is stolen every emulated host, switch included, stands still, so a collective slowed by
steal was slowed by a neighbouring guest, not by the system measured. Each system runs its --repeat
collectives in one launch of its roles, geryon's first, then gloo's, then the wire ring's; a slow spell
of the machine as long as one such block (tens of seconds at 100 MB) then lands on one system only.
`--interleave` has the systems take turns, one timed collective per launch (each after its own
untimed warm-up), so such a spell is shared; rows say `interleave`.
Every row's `tcp_counters` (gloo's, the wire ring's) give per host what its TCP counters grew by over
the system's launches (segments out, retransmissions, RTOs, probes, undos, DSACKs) and where packets
were dropped: the host's egress queues, the switch port toward it, the two ends of its link, its IP
input, its sockets' backlog, receive and out-of-order queues; `softnet_drops` (gloo's, the wire ring's)
counts the machine's CPUs' input backlogs overflowing meanwhile (`geryon.bench.tcpstats`). A
retransmission with none of them was most likely spurious: the sender's undos and detected reorderings
(`full_undo`, `partial_undo`, `dsack_undo`, `loss_undo`, `sack_reorders`, `ts_reorders`) say so.
    geryon bench allreduce --device cuda     CUDA tensors (staged through pinned host memory) against the same
                                             data as CPU tensors and gloo with CUDA tensors, ranks as local
                                             processes over loopback; the share of copy time hidden
                                             (geryon.bench.loopback; `bench transport --device cuda`: 2 ranks)
    geryon bench priority --servers 2        high-priority burst under low-priority bulk, per policy
                                             (ratio_vs_unloaded)
Every baseline is measured in the same run, on the same emulated hosts. Needs root.

`bench transport` reports two baselines: iperf3 one way, and iperf3 --bidir (mean of the two
directions). PS push/pull and the 2-rank ring load both directions at once; with BBR each
direction's ACKs then queue behind the other's data and TCP itself loses 5-12% at 100 Mbit/s
(iperf3 --bidir: 84-92 of 95.5 Mbit/s), so `ratio_vs_iperf3_bidir` is the like-for-like ratio.
With `--congestion cubic` (iperf3 run with it too) the two baselines agree. The N x N PS runs
`--warmup` untimed iterations first (default 1, as `bench allreduce` runs an untimed collective per
size): the roles start seconds apart on shared cores, and the first iteration waits for the last.
Its `seconds` is the median iteration period of the job: from the last worker's end of one
iteration to the last worker's end of the next (`per_worker_max_seconds`: the slowest worker's own
duration per iteration, which also counts how much earlier that worker had finished the iteration
before; docs/transport-profile.md).

Fairness: geryon's flows and iperf3 use `--congestion` (else the hosts' default) on every socket, and
`bench allreduce` makes it every emulated host's default so that gloo uses it too (the kernel allows
that only for the host's tcp_allowed_congestion_control: reno and bbr here); each result names it as
`congestion`. iperf3 marks its packets with the
DSCP that the policy's transfers use (`baseline_dscp`), so both go through the same queue class;
`bench priority` fails when the bulk traffic it loads the worker with did not flow.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field

from geryon.bench import tcpstats
from geryon.bench.emulated import (BASE_PORT, gloo_placements, ring_placements, role_argv, run_roles,
                                   wire_ring_placements)
from geryon.emulate.cluster import add_ack_priority_argument
from geryon.emulate.fabric import DEFAULT_MTU
from geryon.errors import ConfigError, TransportError
from geryon.rates import parse_rate
from geryon.safefiles import create_exclusive
from geryon.transport.config import TransportConfig
from geryon.transport.policy import POLICIES


def _print(args, record: dict) -> None:
    if "bw" in record:
        record = {**record, "mtu": args.mtu, "ack_priority": args.ack_priority, "offload": args.offload}
    if args.json:
        print(json.dumps(record), flush=True)
    else:
        print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in record.items()), flush=True)


def _cluster(hosts: int, args, default_congestion: bool = False):
    """The bench's cluster; with `default_congestion`, --congestion is every host's default (for gloo,
    which cannot pick its sockets' congestion control)."""
    from geryon.emulate import EmulatedCluster
    return EmulatedCluster("b" + uuid.uuid4().hex[:5], hosts=hosts, bw=args.bw,
                           tcp_congestion=args.congestion if default_congestion else None, mtu=args.mtu,
                           ack_priority=args.ack_priority, offload=args.offload)


def _dscp_of(policy: str) -> int:
    """The DSCP of the flow that carries class 0 (every bench tensor's class) under `policy`."""
    config = TransportConfig(secret="bench", policy=policy)
    return config.flow_dscp(config.scheduling.flow_of(0))


def _max_slice_bytes(args) -> int:
    """--max-slice-bytes, at least --slice-bytes (a larger --slice-bytes alone means fixed pieces of it)."""
    return max(args.max_slice_bytes, args.slice_bytes)


def _common(args) -> list[str]:
    extra = ["--slice-bytes", args.slice_bytes, "--max-slice-bytes", _max_slice_bytes(args),
             "--timeout", 120, "--notsent-lowat", args.notsent_lowat,
             "--rto-min-us", args.rto_min_us, "--thread-rt-priority", args.thread_rt_priority]
    if args.congestion:
        extra += ["--congestion", args.congestion]
    if args.full_headers:
        extra.append("--full-headers")
    return extra


def _iperf3(cluster, seconds: int = 5, bidir: bool = False, congestion: str | None = None, dscp: int = 0) -> float:
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


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _iteration_seconds(records: list[list[dict]]) -> list[float]:
    """Per timed iteration, the slowest process's time (a collective ends when its last rank does)."""
    runs = [r[-1]["all_seconds"] for r in records if r and "all_seconds" in r[-1]]
    return [max(times) for times in zip(*runs)]


def _coflow_periods(records: list[list[dict]]) -> list[float]:
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


def _summed(records: list[list[dict]], key: str = "cpu_seconds") -> float:
    """A result-record field summed over every process: by default CPU seconds (user + system, every
    thread) of their measured part; with key=MACHINE, the machine's busy seconds over rank 0's timed
    collectives (transport_roles.machine_seconds); with USER, SWITCHES or FAULTS, the processes' user
    seconds, context switches or (PS servers) minor page faults."""
    return sum(record.get(key, 0.0) for r in records for record in r if record.get("event") == "result")


def _steal(records: list[list[dict]]) -> list[float] | None:
    """Rank 0's CPU seconds stolen by the hypervisor during each timed collective (None: not measured)."""
    stolen = [record["all_steal_seconds"] for r in records for record in r
              if record.get("event") == "result" and "all_steal_seconds" in record]
    return stolen[0] if stolen else None


def _per_gb(cpu_seconds: float, wire_bytes: float) -> float:
    return cpu_seconds / (wire_bytes / 1e9) if wire_bytes else float("nan")


def header_floor(mtu: int) -> float:
    """Wire bytes per TCP payload byte at `mtu`: Ethernet header (14) on top, IPv4 (20) and TCP with
    timestamps (32) inside; what HTB counts per full-size frame. 1500: 1.0456; 9000: 1.0074."""
    return (mtu + 14) / (mtu - 52)


def ring_bound_seconds(size: int, ranks: int, rate_bps: float) -> float:
    """The ring allreduce's line-rate bound: each rank sends 2(N-1)/N of the data through its port."""
    return 2 * (ranks - 1) / ranks * size * 8 / rate_bps


def _grids(text: str) -> list[tuple[int, int]]:
    grids = []
    for item in text.split(","):
        try:
            workers, servers = (int(x) for x in item.lower().split("x"))
        except ValueError:
            raise ConfigError(f"--ps {item!r}: give WORKERSxSERVERS, e.g. 8x8") from None
        if workers < 1 or servers < 1 or (workers > 1 and workers != servers):
            raise ConfigError(f"--ps {item!r}: 1x1, or N x N (worker and server i colocated on host i)")
        grids.append((workers, servers))
    return grids


def _iperf3_pairs(cluster, hosts: int, seconds: int, congestion: str | None, dscp: int) -> dict:
    """iperf3 --bidir between h1-h2, h3-h4, ... at once: every port busy both ways, as in colocated PS.

    Returns the sum over hosts of what each sent (bit/s) and the iperf3 processes' CPU seconds.
    """
    servers, clients = [], []
    extra = ["--bidir", "-S", str(dscp << 2)] + (["-C", congestion] if congestion else [])
    try:
        for pair in range(hosts // 2):
            a, b = f"h{2 * pair + 1}", f"h{2 * pair + 2}"
            servers.append(cluster.popen(b, ["iperf3", "-s", "-1", "-p", "5399"], stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL))
        time.sleep(0.5)
        for pair in range(hosts // 2):
            a, b = f"h{2 * pair + 1}", f"h{2 * pair + 2}"
            clients.append(cluster.popen(a, ["iperf3", "-c", cluster.host(b).ip, "-p", "5399", "-t", str(seconds),
                                             "-J", *extra], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         text=True))
        total, cpu = 0.0, 0.0
        for client in clients:
            out, _ = client.communicate(timeout=seconds + 30)
            end = json.loads(out)["end"]
            total += end["sum_received"]["bits_per_second"] + end["sum_received_bidir_reverse"]["bits_per_second"]
            usage = end.get("cpu_utilization_percent", {})
            cpu += (usage.get("host_total", 0.0) + usage.get("remote_total", 0.0)) / 100 * seconds
        return {"goodput_bps": total, "cpu_seconds": cpu, "wire_bytes": total / 8 * seconds}
    finally:
        for process in servers + clients:
            if process.poll() is None:
                process.kill()
            process.wait()


def _bench_ps_grid(args, workers: int, servers: int, size: int) -> None:
    """W workers and W servers, worker and server i on host i; goodput vs the iperf3 --bidir pair sum."""
    hosts = workers
    with _cluster(hosts, args) as cluster:
        congestion = args.congestion or cluster.congestion_control("h1")
        dscp = _dscp_of(args.policies.split(",")[0])
        baseline = _iperf3_pairs(cluster, hosts, 5, args.congestion, dscp)
        _print(args, {"bench": "transport", "system": "iperf3-bidir-sum", "hosts": hosts, "bw": args.bw,
                      "dscp": dscp, "congestion": congestion, "goodput_bps": baseline["goodput_bps"],
                      "cpu_s_per_gb": _per_gb(baseline["cpu_seconds"], baseline["wire_bytes"])})
        addresses = ",".join(f"{cluster.host(f'h{s + 1}').ip}:{BASE_PORT + s}" for s in range(servers))
        for policy in args.policies.split(","):
            placements = [(f"h{s + 1}", role_argv("ps-server", "--index", s, "--servers", servers, "--workers",
                                                  workers, "--listen", f"0.0.0.0:{BASE_PORT + s}", "--sizes", size,
                                                  "--policy", policy, *_common(args)))
                          for s in range(servers)]
            placements += [(f"h{w + 1}", role_argv("ps-worker", "--rank", w, "--workers", workers, "--servers",
                                                   addresses, "--sizes", size, "--iters", args.iters,
                                                   "--warmup", args.warmup, "--policy", policy, *_common(args)))
                           for w in range(workers)]
            host_names = [f"h{h + 1}" for h in range(hosts)]
            counted = tcpstats.counted(cluster, host_names, lambda: run_roles(cluster, placements))
            records, tcp = counted.result, counted.per_host
            periods = _coflow_periods(records[servers:])
            per_worker = _iteration_seconds(records[servers:])
            seconds = _median(periods)
            # every worker pushes (S-1)/S of the model to other hosts' servers and pulls as much back
            wire = 2 * workers * (servers - 1) / servers * size
            goodput = wire * 8 / seconds
            # workers time (and count CPU over) the timed iterations; servers serve the warm-up ones too
            server_cpu = _per_gb(_summed(records[:servers]), wire * (args.iters + args.warmup))
            _print(args, {"bench": "transport", "system": f"ps-{workers}x{servers}", "policy": policy,
                          "bw": args.bw, "size_bytes": size, "seconds": seconds, "all_seconds": periods,
                          "goodput_bps": goodput, "congestion": congestion, "baseline_dscp": dscp,
                          "warmup": args.warmup, "thread_rt_priority": args.thread_rt_priority,
                          "ratio_vs_iperf3_bidir_sum": goodput / baseline["goodput_bps"],
                          # the former measure: per iteration the slowest worker's own duration
                          "per_worker_max_seconds": per_worker,
                          "per_worker_max_ratio_vs_iperf3_bidir_sum":
                              wire * 8 / _median(per_worker) / baseline["goodput_bps"],
                          "cpu_s_per_gb": _per_gb(_summed(records[servers:]), wire * args.iters) + server_cpu,
                          "server_cpu_s_per_gb": server_cpu,
                          # first touches of fresh pages in the servers, per GB (warm-up included)
                          "server_minor_faults_per_gb": _per_gb(_summed(records[:servers], FAULTS),
                                                                wire * (args.iters + args.warmup)),
                          # per host, over the roles' whole run (warm-up included): RTOs, probes, undos
                          "timeouts_per_host": [tcp[h]["timeouts"] for h in host_names], "tcp_counters": tcp,
                          "softnet_drops": counted.softnet_drops})


def bench_transport(args) -> int:
    size = int(args.size_mb * 1e6)
    if args.device == "cuda" or args.loopback:   # local processes over loopback: the 2-rank ring
        from geryon.bench import loopback

        return loopback.run(args, workers=[2], sizes=[size], repeat=args.iters)
    grids = _grids(args.ps)
    if (1, 1) in grids:
        _bench_two_hosts(args, size)
    for workers, servers in grids:
        if (workers, servers) != (1, 1):
            _bench_ps_grid(args, workers, servers, size)
    return 0


def _versus_plain(plain: dict[str, float], system: str, goodput: float, tls) -> dict:
    """Records the plain run's goodput; a TLS run's record gets its ratio to it (the cost of TLS)."""
    if not tls:
        plain[system] = goodput
        return {}
    return {"ratio_vs_plain": goodput / plain[system]}


@contextlib.contextmanager
def _bench_credentials(wanted: bool):
    """With --tls: a fresh job key and certificate in a private file the roles read (None without)."""
    if not wanted:
        yield None
        return
    from geryon.transport.tls import generate_credentials

    with tempfile.TemporaryDirectory(prefix="geryon-bench-tls-") as directory:
        path = os.path.join(directory, "job.pem")
        create_exclusive(path, generate_credentials("bench").pem, mode=0o600)
        yield path


def _bench_two_hosts(args, size: int) -> None:
    """PS 1x1 and a 2-rank ring between two hosts, against iperf3 one way and --bidir (and with --tls,
    the same over TLS right after the plain runs)."""
    with _cluster(2, args) as cluster, _bench_credentials(getattr(args, "tls", False)) as credentials:
        congestion = args.congestion or cluster.congestion_control("h1")   # geryon's and iperf3's sockets
        baselines: dict[int, tuple[float, float]] = {}
        address = f"{cluster.host('h1').ip}:{BASE_PORT}"
        for policy in args.policies.split(","):
            dscp = _dscp_of(policy)
            if dscp not in baselines:
                baseline = _iperf3(cluster, congestion=args.congestion, dscp=dscp)
                _print(args, {"bench": "transport", "system": "iperf3", "bw": args.bw, "dscp": dscp,
                              "congestion": congestion, "goodput_bps": baseline})
                # PS push/pull and the 2-rank ring load both directions at once, and so does this baseline:
                # each direction's ACKs queue behind the other's data (BBR loses 5-12% at 100 Mbit/s)
                both_ways = _iperf3(cluster, bidir=True, congestion=args.congestion, dscp=dscp)
                _print(args, {"bench": "transport", "system": "iperf3-bidir", "bw": args.bw, "dscp": dscp,
                              "congestion": congestion, "goodput_bps": both_ways})
                baselines[dscp] = (baseline, both_ways)
            baseline, both_ways = baselines[dscp]
            plain: dict[str, float] = {}
            for tls in ([None, credentials] if credentials else [None]):
                extra = _common(args) + (["--tls-file", tls] if tls else [])
                suffix = "-tls" if tls else ""
                ps = run_roles(cluster, [
                    ("h1", role_argv("ps-server", "--index", 0, "--servers", 1, "--workers", 1, "--listen",
                                     f"0.0.0.0:{BASE_PORT}", "--sizes", size, "--policy", policy, *extra)),
                    ("h2", role_argv("ps-worker", "--rank", 0, "--workers", 1, "--servers", address, "--sizes",
                                     size, "--iters", args.iters, "--policy", policy, *extra))])

                def report(system: str, roles, seconds: float) -> None:
                    # PS: push and pull overlap, one per direction; 2-rank ring: each direction carries it all
                    goodput = size * 8 / seconds
                    _print(args, {"bench": "transport", "system": system + suffix, "policy": policy,
                                  "bw": args.bw, "size_bytes": size, "seconds": seconds, "goodput_bps": goodput,
                                  "congestion": congestion, "baseline_dscp": dscp,
                                  "ratio_vs_iperf3": goodput / baseline,
                                  "ratio_vs_iperf3_bidir": goodput / both_ways,
                                  "cpu_s_per_gb": _per_gb(_summed(roles), 2 * size * args.iters),
                                  **_versus_plain(plain, system, goodput, tls)})

                report("ps", ps, ps[1][-1]["seconds"])
                ring = run_roles(cluster, ring_placements(cluster, ["h1", "h2"], 2, "--sizes", size, "--iters",
                                                          args.iters, "--policy", policy, *extra))
                report("allreduce", ring, _median(_iteration_seconds(ring)))


def _workers(text: str) -> list[int]:
    try:
        counts = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--workers {text!r}: give rank counts, e.g. 4,8") from None
    if not counts or min(counts) < 2:
        raise ConfigError(f"--workers {text!r}: every ring needs at least 2 ranks")
    return counts


@dataclass
class _Measured:
    """One system's timed collectives in a row, gathered over one or more launches of its roles."""
    records: list[list[dict]] = field(default_factory=list)   # per role and launch, its output records
    times: list[float] = field(default_factory=list)          # per collective, the slowest rank's seconds
    tcp: dict[str, dict[str, int]] = field(default_factory=dict)   # per host, counters summed over launches
    steal: list[float] | None = None                         # per collective, rank 0's steal (seconds)
    softnet_drops: int = 0                                   # machine-wide, summed over launches

    def add(self, launch: tcpstats.Counted) -> None:
        """One launch of the system's roles: `launch.result` is their records."""
        records = launch.result
        self.records += records
        self.times += _iteration_seconds(records)
        self.softnet_drops += launch.softnet_drops
        for host, counters in launch.per_host.items():
            mine = self.tcp.setdefault(host, dict.fromkeys(counters, 0))
            for name, value in counters.items():
                mine[name] += value
        stolen = _steal(records)
        if stolen is not None:
            self.steal = (self.steal or []) + stolen


def bench_allreduce(args) -> int:
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    if args.device == "cuda" or args.loopback:   # local processes over loopback
        from geryon.bench import loopback

        return loopback.run(args, workers=_workers(args.workers), sizes=sizes, repeat=args.repeat)
    rate = parse_rate(args.bw)
    # --interleave: each system's roles run one timed collective per launch, the systems taking turns
    launches = [1] * args.repeat if args.interleave else [args.repeat]
    for workers in _workers(args.workers):
        hosts = [f"h{i + 1}" for i in range(workers)]
        with _cluster(workers, args, default_congestion=True) as cluster:
            congestion = cluster.congestion_control(hosts[0])   # gloo's and geryon's flows alike
            gloo_env = {"GLOO_SOCKET_IFNAME": "eth0"}

            for size in sizes:
                systems = {
                    "geryon": (lambda iters: ring_placements(cluster, hosts, workers, "--sizes", size, "--iters",
                                                             iters, "--policy", args.policy, *_common(args)), None),
                    "gloo": (lambda iters: gloo_placements(cluster, hosts, workers, "--sizes", size, "--iters",
                                                           iters), gloo_env)}
                if args.wire_ring:
                    systems["wire"] = (lambda iters: wire_ring_placements(cluster, hosts, workers, "--sizes", size,
                                                                          "--iters", iters), gloo_env)
                measured = {name: _Measured() for name in systems}
                for iters in launches:
                    for name, (placements, env) in systems.items():
                        measured[name].add(tcpstats.counted(
                            cluster, hosts, lambda: run_roles(cluster, placements(iters), env=env)))
                mine, gloo = measured["geryon"], measured["gloo"]
                ours, theirs = _median(mine.times), _median(gloo.times)
                bound = ring_bound_seconds(size, workers, rate)
                wire = 2 * (workers - 1) * size * args.repeat     # every rank sends 2(N-1)/N of the data
                ceiling = {}
                if args.wire_ring:
                    plain_ring = measured["wire"]
                    plain = _median(plain_ring.times)
                    ceiling = {"wire_ring_seconds": plain, "wire_ring_all_seconds": plain_ring.times,
                               "wire_ring_tcp_counters": plain_ring.tcp,
                               "wire_ring_softnet_drops": plain_ring.softnet_drops, "ratio_vs_wire_ring": ours / plain,
                               "gloo_ratio_vs_wire_ring": theirs / plain, "wire_ring_ratio_vs_line_rate": plain / bound,
                               "wire_ring_machine_cpu_s_per_gb": _per_gb(_summed(plain_ring.records, MACHINE),
                                                                         wire),
                               "wire_ring_steal_all_seconds": plain_ring.steal}
                _print(args, {"bench": "allreduce", "workers": workers, "bw": args.bw, "size_bytes": size,
                              "policy": args.policy, "congestion": congestion, "repeat": args.repeat,
                              "interleave": args.interleave,
                              "seconds": ours, "gloo_seconds": theirs, "line_rate_seconds": bound,
                              "all_seconds": mine.times, "gloo_all_seconds": gloo.times,
                              # per host, over each system's launches (their warm-ups and set-up too)
                              "tcp_counters": mine.tcp, "gloo_tcp_counters": gloo.tcp,
                              "softnet_drops": mine.softnet_drops, "gloo_softnet_drops": gloo.softnet_drops,
                              "ratio_vs_gloo": ours / theirs, "ratio_vs_line_rate": ours / bound,
                              "gloo_ratio_vs_line_rate": theirs / bound,
                              "header_floor_vs_line_rate": header_floor(args.mtu),
                              "slice_bytes": args.slice_bytes,
                              "max_slice_bytes": _max_slice_bytes(args),
                              "compact_headers": not args.full_headers,
                              "cpu_s_per_gb": _per_gb(_summed(mine.records), wire),
                              "gloo_cpu_s_per_gb": _per_gb(_summed(gloo.records), wire),
                              "user_cpu_s_per_gb": _per_gb(_summed(mine.records, USER), wire),
                              "gloo_user_cpu_s_per_gb": _per_gb(_summed(gloo.records, USER), wire),
                              "context_switches_per_gb": _per_gb(_summed(mine.records, SWITCHES), wire),
                              "gloo_context_switches_per_gb": _per_gb(_summed(gloo.records, SWITCHES), wire),
                              "machine_cpu_s_per_gb": _per_gb(_summed(mine.records, MACHINE), wire),
                              "gloo_machine_cpu_s_per_gb": _per_gb(_summed(gloo.records, MACHINE), wire),
                              "steal_all_seconds": mine.steal, "gloo_steal_all_seconds": gloo.steal, **ceiling})
    return 0


def bench_priority(args) -> int:
    servers = args.servers
    worker_host = f"h{servers + 1}"
    with _cluster(servers + 1, args) as cluster:
        addresses = ",".join(f"{cluster.host(f'h{s + 1}').ip}:{BASE_PORT + s}" for s in range(servers))
        for policy in args.policies.split(","):
            seconds = {}
            for loaded in (False, True):
                common = ["--policy", policy, "--burst-bytes", args.burst_bytes, *_common(args)]
                placements = [(f"h{s + 1}", role_argv("prio-server", "--index", s, "--servers", servers,
                                                      "--listen", f"0.0.0.0:{BASE_PORT + s}",
                                                      "--backlog-bytes", args.backlog_bytes, *common))
                              for s in range(servers)]
                placements.append((worker_host, role_argv("prio-worker", "--servers", addresses, "--repeat",
                                                          args.repeat, *(["--bulk"] if loaded else []),
                                                          *common)))
                records = run_roles(cluster, placements)
                seconds[loaded] = records[-1][-1]["seconds"]
                if loaded:
                    bulk_seen = records[-1][-1]["bulk_bytes_seen"]
                    if bulk_seen <= 0:
                        raise TransportError(f"bench priority ({policy}): the worker received no bulk bytes, so "
                                             "the loaded run measured nothing; check the servers' output")
            _print(args, {"bench": "priority", "policy": policy, "servers": servers, "bw": args.bw,
                          "burst_bytes": args.burst_bytes, "unloaded_seconds": seconds[False],
                          "loaded_seconds": seconds[True], "bulk_bytes_seen": bulk_seen,
                          "ratio_vs_unloaded": seconds[True] / seconds[False]})
    return 0


def _shared(parser) -> None:
    parser.add_argument("--bw", default="100mbit", help="link rate of every emulated port")
    parser.add_argument("--json", action="store_true", help="one JSON object per result line")
    parser.add_argument("--mtu", type=int, default=DEFAULT_MTU,
                        help=f"MTU of every emulated link, for every system alike (default {DEFAULT_MTU}; "
                        "9000: jumbo frames)")
    add_ack_priority_argument(parser, "for every system alike")
    parser.add_argument("--no-offload", dest="offload", action="store_false",
                        help="MTU-sized packets through every queue (no 64 KB GSO super-packets), for every "
                        "system alike; costs CPU: at 8 ranks x 100 Mbit/s it makes every system CPU-bound "
                        "(docs/transport-profile.md, tenth session)")
    parser.add_argument("--slice-bytes", type=int, default=TransportConfig.slice_bytes)
    parser.add_argument("--max-slice-bytes", type=int, default=TransportConfig.max_slice_bytes,
                        help="allreduce: largest piece where the link proved fast (TransportConfig."
                        "max_slice_bytes; = --slice-bytes: every piece of --slice-bytes)")
    parser.add_argument("--congestion", default=None, help="TCP congestion control, e.g. cubic or bbr")
    parser.add_argument("--notsent-lowat", type=int, default=TransportConfig.notsent_lowat,
                        help="TCP_NOTSENT_LOWAT in bytes (0: kernel default)")
    parser.add_argument("--rto-min-us", type=int, default=TransportConfig.rto_min_us,
                        help="TCP_RTO_MIN_US on geryon's sockets (0: the kernel's 200 ms)")
    parser.add_argument("--thread-rt-priority", type=int, default=0,
                        help="SCHED_RR priority of geryon's flow threads (TransportConfig.thread_rt_priority; "
                        "0: normal scheduling, the default)")
    parser.add_argument("--full-headers", action="store_true",
                        help="geryon's frames all with the 44-byte header, none with the 8-byte continuation "
                        "(TransportConfig.compact_headers off; for A/B runs)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="tensors on the CPU (default) or on CUDA GPUs; cuda runs the ranks as local "
                        "processes over loopback, beside the same data as CPU tensors and gloo with CUDA "
                        "tensors (geryon.bench.loopback)")
    parser.add_argument("--loopback", action="store_true",
                        help="local processes over loopback instead of the emulated cluster (no root needed)")


def add_benches(bench) -> None:
    parser = bench.add_parser("transport", help="PS and allreduce goodput against iperf3")
    _shared(parser)
    parser.add_argument("--size-mb", type=float, default=25.0)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1,
                        help="NxN PS: untimed iterations before the timed ones (the roles' start-up skew), "
                        "as bench allreduce runs one untimed collective per size")
    parser.add_argument("--policies", default="geryon")
    parser.add_argument("--tls", action="store_true",
                        help="also run the 1x1 PS and the ring over TLS (rows ps-tls, allreduce-tls: ratio_vs_plain)")
    parser.add_argument("--ps", default="1x1", help="PS grids WxS, comma-separated: 1x1 (server on h1, worker "
                        "on h2, plus a 2-rank ring) and NxN (worker and server i colocated on host i), e.g. 1x1,8x8")
    parser.set_defaults(func=bench_transport)

    parser = bench.add_parser("allreduce", help="allreduce time against torch.distributed gloo")
    _shared(parser)
    parser.add_argument("--workers", default="3", help="ring sizes, comma-separated, e.g. 4,8")
    parser.add_argument("--sizes", default="1e3,1e4,1e5,1e6,1e7,1e8")
    parser.add_argument("--repeat", "--iters", dest="repeat", type=int, default=3,
                        help="timed allreduces per size and system; rows give the median")
    parser.add_argument("--policy", default="geryon", choices=sorted(POLICIES))
    parser.add_argument("--no-wire-ring", dest="wire_ring", action="store_false",
                        help="skip the wire's ceiling: plain TCP streams of the bytes each ring link carries, "
                        "timed like the collectives (wire_ring_seconds, ratio_vs_wire_ring)")
    parser.add_argument("--interleave", action="store_true",
                        help="the systems take turns: each launch of a system's roles times one collective "
                        "(after its untimed warm-up), geryon, gloo and the wire ring in turn, --repeat rounds; "
                        "a slow spell of the machine then falls on every system, not on one system's block. "
                        "Costs a launch and a warm-up per collective")
    parser.set_defaults(func=bench_allreduce)

    parser = bench.add_parser("priority", help="high-priority burst under bulk from S servers")
    _shared(parser)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--burst-bytes", type=int, default=1 << 20)
    parser.add_argument("--backlog-bytes", type=int, default=8 << 20,
                        help="low-priority bytes each server keeps queued while bursts are timed")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--policies", default="vanilla,slicing,endhost,geryon")
    parser.set_defaults(func=bench_priority)
