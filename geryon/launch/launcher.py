"""The launcher's entry point: parse, pick the backend, run the job (again, after a failure, up to
--max-restarts times), report how it ended."""

import dataclasses
import importlib
import os
import secrets
import sys
import time

from geryon.errors import ConfigError, GeryonError
from geryon.launch.config import LaunchConfig, parse_launch_args
from geryon.launch.credentials import job_credentials
from geryon.launch.supervise import EXIT_INTERRUPTED, EXIT_TIMEOUT, JobResult
from geryon.signals import sigterm_as_interrupt

BACKEND_MODULES = {
    "local": "geryon.launch.local_run",
    "emulate": "geryon.launch.emulate_run",
    "ssh": "geryon.launch.ssh_run",
}
PROG = "geryon.launch"


def run(config: LaunchConfig, out=None, err=None) -> JobResult:
    """Run one job to its end with the backend the config names; raises GeryonError on setup errors.

    A job whose rank or server failed is started again, whole, up to config.max_restarts times:
    every rank on the same placement, with a fresh store, secret and credentials, and
    config.restart_count (GERYON_RESTART_COUNT, TORCHELASTIC_RESTART_COUNT) telling the ranks which
    start this is. A timeout or an interrupt is never restarted.
    """
    backend = importlib.import_module(BACKEND_MODULES[config.backend])
    if config.ps_checkpoint_dir:
        os.makedirs(config.ps_checkpoint_dir, exist_ok=True)
    started = time.monotonic()
    try:
        for restart in range(config.max_restarts + 1):
            attempt = _attempt(config, restart, time.monotonic() - started)
            with job_credentials(attempt) as job:   # --tls: the job's key and certificate, removed after
                result = backend.run_job(job, out=out, err=err)
            if result.ok or result.exit_code in (EXIT_INTERRUPTED, EXIT_TIMEOUT):
                break
            if restart < config.max_restarts:
                print(f"{PROG}: {result.message}; restarting the job (restart {restart + 1} of "
                      f"{config.max_restarts})", file=sys.stderr, flush=True)
        if config.max_restarts and not result.ok and result.exit_code not in (EXIT_INTERRUPTED, EXIT_TIMEOUT):
            result.message += f"; gave up after {_restarts(config.max_restarts)}"
        result.elapsed_s = time.monotonic() - started
        return result
    finally:
        if config.timeline:
            merge_timeline(config.timeline, err)


def _restarts(count: int) -> str:
    return f"{count} restart{'s' * (count != 1)}"


def _attempt(config: LaunchConfig, restart: int, elapsed: float) -> LaunchConfig:
    """The config of start number `restart`: a fresh secret after the first, the time --timeout leaves."""
    if restart == 0:
        return config
    timeout = None if config.timeout is None else max(0.001, config.timeout - elapsed)
    return dataclasses.replace(config, restart_count=restart, secret=secrets.token_hex(16), timeout=timeout)


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

