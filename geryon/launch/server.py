"""The parameter-server role: what `python -m geryon.launch.server` runs for each of a ps job's servers.

The launcher starts M of these next to the workers (GERYON_ROLE=server, GERYON_SERVER_RANK=j) and
stops them with SIGTERM once every worker has finished; a server that exits on its own while workers
still run fails the job.

A server runs geryon.transport's `ParameterServer`:
  1. it waits (until SIGTERM) for worker 0 to publish the job's starting point in the store under
     `<GERYON_STORE_PREFIX>ps/spec` (initial parameter values, each tensor's class and urgency, the SGD
     settings; see geryon.launch.ps_sync), which worker 0 does on the model's first forward call;
  2. it listens on GERYON_HOST_IP (a free port) and publishes `host:port` under `ps/server/<j>`;
     workers authenticate with GERYON_JOB_SECRET;
  3. it serves pushes and pulls, per priority class, until every worker is gone (said goodbye, or
     lost: then it names the worker), and holds the role until the launcher's SIGTERM (exit 0, or 1
     when a worker was lost). The transport's closed connection or timeout
     (GERYON_TRANSPORT_TIMEOUT) marks a lost worker, so a dead worker never hangs a server.
"""

import logging
import os
import signal
import sys
import threading

from geryon.errors import GeryonError
from geryon.launch import jobtransport
from geryon.launch.ps_sync import SERVER_KEY, SPEC_KEY, decode_spec

POLL_S = 0.2
EXIT_WORKER_LOST = 1


def serve(environ=os.environ) -> int:
    """Run this process's server role until the workers leave or the launcher stops it."""
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stopped.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stopped.set())
    index, count = int(environ.get("GERYON_SERVER_RANK", "0")), int(environ.get("GERYON_SERVERS", "1"))
    workers = int(environ.get("GERYON_WORKERS", "1"))
    name = f"server {index} of {count}"
    prefix = jobtransport.store_prefix(environ)
    store = jobtransport.open_store(environ)
    spec = _wait_for_spec(store, prefix + SPEC_KEY, stopped)
    if spec is None:
        return 0
    from geryon.timeline import rank_timeline
    from geryon.transport import ParameterServer

    timeline = rank_timeline(environ)
    config = jobtransport.transport_config(environ, tracer=timeline.transfer if timeline else None)
    host = jobtransport.listen_host(environ)
    with ParameterServer(index, count, workers, spec["values"], config, (host, 0), spec["priorities"],
                         **spec["sgd"]) as server:
        store.set(prefix + SERVER_KEY.format(index=index), f"{host}:{server.port}")
        sizes = sum(v.numel() * v.element_size() for v in spec["values"])
        print(f"{name}: serving {len(server.values())} shards of {sizes / 1e6:.1f} MB of parameters to "
              f"{workers} workers on {host}:{server.port} (policy {config.policy})", flush=True)
        while not stopped.is_set():
            server.serve_until_workers_leave(timeout=POLL_S)
            pool = server.pool
            if len(pool.left | set(pool.failures)) >= workers:
                break
        lost = {} if stopped.is_set() else dict(server.pool.failures)
    for worker, failure in sorted(lost.items()):
        print(f"{name}: lost worker {worker}: {failure}", file=sys.stderr, flush=True)
    if not stopped.is_set() and not lost:
        print(f"{name}: every worker finished", flush=True)
    stopped.wait()  # the launcher stops servers after the workers; exiting first would look like a failure
    return EXIT_WORKER_LOST if lost else 0


def _wait_for_spec(store, key: str, stopped: threading.Event):
    """The decoded spec once worker 0 published it; None if stopped first."""
    while not stopped.is_set():
        if store.check([key]):
            return decode_spec(store.get(key))
        stopped.wait(POLL_S)
    return None


def main() -> int:
    if os.environ.get("GERYON_ROLE") != "server":
        print("geryon.launch.server is started by `python -m geryon.launch --mode ps`, not by hand",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        return serve()
    except GeryonError as exc:
        index = os.environ.get("GERYON_SERVER_RANK", "?")
        print(f"server {index}: error: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
