"""The `geryon` console command: one parser, sub-commands contributed by each sub-package.

Each contributing module defines `add_commands(commands, bench)`, where `commands` is the top-level
sub-parser set and `bench` the sub-parser set of `geryon bench`; every leaf parser sets `func`, a
callable taking the parsed namespace and returning an exit code. Modules are imported lazily and in
a fixed order, so a broken optional part never stops the others.
"""

import argparse
import importlib
import logging
import sys

from geryon.errors import GeryonError
from geryon.quickexit import exit_without_collecting
from geryon.signals import sigterm_as_interrupt

# The module that contributes each top-level command: a command line naming one imports only that
# module (the benches and the demo import torch, a second or more that `geryon emulate` need not pay).
COMMAND_HOMES = {
    "emulate": "geryon.emulate.cli", "netconf": "geryon.netconf.cli", "categorize": "geryon.categorize.cli",
    "report": "geryon.categorize.cli", "bench": "geryon.bench.cli", "demo": "geryon.demo",
    "sim": "geryon.sim.cli", "analyze": "geryon.analyze.cli", "cluster": "geryon.cluster.cli",
}
COMMAND_MODULES = tuple(dict.fromkeys(COMMAND_HOMES.values()))   # every contributing module, in this order


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Build the parser from every module that contributes commands, or, for a known `command`, from
    the one module that contributes it."""
    parser = argparse.ArgumentParser(prog="geryon", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    bench_parser = commands.add_parser("bench", help="benchmarks that print ratios against a baseline")
    bench = bench_parser.add_subparsers(dest="bench", metavar="BENCH")
    bench_parser.set_defaults(func=lambda args: _usage(bench_parser))
    for name in (COMMAND_HOMES[command],) if command in COMMAND_HOMES else COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # that part is not written yet
                continue
            raise
        module.add_commands(commands, bench)
    return parser


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    exit_without_collecting()   # demo and benches import torch: their exit need not collect its objects
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(next((word for word in argv if not word.startswith("-")), None))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    if not getattr(args, "func", None):
        return _usage(parser)
    try:
        with sigterm_as_interrupt():   # `kill` tears down what the command built, as Ctrl-C does
            return int(args.func(args) or 0)
    except GeryonError as exc:
        print(f"geryon: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("geryon: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
