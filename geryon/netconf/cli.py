"""`geryon netconf ...`: show, apply and remove priority queues, read their counters, sniff DSCP marks.

  geryon netconf show --dev eth0 --rate 1gbit --classes high:46,low:0   # dry run: print the tc lines
  geryon netconf apply --dev eth0 --netns gyrun-sw [--rate 100mbit] [--classes 4] [--shaping-only]
  geryon netconf remove --dev eth0 --netns gyrun-sw
  geryon netconf stats --dev eth0 --netns gyrun-sw [--json]
  geryon netconf verify --netns gyrun-h2 --iface eth0 --duration 5 [--filter "tcp port 5201"] [--json]
  geryon netconf capabilities [--json]
  geryon netconf render --profile two-class --target sonic --ports Ethernet0 [--format yang]
  geryon netconf apply --profile two-class --target linux@10.0.0.5 [--dry-run]   # see qos_cli.py
"""

import json

from geryon.netconf import qos_cli
from geryon.netconf.apply import install_priority_queues, install_shaping, remove_queues
from geryon.netconf.capabilities import detect_capabilities
from geryon.netconf.classes import format_classes
from geryon.netconf.counters import read_class_counters
from geryon.netconf.plan import QueuePlan, build_priority_plan, build_shaping_plan, format_tc_rate
from geryon.netconf.verify import sniff_dscp


def add_commands(commands, bench) -> None:
    """Register `geryon netconf` and its sub-commands."""
    parser = commands.add_parser("netconf", help="priority queues on interfaces (tc), counters, DSCP sniffing",
                                 description=__doc__, formatter_class=_raw_formatter())
    sub = parser.add_subparsers(dest="netconf_command", metavar="ACTION")
    parser.set_defaults(func=lambda args: _usage(parser))

    show = sub.add_parser("show", help="print the tc commands a configuration would run (no root needed)")
    _add_plan_options(show, dev_required=False)
    show.add_argument("--json", action="store_true", help="print the plan as JSON")
    show.set_defaults(func=_show)

    apply = sub.add_parser("apply", help="program priority queues on an interface, or a QoS profile on a target")
    _add_plan_options(apply, dev_required=False)
    qos_cli.add_apply_options(apply)
    apply.set_defaults(func=_apply, dev=None)  # no default device: never the machine's own eth0 by accident

    qos_cli.add_render(sub)
    qos_cli.add_restore(sub)

    remove = sub.add_parser("remove", help="delete an interface's root qdisc (back to the kernel default)")
    _add_device_options(remove)
    remove.set_defaults(func=_remove)

    stats = sub.add_parser("stats", help="per-class bytes, packets, drops and backlog of an interface")
    _add_device_options(stats)
    stats.add_argument("--json", action="store_true")
    stats.set_defaults(func=_stats)

    verify = sub.add_parser("verify", help="sniff an interface and count packets per (source, DSCP)")
    verify.add_argument("--netns", default=None, type=_netns,
                        help="namespace of the interface (default: this one)")
    verify.add_argument("--iface", required=True)
    verify.add_argument("--duration", type=float, default=5.0, help="seconds to capture (default 5)")
    verify.add_argument("--count", type=int, default=None, help="stop after this many packets")
    verify.add_argument("--filter", default=None, help="BPF filter, e.g. 'tcp port 5201'")
    verify.add_argument("--json", action="store_true")
    verify.set_defaults(func=_verify)

    capabilities = sub.add_parser("capabilities", help="qdiscs and classifiers this kernel offers")
    capabilities.add_argument("--json", action="store_true")
    capabilities.set_defaults(func=_capabilities)


def _raw_formatter():
    import argparse
    return argparse.RawDescriptionHelpFormatter


def _usage(parser) -> int:
    parser.print_help()
    return 2


def _netns(text: str) -> str:
    import argparse

    from geryon.netnames import check_netns_name
    try:
        return check_netns_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ifname(text: str) -> str:
    import argparse

    from geryon.netnames import check_ifname
    try:
        return check_ifname(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_device_options(parser) -> None:
    parser.add_argument("--dev", required=True, type=_ifname, help="interface name")
    parser.add_argument("--netns", default=None, type=_netns,
                        help="network namespace holding it (default: this one)")


def _add_plan_options(parser, dev_required: bool) -> None:
    parser.add_argument("--dev", required=dev_required, default="eth0", type=_ifname, help="interface name")
    parser.add_argument("--netns", default=None, type=_netns,
                        help="network namespace holding it (default: this one)")
    parser.add_argument("--rate", default=None,
                        help="link rate, e.g. 100mbit (default: none; strict-priority qdisc if the kernel "
                             "has one, else HTB at 10gbit)")
    parser.add_argument("--classes", default=None,
                        help="priority classes, highest first: 'high:46,low:0', '46,26,0' or a count (1-8)")
    parser.add_argument("--shaping-only", action="store_true",
                        help="shape at --rate with a single class and no priority")


def _plan_from(args) -> QueuePlan:
    if args.shaping_only:
        return build_shaping_plan(args.dev, args.rate or _missing_rate(), args.netns)
    capabilities = detect_capabilities() if args.rate is None else None
    return build_priority_plan(args.dev, args.classes, args.rate, capabilities, args.netns)


def _missing_rate():
    from geryon.errors import ConfigError
    raise ConfigError("--shaping-only needs --rate, e.g. --rate 100mbit")


def _describe(plan: QueuePlan) -> dict:
    return {"dev": plan.dev, "netns": plan.netns, "layout": plan.layout,
            "rate": plan.rate, "classes": [{"name": cls.name, "dscp": cls.dscp, "classid": classid}
                                           for cls, classid in zip(plan.classes, plan.class_ids)],
            "commands": plan.commands(), "notes": list(plan.notes)}


def _print_plan(plan: QueuePlan) -> None:
    rate = format_tc_rate(plan.rate) if plan.rate else "unshaped"
    print(f"# {plan.layout} on {plan.dev}" + (f" in {plan.netns}" if plan.netns else "") +
          f", {rate}, classes {format_classes(plan.classes) or '(none)'}")
    for note in plan.notes:
        print(f"# {note}")
    for line in plan.commands():
        print(line)


def _show(args) -> int:
    plan = _plan_from(args)
    if args.json:
        print(json.dumps(_describe(plan), indent=2))
    else:
        _print_plan(plan)
    return 0


def _apply(args) -> int:
    if args.target:
        return qos_cli.cmd_apply_profile(args)
    qos_cli.require_dev(args)
    if args.shaping_only:
        plan = install_shaping(args.dev, args.rate or _missing_rate(), args.netns)
    else:
        plan = install_priority_queues(args.dev, args.classes, args.rate, args.netns,
                                       ack_priority=args.ack_priority or False)
    _print_plan(plan)
    return 0


def _remove(args) -> int:
    remove_queues(args.dev, args.netns)
    return 0


def _stats(args) -> int:
    counters = read_class_counters(args.dev, args.netns)
    if args.json:
        print(json.dumps([counter.as_dict() for counter in counters], indent=2))
        return 0
    if not counters:
        print(f"{args.dev}: no classes (no priority queues installed)")
        return 0
    print(f"{'class':<10} {'dscp':>4} {'classid':>7} {'bytes':>14} {'packets':>10} {'drops':>8} "
          f"{'overlim':>8} {'backlog':>10}")
    for c in counters:
        dscp = "-" if c.dscp is None else c.dscp
        print(f"{c.name:<10} {dscp:>4} {c.classid:>7} {c.bytes:>14} {c.packets:>10} {c.drops:>8} "
              f"{c.overlimits:>8} {f'{c.backlog_bytes}b/{c.backlog_packets}p':>10}")
    return 0


def _verify(args) -> int:
    result = sniff_dscp(args.netns, args.iface, args.duration, args.count, args.filter)
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
        return 0
    print(f"{args.iface}" + (f" in {args.netns}" if args.netns else "") +
          f": {result.duration_s:.1f} s, {result.other_packets} non-IP packets")
    print(f"{'source':<40} {'dscp':>4} {'packets':>10} {'bytes':>14}")
    for mark in result.marks:
        print(f"{mark.source:<40} {mark.dscp:>4} {mark.packets:>10} {mark.bytes:>14}")
    return 0


def _capabilities(args) -> int:
    capabilities = detect_capabilities()
    if args.json:
        print(json.dumps(capabilities.as_dict(), indent=2))
        return 0
    print(f"qdiscs:      {' '.join(sorted(capabilities.qdiscs))}")
    print(f"classifiers: {' '.join(sorted(capabilities.classifiers))}")
    print(f"strict priority without shaping: {capabilities.strict_priority_qdisc() or 'no (HTB is used)'}")
    if not capabilities.detected:
        print("(not probed: needs root; showing what every kernel with tc has)")
    return 0
