"""How far apart one tensor's pushes reach its server, and its next version reaches the workers.

    python tensor_spread.py TRACE.json [TENSOR]    # a `bench paper --timeline` trace; tensor 0 = conv1

Read with geryon.analyze.trace. Colocated layout: worker i and server i share a host, so the worker
with the server's index is skipped in the spreads ("over the others"). Prints, per iteration, when
the tensor's pushes reached its server (s from the trace's first event) and the spread; per version,
when each remote worker received it; and per answer, its time in the server's send queue and from
its socket to the worker.
"""

import sys
from collections import defaultdict

from geryon.analyze.trace import load_trace


def _index(name: str) -> int:
    return int("".join(ch for ch in name if ch.isdigit()) or 0)


def _line(label: str, arrivals: list[tuple[float, int]], local: int) -> str:
    arrivals = sorted(arrivals)
    remote = [t for t, peer in arrivals if peer != local] or [arrivals[0][0]]
    return (f"{label}: " + " ".join(f"{t:.3f}(w{peer})" for t, peer in arrivals)
            + f"  spread {1e3 * (arrivals[-1][0] - arrivals[0][0]):.0f} ms"
            + f" ({1e3 * (max(remote) - min(remote)):.0f} ms over the others)")


def spread(path: str, tensor: int = 0) -> None:
    ranks = load_trace(path)
    t0 = min(x.end for rank in ranks.values() for x in rank.transfers)
    for server in (r for r in ranks.values() if not r.is_worker):
        pushes = defaultdict(list)
        for x in server.transfers:
            if x.direction == "recv" and x.tensor == tensor:
                pushes[x.iteration].append((x.end - t0, x.peer))
        if not pushes:
            continue
        index = _index(server.name)
        for iteration in sorted(pushes):
            print(_line(f"tensor {tensor} pushes into {server.name}, iteration {iteration}",
                        pushes[iteration], index))
        received = defaultdict(list)
        for worker in (r for r in ranks.values() if r.is_worker):
            for x in worker.transfers:
                if x.direction == "recv" and x.peer_kind == "server" and x.peer == index and x.tensor == tensor:
                    received[x.iteration].append((x.end - t0, _index(worker.name)))
        for version in sorted(received):
            print(_line(f"tensor {tensor} version {version} at the workers", received[version], index))
        arrival = {(version, peer): t for version, got in received.items() for t, peer in got}
        for x in sorted((x for x in server.transfers if x.direction == "send" and x.tensor == tensor
                         and x.queued is not None), key=lambda x: (x.iteration, x.peer)):
            got = arrival.get((x.iteration, x.peer))
            if got is not None and x.peer != index:
                print(f"version {x.iteration} to worker {x.peer}: queued {x.queued - t0:.3f}, "
                      f"written to its socket +{1e3 * (x.start - x.queued):.0f} ms later, "
                      f"received +{1e3 * (got - (x.start - t0)):.0f} ms after")


if __name__ == "__main__":
    spread(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0)
