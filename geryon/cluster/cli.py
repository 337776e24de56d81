"""`geryon cluster up|check|down INVENTORY [--json]`: a cluster's QoS, applied, proved, and removed.

  geryon cluster up cluster/lab.toml [--dry-run]   # host NIC queues + switch profiles, all or nothing
  geryon cluster check cluster/lab.toml            # DSCP sniffed at the receiver, queue counters, contention
  geryon cluster down cluster/lab.toml             # every saved state restored
The inventory format is in geryon/cluster/inventory.py and cluster/README.md.
"""

import argparse
import json


def add_commands(commands, bench) -> None:
    parser = commands.add_parser("cluster", help="apply, prove and remove QoS on the hosts and switches of an "
                                 "inventory", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cluster_command", metavar="ACTION")
    parser.set_defaults(func=lambda args: parser.print_help() or 2)
    for name, help_text in (("up", "apply the profile to every host NIC and switch"),
                            ("check", "prove marking, queues and priority with real flows"),
                            ("down", "restore every saved state")):
        action = sub.add_parser(name, help=help_text)
        action.add_argument("inventory", help="inventory TOML file")
        action.add_argument("--json", action="store_true", help="print the report as JSON")
        if name == "up":
            action.add_argument("--dry-run", action="store_true", help="show the differences, change nothing")
        action.set_defaults(func=_run, action=name)


def _run(args) -> int:
    from geryon.cluster.inventory import load_inventory
    from geryon.cluster.lifecycle import cluster_down, cluster_up

    inventory = load_inventory(args.inventory)  # every profile/inventory error before any host is contacted
    if args.action == "up":
        report = cluster_up(inventory, args.dry_run)
    elif args.action == "check":
        from geryon.cluster.check import cluster_check
        report = cluster_check(inventory)
    else:
        report = cluster_down(inventory)
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.text())
    return 0 if report.ok else 1
