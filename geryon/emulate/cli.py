"""`geryon emulate ...`: bring emulated clusters up, run commands in their hosts, list and remove them.

    geryon emulate up --name demo --hosts 3 --bw 100mbit [--classes high:46,low:0] [--no-priority]
                      [--topology star|leafspine] [--no-offload] [--mtu 9000] [--ack-priority off|top|own]
                      [--sshd]   # prints the cluster as JSON; it stays up; --sshd: sshd everywhere
                                 # plus an inventory for `geryon cluster`
    geryon emulate exec demo h1 -- iperf3 -c 10.199.0.2  # exit code passes through
    geryon emulate down demo
    geryon emulate list [--json]
    geryon emulate clean [--name demo]                 # everything named gy*, or one cluster
"""

import argparse
import importlib
import json
import subprocess
import sys

from geryon.emulate import fabric, state
from geryon.emulate.clean import clean, cluster_of
from geryon.emulate.cluster import EmulatedCluster, add_ack_priority_argument, exec_argv
from geryon.emulate.topology import MAX_HOSTS, MIN_HOSTS, TOPOLOGIES, check_name, netns_prefix
from geryon.errors import ConfigError, require_root


def add_commands(commands, bench) -> None:
    """Register `geryon emulate` and its sub-commands."""
    emulate = commands.add_parser("emulate", help="emulated cluster in network namespaces",
                                  description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    emulate.set_defaults(func=lambda args: _usage(emulate))
    sub = emulate.add_subparsers(dest="emulate_command", metavar="ACTION")

    up = sub.add_parser("up", help="build a cluster and print it as JSON (it stays up)")
    up.add_argument("--name", required=True, help="cluster name, 1-6 lowercase letters/digits")
    up.add_argument("--hosts", type=int, default=3, help=f"number of hosts ({MIN_HOSTS}-{MAX_HOSTS}, default 3)")
    up.add_argument("--bw", default="100mbit", help="rate of every link, e.g. 100mbit, 1gbit (default 100mbit)")
    up.add_argument("--classes", default=None, help="priority classes, e.g. high:46,low:0 or a count (default 2)")
    up.add_argument("--no-priority", action="store_true", help="shape only, no priority queues")
    up.add_argument("--topology", choices=TOPOLOGIES, default="star", help="star (default) or leafspine")
    up.add_argument("--uplink-fraction", type=float, default=None,
                    help="leafspine: uplink rate as a fraction of --bw (default: 2:1 oversubscribed)")
    up.add_argument("--tcp-congestion", default=None,
                    help="every host's default TCP congestion control (bbr, cubic, ...)")
    up.add_argument("--no-offload", action="store_true",
                    help="turn segmentation offload off (MTU-sized packets in every queue; costs CPU)")
    up.add_argument("--mtu", type=int, default=fabric.DEFAULT_MTU,
                    help=f"MTU of every link (default {fabric.DEFAULT_MTU}; 9000: jumbo frames)")
    add_ack_priority_argument(up, "host and switch ports")
    up.add_argument("--sshd", action="store_true",
                    help="start a real sshd in every host and switch and write an inventory for `geryon cluster`")
    up.set_defaults(func=cmd_up)

    run = sub.add_parser("exec", help="run a command inside a host's namespace")
    run.add_argument("name", help="cluster name")
    run.add_argument("host", help="host name, e.g. h1")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD...", help="the command")
    run.set_defaults(func=cmd_exec)

    down = sub.add_parser("down", help="remove one cluster")
    down.add_argument("name", help="cluster name")
    down.set_defaults(func=cmd_down)

    listing = sub.add_parser("list", help="list clusters that are up")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(func=cmd_list)

    cleaning = sub.add_parser("clean", help="remove everything geryon made (namespaces gy*), also after a crash")
    cleaning.add_argument("--name", default=None, help="only this cluster")
    cleaning.set_defaults(func=cmd_clean)

    _add_check(sub)


def _add_check(sub) -> None:
    """`geryon emulate check` lives in geryon.emulate.check, written separately; absent is fine."""
    try:
        check = importlib.import_module("geryon.emulate.check")
    except ModuleNotFoundError as exc:
        if exc.name == "geryon.emulate.check":
            return
        raise
    check.add_command(sub)


def _usage(parser) -> int:
    parser.print_help(sys.stderr)
    return 2


def cmd_up(args) -> int:
    cluster = EmulatedCluster(args.name, hosts=args.hosts, bw=args.bw, classes=args.classes,
                              priority=not args.no_priority, topology=args.topology,
                              tcp_congestion=args.tcp_congestion, uplink_fraction=args.uplink_fraction,
                              offload=not args.no_offload, mtu=args.mtu,
                              ack_priority=args.ack_priority)
    try:   # the cluster stays up only when the whole command succeeded (not on Ctrl-C while building)
        cluster.up()
        description = cluster.describe()
        if getattr(args, "sshd", False):
            from geryon.emulate.sshd import start_cluster_sshd
            description["inventory"] = str(start_cluster_sshd(cluster))
    except BaseException:
        cluster.down()
        raise
    print(json.dumps(description, indent=2))
    return 0


def cmd_exec(args) -> int:
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise ConfigError("no command: use `geryon emulate exec NAME HOST -- CMD...`")
    require_root("running a command in an emulated host (network namespaces)")
    cluster = EmulatedCluster.from_record(check_name(args.name))
    host = cluster.host(args.host)
    try:
        return subprocess.call(exec_argv(host.netns, argv))
    except KeyboardInterrupt:
        return 130


def cmd_down(args) -> int:
    check_name(args.name)
    require_root("removing an emulated cluster (network namespaces and tc)")
    if not state.record_exists(args.name) and not fabric.list_netns(netns_prefix(args.name)):
        raise ConfigError(f"no emulated cluster named {args.name!r} is up; see `geryon emulate list`")
    report = clean(name=args.name)
    import shutil
    from geryon.emulate.sshd import access_dir
    shutil.rmtree(access_dir(args.name), ignore_errors=True)  # keys and inventory of `up --sshd`
    print(f"removed {args.name}: {len(report.namespaces)} namespaces")
    return 0


def list_clusters() -> list[dict]:
    """Clusters with a record or with namespaces, and whether each looks healthy."""
    by_name: dict[str, dict] = {}
    for name in state.list_records():
        try:
            record = state.read_record(name)
        except Exception as exc:  # a broken record is still worth showing
            record = {"state": f"unreadable: {exc}"}
        by_name[name] = {"name": name, "hosts": len(record.get("hosts", [])),
                         "rate": record.get("rate_text"), "topology": record.get("topology"),
                         "priority": record.get("priority"), "state": record.get("state"), "namespaces": 0}
    for netns_name in fabric.list_netns("gy"):
        cluster = cluster_of(netns_name)
        if cluster is None:
            continue
        entry = by_name.setdefault(cluster, {"name": cluster, "state": "no record (run clean)", "namespaces": 0})
        entry["namespaces"] += 1
    for entry in by_name.values():
        if entry["state"] == "up" and entry["namespaces"] == 0:
            entry["state"] = "stale record (run clean)"
    return [by_name[k] for k in sorted(by_name)]


def cmd_list(args) -> int:
    clusters = list_clusters()
    if args.json:
        print(json.dumps(clusters, indent=2))
        return 0
    if not clusters:
        print("no emulated clusters")
        return 0
    print(f"{'NAME':8} {'HOSTS':>5} {'RATE':>8} {'TOPOLOGY':10} {'QUEUES':9} STATE")
    for c in clusters:
        queues = {True: "priority", False: "shaping"}.get(c.get("priority"), "-")
        print(f"{c['name']:8} {c.get('hosts') or c['namespaces']:>5} {c.get('rate') or '-':>8} "
              f"{c.get('topology') or '-':10} {queues:9} {c['state']}")
    return 0


def cmd_clean(args) -> int:
    report = clean(name=args.name)
    print(json.dumps(report.as_dict()))
    return 0
