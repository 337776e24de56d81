"""`geryon demo`: the README's first command; for now it runs the priority check and prints its table.

It will become the training demo (a job on the emulated cluster with and without geryon's
scheduling); until then it shows the foundation that demo stands on: priority that holds inside
the network (see geryon.emulate.check).
"""


def add_commands(commands, bench) -> None:
    """Register `geryon demo [--bw RATE] [--duration S] [--congestion LIST] [--json]`."""
    from geryon.emulate.check import add_check_arguments  # lazy: keeps `geryon --help` fast

    parser = commands.add_parser("demo", help="run the demo (for now: the priority check)",
                                 description=__doc__.splitlines()[0])
    add_check_arguments(parser)
    parser.set_defaults(func=_run_demo)


def _run_demo(args) -> int:
    from geryon.emulate.check import run_from_args

    return run_from_args(args)
