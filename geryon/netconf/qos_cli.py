"""`geryon netconf render` and the profile form of `geryon netconf apply` (switch QoS profiles).

  geryon netconf render (--profile P | --classes SPEC) --target sonic|openconfig|eos|nxos|nvue|junos|linux
                        [--ports Ethernet0,Ethernet4] [--format native|yang] [--ack-priority off|top|own] [--json]
  geryon netconf apply (--profile P | --classes SPEC) --target KIND@[USER@]HOST[:PORT] [--ports ...]
                       [--ack-priority off|top|own] [--dry-run] [--known-hosts FILE] [--key FILE] [--json]

P is a built-in (two-class, four-class) or a TOML file (see geryon/netconf/qos_profile.py, docs/switch-qos.md).
"""

import json
import sys

from geryon.errors import ConfigError
from geryon.netconf.plan import ACK_MODES
from geryon.netconf.qos_profile import resolve_profile
from geryon.netconf.render import FORMATS, TARGETS, render


def _ports(text: str | None) -> list[str] | None:
    return [p.strip() for p in text.split(",") if p.strip()] if text else None


def _add_ack_option(parser) -> None:
    parser.add_argument("--ack-priority", default=None, choices=ACK_MODES,
                        help="TCP pure ACKs: off, top (the top class's queue), own (a strict queue above it); "
                             "default: the profile's ack_priority (off)")


def add_render(sub) -> None:
    """Register `geryon netconf render`."""
    parser = sub.add_parser("render", help="print a QoS profile as a switch's native configuration (dry)")
    parser.add_argument("--profile", default=None, help="built-in (two-class, four-class) or a TOML file")
    parser.add_argument("--classes", default=None, help="or a class spec, e.g. high:46,low:0")
    parser.add_argument("--target", required=True, choices=TARGETS)
    parser.add_argument("--ports", default=None, help="comma-separated ports, e.g. Ethernet0,Ethernet4")
    parser.add_argument("--rate", default=None, help="link rate, e.g. 100gbit (Linux HTB shapes at it)")
    parser.add_argument("--format", default="native", choices=FORMATS,
                        help="native (default) or yang (SONiC tables as a YANG instance)")
    parser.add_argument("--json", action="store_true", help="wrap the output and notes in JSON")
    _add_ack_option(parser)
    parser.set_defaults(func=cmd_render)


def add_apply_options(parser) -> None:
    """The profile options of `geryon netconf apply` (the --dev form stays as it was)."""
    parser.add_argument("--profile", default=None, help="QoS profile: built-in name or TOML file")
    parser.add_argument("--target", default=None, help="KIND@[USER@]HOST[:PORT], e.g. linux@10.0.0.5, sonic@leaf1")
    parser.add_argument("--ports", default=None, help="devices or switch ports (default: the profile's)")
    parser.add_argument("--dry-run", action="store_true", help="show the difference and the session, change nothing")
    parser.add_argument("--known-hosts", default=None, help="known_hosts file (default ~/.ssh/known_hosts)")
    parser.add_argument("--key", default=None, help="SSH private key file")
    parser.add_argument("--python", default="python3", help="python on a Linux target (restoring pyroute2 filters)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    _add_ack_option(parser)


def add_restore(sub) -> None:
    """Register `geryon netconf restore` (Linux targets: back to the state saved before the first apply)."""
    parser = sub.add_parser("restore", help="put a Linux target's devices back as they were before `apply`")
    parser.add_argument("--target", required=True, help="linux@[USER@]HOST[:PORT]")
    parser.add_argument("--ports", required=True, help="devices, e.g. eth1,eth2")
    parser.add_argument("--known-hosts", default=None)
    parser.add_argument("--key", default=None)
    parser.add_argument("--python", default="python3")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(func=cmd_restore)


def cmd_restore(args) -> int:
    from geryon.netconf.linuxapply import restore_linux
    from geryon.netconf.remote import Endpoint, SshShell

    endpoint = Endpoint.parse(args.target, args.key)
    if endpoint.kind != "linux":
        raise ConfigError("restore is for linux targets; switches roll back with their own checkpoints")
    with SshShell(endpoint, args.known_hosts) as shell:
        result = restore_linux(endpoint, shell, _ports(args.ports), python=args.python)
    _print_result(result, args.json)
    return 0


def _print_result(result, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result.as_dict(), indent=2))
        return
    for line in result.diff:
        print(line)
    for step in result.steps:
        print(f"# {step}")


def cmd_render(args) -> int:
    profile = resolve_profile(args.profile, args.classes, args.rate, _ports(args.ports), args.ack_priority)
    rendering = render(profile, args.target, args.format)
    if args.json:
        print(json.dumps(rendering.as_dict(), indent=2))
        return 0
    for note in rendering.notes:
        print(f"# {note}", file=sys.stderr)
    if rendering.data is not None:  # JSON output has no comments: the counter commands go with the notes
        for command in rendering.verify:
            print(f"# per-queue counters: {command}", file=sys.stderr)
    sys.stdout.write(rendering.text)
    return 0


def cmd_apply_profile(args) -> int:
    """`geryon netconf apply --target KIND@HOST`: check everything, then apply with the platform's safety net."""
    from geryon.netconf.remote import Endpoint, SshShell
    from geryon.netconf.render import target_module
    from geryon.netconf.qos_profile import check_target

    endpoint = Endpoint.parse(args.target, args.key)
    profile = resolve_profile(args.profile, args.classes, args.rate, _ports(args.ports),
                              getattr(args, "ack_priority", None))
    check_target(profile, target_module(endpoint.kind).LIMITS)  # profile errors before any connection
    if endpoint.kind == "linux":
        from geryon.netconf.linuxapply import apply_linux
        devs = list(profile.ports) or ["eth0"]
        with SshShell(endpoint, args.known_hosts) as shell:
            result = apply_linux(profile, endpoint, shell, devs, args.dry_run, python=args.python)
    else:
        from geryon.netconf.session import run_session
        result = run_session(profile, endpoint, args.dry_run, args.known_hosts)
    _print_result(result, args.json)
    return 0


def require_dev(args) -> None:
    if args.dev is None:
        raise ConfigError("give --dev DEV (queues on one interface) or --target KIND@HOST with --profile/--classes")
