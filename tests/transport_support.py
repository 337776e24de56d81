"""Helpers shared by the transport tests."""

import threading

from geryon.bench.loopback import free_ports  # noqa: F401 -- the transport tests take their ports here
from geryon.transport import AllreduceGroup


def serve_world_of_threads(world: int, config, body, **group_options):
    """Run `body(group)` on `world` AllreduceGroup ranks as threads over loopback sockets; their results.
    `config` is every rank's TransportConfig, or a list of one per rank; `group_options` go to every
    AllreduceGroup (stage_host=True, say)."""
    configs = config if isinstance(config, list) else [config] * world
    host, ports = "127.0.0.1", free_ports(world)
    peers = [(host, p) for p in ports]
    results, errors = [None] * world, [None] * world

    def run(rank):
        try:
            with AllreduceGroup(rank, world, peers, configs[rank], listen=(host, ports[rank]),
                                **group_options) as group:
                results[rank] = body(group)
        except BaseException as exc:  # noqa: BLE001 -- re-raised in the caller's thread
            errors[rank] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for exc in errors:
        if exc is not None:
            raise exc
    return results
