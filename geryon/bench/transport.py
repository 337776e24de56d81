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
before; docs/transport.md).

Fairness: geryon's flows and iperf3 use `--congestion` (else the hosts' default) on every socket, and
`bench allreduce` makes it every emulated host's default so that gloo uses it too (the kernel allows
that only for the host's tcp_allowed_congestion_control: reno and bbr here); each result names it as
`congestion`. iperf3 marks its packets with the
DSCP that the policy's transfers use (`baseline_dscp`), so both go through the same queue class;
`bench priority` fails when the bulk traffic it loads the worker with did not flow.
"""

from __future__ import annotations

from geryon.bench.emulated import BASE_PORT, role_argv, run_roles
from geryon.bench.transport_allreduce import bench_allreduce
from geryon.bench.transport_measure import IPERF3_SECONDS, bench_cluster, print_row, role_flags
from geryon.bench.transport_ps import bench_transport
from geryon.emulate.cluster import add_ack_priority_argument
from geryon.emulate.fabric import DEFAULT_MTU
from geryon.errors import TransportError
from geryon.transport.config import TransportConfig
from geryon.transport.policy import POLICIES


def bench_priority(args) -> int:
    servers = args.servers
    worker_host = f"h{servers + 1}"
    with bench_cluster(servers + 1, args) as cluster:
        addresses = ",".join(f"{cluster.host(f'h{s + 1}').ip}:{BASE_PORT + s}" for s in range(servers))
        for policy in args.policies.split(","):
            seconds = {}
            for loaded in (False, True):
                common = ["--policy", policy, "--burst-bytes", args.burst_bytes, *role_flags(args)]
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
            print_row(args, {"bench": "priority", "policy": policy, "servers": servers, "bw": args.bw,
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
                        "(docs/transport.md)")
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
    parser.add_argument("--iperf-seconds", type=int, default=IPERF3_SECONDS, metavar="S",
                        help=f"how long each iperf3 baseline runs (default {IPERF3_SECONDS})")
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
