"""`geryon bench transport`: PS push/pull and a 2-rank ring against iperf3, and N x N colocated PS grids
against the sum of iperf3 --bidir over host pairs (see geryon.bench.transport for the rows' meaning).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import time

from geryon.bench import tcpstats
from geryon.bench.emulated import BASE_PORT, ring_placements, role_argv, run_roles
from geryon.bench.transport_measure import (FAULTS, bench_cluster, class0_dscp, coflow_periods, iperf3_goodput,
                                            iteration_seconds, median, per_gb, print_row, role_flags, summed)
from geryon.errors import ConfigError
from geryon.safefiles import create_exclusive


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
    with bench_cluster(hosts, args) as cluster:
        congestion = args.congestion or cluster.congestion_control("h1")
        dscp = class0_dscp(args.policies.split(",")[0])
        baseline = _iperf3_pairs(cluster, hosts, args.iperf_seconds, args.congestion, dscp)
        print_row(args, {"bench": "transport", "system": "iperf3-bidir-sum", "hosts": hosts, "bw": args.bw,
                      "dscp": dscp, "congestion": congestion, "goodput_bps": baseline["goodput_bps"],
                      "cpu_s_per_gb": per_gb(baseline["cpu_seconds"], baseline["wire_bytes"])})
        addresses = ",".join(f"{cluster.host(f'h{s + 1}').ip}:{BASE_PORT + s}" for s in range(servers))
        for policy in args.policies.split(","):
            placements = [(f"h{s + 1}", role_argv("ps-server", "--index", s, "--servers", servers, "--workers",
                                                  workers, "--listen", f"0.0.0.0:{BASE_PORT + s}", "--sizes", size,
                                                  "--policy", policy, *role_flags(args)))
                          for s in range(servers)]
            placements += [(f"h{w + 1}", role_argv("ps-worker", "--rank", w, "--workers", workers, "--servers",
                                                   addresses, "--sizes", size, "--iters", args.iters,
                                                   "--warmup", args.warmup, "--policy", policy, *role_flags(args)))
                           for w in range(workers)]
            host_names = [f"h{h + 1}" for h in range(hosts)]
            counted = tcpstats.counted(cluster, host_names, lambda: run_roles(cluster, placements))
            records, tcp = counted.result, counted.per_host
            periods = coflow_periods(records[servers:])
            per_worker = iteration_seconds(records[servers:])
            seconds = median(periods)
            # every worker pushes (S-1)/S of the model to other hosts' servers and pulls as much back
            wire = 2 * workers * (servers - 1) / servers * size
            goodput = wire * 8 / seconds
            # workers time (and count CPU over) the timed iterations; servers serve the warm-up ones too
            server_cpu = per_gb(summed(records[:servers]), wire * (args.iters + args.warmup))
            print_row(args, {"bench": "transport", "system": f"ps-{workers}x{servers}", "policy": policy,
                          "bw": args.bw, "size_bytes": size, "seconds": seconds, "all_seconds": periods,
                          "goodput_bps": goodput, "congestion": congestion, "baseline_dscp": dscp,
                          "warmup": args.warmup, "thread_rt_priority": args.thread_rt_priority,
                          "ratio_vs_iperf3_bidir_sum": goodput / baseline["goodput_bps"],
                          # per iteration the slowest worker's own duration (it carries the skew of the
                          # iteration before, which the period does not; see coflow_periods)
                          "per_worker_max_seconds": per_worker,
                          "per_worker_max_ratio_vs_iperf3_bidir_sum":
                              wire * 8 / median(per_worker) / baseline["goodput_bps"],
                          "cpu_s_per_gb": per_gb(summed(records[servers:]), wire * args.iters) + server_cpu,
                          "server_cpu_s_per_gb": server_cpu,
                          # first touches of fresh pages in the servers, per GB (warm-up included)
                          "server_minor_faults_per_gb": per_gb(summed(records[:servers], FAULTS),
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
    with bench_cluster(2, args) as cluster, _bench_credentials(getattr(args, "tls", False)) as credentials:
        congestion = args.congestion or cluster.congestion_control("h1")   # geryon's and iperf3's sockets
        baselines: dict[int, tuple[float, float]] = {}
        address = f"{cluster.host('h1').ip}:{BASE_PORT}"
        for policy in args.policies.split(","):
            dscp = class0_dscp(policy)
            if dscp not in baselines:
                baseline = iperf3_goodput(cluster, args.iperf_seconds, congestion=args.congestion, dscp=dscp)
                print_row(args, {"bench": "transport", "system": "iperf3", "bw": args.bw, "dscp": dscp,
                              "congestion": congestion, "goodput_bps": baseline})
                # PS push/pull and the 2-rank ring load both directions at once, and so does this baseline:
                # each direction's ACKs queue behind the other's data (BBR loses 5-12% at 100 Mbit/s)
                both_ways = iperf3_goodput(cluster, args.iperf_seconds, bidir=True, congestion=args.congestion,
                                           dscp=dscp)
                print_row(args, {"bench": "transport", "system": "iperf3-bidir", "bw": args.bw, "dscp": dscp,
                              "congestion": congestion, "goodput_bps": both_ways})
                baselines[dscp] = (baseline, both_ways)
            baseline, both_ways = baselines[dscp]
            plain: dict[str, float] = {}
            for tls in ([None, credentials] if credentials else [None]):
                extra = role_flags(args) + (["--tls-file", tls] if tls else [])
                suffix = "-tls" if tls else ""
                ps = run_roles(cluster, [
                    ("h1", role_argv("ps-server", "--index", 0, "--servers", 1, "--workers", 1, "--listen",
                                     f"0.0.0.0:{BASE_PORT}", "--sizes", size, "--policy", policy, *extra)),
                    ("h2", role_argv("ps-worker", "--rank", 0, "--workers", 1, "--servers", address, "--sizes",
                                     size, "--iters", args.iters, "--policy", policy, *extra))])

                def report(system: str, roles, seconds: float) -> None:
                    # PS: push and pull overlap, one per direction; 2-rank ring: each direction carries it all
                    goodput = size * 8 / seconds
                    print_row(args, {"bench": "transport", "system": system + suffix, "policy": policy,
                                  "bw": args.bw, "size_bytes": size, "seconds": seconds, "goodput_bps": goodput,
                                  "congestion": congestion, "baseline_dscp": dscp,
                                  "ratio_vs_iperf3": goodput / baseline,
                                  "ratio_vs_iperf3_bidir": goodput / both_ways,
                                  "cpu_s_per_gb": per_gb(summed(roles), 2 * size * args.iters),
                                  **_versus_plain(plain, system, goodput, tls)})

                report("ps", ps, ps[1][-1]["seconds"])
                ring = run_roles(cluster, ring_placements(cluster, ["h1", "h2"], 2, "--sizes", size, "--iters",
                                                          args.iters, "--policy", policy, *extra))
                report("allreduce", ring, median(iteration_seconds(ring)))
