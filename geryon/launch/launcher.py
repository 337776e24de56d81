"""The launcher's entry point: parse, pick the backend, run the job, report how it ended."""

import importlib
import sys

from geryon.errors import ConfigError, GeryonError
from geryon.launch.config import LaunchConfig, parse_launch_args
from geryon.launch.credentials import job_credentials
from geryon.launch.supervise import EXIT_INTERRUPTED, JobResult
from geryon.signals import sigterm_as_interrupt

BACKEND_MODULES = {
    "local": "geryon.launch.local_run",
    "emulate": "geryon.launch.emulate_run",
    "ssh": "geryon.launch.ssh_run",
}
PROG = "geryon.launch"


def run(config: LaunchConfig, out=None, err=None) -> JobResult:
    """Run one job to its end with the backend the config names; raises GeryonError on setup errors."""
    backend = importlib.import_module(BACKEND_MODULES[config.backend])
    try:
        with job_credentials(config) as job:     # --tls: the job's key and certificate, removed after
            return backend.run_job(job, out=out, err=err)
    finally:
        if config.timeline:
            merge_timeline(config.timeline, err)


def merge_timeline(path: str, err=None) -> None:
    """Merge the ranks' parts of the trace into `path` (parts on other hosts are not reachable)."""
    from geryon.timeline import merge_parts

    events = merge_parts(path)
    print(f"{PROG}: timeline with {events} events written to {path} (open it in ui.perfetto.dev "
          "or chrome://tracing)", file=err or sys.stderr, flush=True)


def describe(config: LaunchConfig) -> str:
    """One line about the job, printed when it starts."""
    servers = f", {config.servers} server{'s' * (config.servers != 1)}" if config.mode == "ps" else ""
    where = {"local": "local processes", "ssh": f"{len(config.hosts)} host{'s' * (len(config.hosts) != 1)} over SSH",
             "emulate": f"an emulated {config.topology} cluster at {config.bw / 1e6:g} Mbit/s"}
    return (f"job {config.job_id}: {config.workers} worker{'s' * (config.workers != 1)}{servers}, "
            f"{config.mode}, policy {config.policy}, priority {config.priority}, "
            f"on {where[config.backend]}{', TLS' if config.tls else ''}")


def main(argv: list[str] | None = None) -> int:
    """`python -m geryon.launch ...`; returns the exit code (the failed rank's, when one failed)."""
    with sigterm_as_interrupt():  # a SIGTERM to the launcher stops the job like Ctrl-C
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    try:
        config = parse_launch_args(argv)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except GeryonError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    print(f"{PROG}: {describe(config)}", file=sys.stderr, flush=True)
    try:
        result = run(config)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; the job is stopped and cleaned up", file=sys.stderr)
        return EXIT_INTERRUPTED
    except GeryonError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    report(result)
    return result.exit_code


def report(result: JobResult) -> None:
    """Print how the job ended; for a failed rank, also its last lines of output."""
    if result.ok:
        print(f"{PROG}: {result.message} in {result.elapsed_s:.1f} s", file=sys.stderr)
        return
    lines = [f"{PROG}: error: {result.message} (after {result.elapsed_s:.1f} s)"]
    if result.tail:
        lines.append(f"{PROG}: last lines of {result.failed_rank}:")
        lines.extend(f"    {line}" for line in result.tail)
    print("\n".join(lines), file=sys.stderr)

