"""`geryon bench allreduce`: geryon's ring allreduce against torch.distributed gloo, the ring's line-rate
bound and the wire's ceiling, on one emulated cluster (see geryon.bench.transport for the rows' meaning).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from geryon.bench import tcpstats
from geryon.bench.emulated import gloo_placements, ring_placements, run_roles, wire_ring_placements
from geryon.bench.transport_measure import (MACHINE, SWITCHES, USER, bench_cluster, header_floor, iteration_seconds,
                                            max_slice_bytes, median, per_gb, print_row, ring_bound_seconds,
                                            role_flags, steal_seconds, summed)
from geryon.errors import ConfigError
from geryon.rates import parse_rate


def parse_workers(text: str) -> list[int]:
    """--workers: ring sizes, comma-separated, each at least 2."""
    try:
        counts = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--workers {text!r}: give rank counts, e.g. 4,8") from None
    if not counts or min(counts) < 2:
        raise ConfigError(f"--workers {text!r}: every ring needs at least 2 ranks")
    return counts


@dataclass
class Measured:
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
        self.times += iteration_seconds(records)
        self.softnet_drops += launch.softnet_drops
        for host, counters in launch.per_host.items():
            mine = self.tcp.setdefault(host, dict.fromkeys(counters, 0))
            for name, value in counters.items():
                mine[name] += value
        stolen = steal_seconds(records)
        if stolen is not None:
            self.steal = (self.steal or []) + stolen


def bench_allreduce(args) -> int:
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    if args.device == "cuda" or args.loopback:   # local processes over loopback
        from geryon.bench import loopback

        return loopback.run(args, workers=parse_workers(args.workers), sizes=sizes, repeat=args.repeat)
    rate = parse_rate(args.bw)
    # --interleave: each system's roles run one timed collective per launch, the systems taking turns
    launches = [1] * args.repeat if args.interleave else [args.repeat]
    for workers in parse_workers(args.workers):
        hosts = [f"h{i + 1}" for i in range(workers)]
        with bench_cluster(workers, args, default_congestion=True) as cluster:
            congestion = cluster.congestion_control(hosts[0])   # gloo's and geryon's flows alike
            gloo_env = {"GLOO_SOCKET_IFNAME": "eth0"}

            for size in sizes:
                systems = {
                    "geryon": (lambda iters: ring_placements(cluster, hosts, workers, "--sizes", size, "--iters",
                                                             iters, "--policy", args.policy, *role_flags(args)), None),
                    "gloo": (lambda iters: gloo_placements(cluster, hosts, workers, "--sizes", size, "--iters",
                                                           iters), gloo_env)}
                if args.wire_ring:
                    systems["wire"] = (lambda iters: wire_ring_placements(cluster, hosts, workers, "--sizes", size,
                                                                          "--iters", iters), gloo_env)
                measured = {name: Measured() for name in systems}
                for iters in launches:
                    for name, (placements, env) in systems.items():
                        measured[name].add(tcpstats.counted(
                            cluster, hosts, lambda: run_roles(cluster, placements(iters), env=env)))
                mine, gloo = measured["geryon"], measured["gloo"]
                ours, theirs = median(mine.times), median(gloo.times)
                bound = ring_bound_seconds(size, workers, rate)
                wire = 2 * (workers - 1) * size * args.repeat     # every rank sends 2(N-1)/N of the data
                ceiling = {}
                if args.wire_ring:
                    plain_ring = measured["wire"]
                    plain = median(plain_ring.times)
                    ceiling = {"wire_ring_seconds": plain, "wire_ring_all_seconds": plain_ring.times,
                               "wire_ring_tcp_counters": plain_ring.tcp,
                               "wire_ring_softnet_drops": plain_ring.softnet_drops, "ratio_vs_wire_ring": ours / plain,
                               "gloo_ratio_vs_wire_ring": theirs / plain, "wire_ring_ratio_vs_line_rate": plain / bound,
                               "wire_ring_machine_cpu_s_per_gb": per_gb(summed(plain_ring.records, MACHINE),
                                                                         wire),
                               "wire_ring_steal_all_seconds": plain_ring.steal}
                print_row(args, {"bench": "allreduce", "workers": workers, "bw": args.bw, "size_bytes": size,
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
                              "max_slice_bytes": max_slice_bytes(args),
                              "compact_headers": not args.full_headers,
                              "cpu_s_per_gb": per_gb(summed(mine.records), wire),
                              "gloo_cpu_s_per_gb": per_gb(summed(gloo.records), wire),
                              "user_cpu_s_per_gb": per_gb(summed(mine.records, USER), wire),
                              "gloo_user_cpu_s_per_gb": per_gb(summed(gloo.records, USER), wire),
                              "context_switches_per_gb": per_gb(summed(mine.records, SWITCHES), wire),
                              "gloo_context_switches_per_gb": per_gb(summed(gloo.records, SWITCHES), wire),
                              "machine_cpu_s_per_gb": per_gb(summed(mine.records, MACHINE), wire),
                              "gloo_machine_cpu_s_per_gb": per_gb(summed(gloo.records, MACHINE), wire),
                              "steal_all_seconds": mine.steal, "gloo_steal_all_seconds": gloo.steal, **ceiling})
    return 0
