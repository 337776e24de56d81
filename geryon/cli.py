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

COMMAND_MODULES = (
    "geryon.emulate.cli",
    "geryon.netconf.cli",
    "geryon.categorize.cli",
    "geryon.bench.cli",
    "geryon.demo",
    "geryon.sim.cli",
    "geryon.analyze.cli",
    "geryon.cluster.cli",
)


def build_parser() -> argparse.ArgumentParser:
    """Build the full parser from every module that contributes commands."""
    parser = argparse.ArgumentParser(prog="geryon", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    bench_parser = commands.add_parser("bench", help="benchmarks that print ratios against a baseline")
    bench = bench_parser.add_subparsers(dest="bench", metavar="BENCH")
    bench_parser.set_defaults(func=lambda args: _usage(bench_parser))
    for name in COMMAND_MODULES:
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
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    if not getattr(args, "func", None):
        return _usage(parser)
    try:
        return int(args.func(args) or 0)
    except GeryonError as exc:
        print(f"geryon: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("geryon: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
