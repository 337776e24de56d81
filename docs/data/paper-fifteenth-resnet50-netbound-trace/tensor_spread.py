"""How far apart one tensor's pushes reach its server, and its next version reaches the workers.

    python tensor_spread.py TRACE.json [TENSOR]    # a `bench paper --timeline` trace; tensor 0 = conv1

Colocated layout: worker i runs on 10.199.0.(i+1) (trace pid i+1), server j on 10.199.0.(j+1)
(pid 1001+j). Prints, per iteration, the arrival times (s from the trace's first event) of the
tensor's pushes at its server by sender host, then of its pulled versions at the workers.
"""

import collections
import json
import re
import sys

SERVER_PID_BASE = 1001


def spread(path: str, tensor: int = 0) -> None:
    events = json.load(open(path))["traceEvents"]
    t0 = min(e["ts"] for e in events if "ts" in e) / 1e6
    pushes, pulls = collections.defaultdict(list), collections.defaultdict(list)
    server_host = None
    for e in events:
        if e.get("ph") != "i" or not e["cat"].startswith("received") or e["args"]["tensor"] != tensor:
            continue
        t = e["ts"] / 1e6 - t0
        sender = int(re.search(r"10\.199\.0\.(\d+)", e["args"]["flow"]).group(1))
        if e["pid"] >= SERVER_PID_BASE:
            server_host = e["pid"] - SERVER_PID_BASE + 1
            pushes[e["args"]["iteration"]].append((t, sender))
        else:
            server_host = sender
            pulls[e["args"]["iteration"]].append((t, e["pid"]))
    for label, table in (("pushes in, by sender host", pushes), ("versions out, by worker host", pulls)):
        for iteration in sorted(table):
            times = sorted(table[iteration])
            remote = [t for t, host in times if host != server_host] or [times[0][0]]
            print(f"tensor {tensor} {label}, iteration {iteration}: "
                  + " ".join(f"{t:.3f}(h{h})" for t, h in times)
                  + f"  spread {1e3 * (times[-1][0] - times[0][0]):.0f} ms"
                  + f" ({1e3 * (max(remote) - min(remote)):.0f} ms over the other hosts)")


def server_side(path: str, tensor: int = 0, server: int = 0) -> None:
    """Per version and worker host: when the server queued the tensor's answer, wrote it to the
    socket, and when the worker received it."""
    events = json.load(open(path))["traceEvents"]
    t0 = min(e["ts"] for e in events if "ts" in e) / 1e6
    pid = SERVER_PID_BASE + server
    track = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e["name"] == "thread_name"}
    queued, written, received = {}, {}, {}
    for e in events:
        args = e.get("args", {})
        if args.get("tensor") != tensor:
            continue
        if e["pid"] == pid and e.get("ph") in ("b", "X"):
            host = int(re.search(r"10\.199\.0\.(\d+)", track[(pid, e["tid"])]).group(1))
            table = queued if e["ph"] == "b" else written
            table[(args["iteration"], host)] = e["ts"] / 1e6 - t0
        elif e["pid"] < SERVER_PID_BASE and e.get("ph") == "i":
            received[(args["iteration"], e["pid"])] = e["ts"] / 1e6 - t0
    for key in sorted(queued):
        if key in written and key in received:
            print(f"version {key[0]} to host {key[1]}: queued {queued[key]:.3f}, "
                  f"written to its socket +{1e3 * (written[key] - queued[key]):.0f} ms later, "
                  f"received +{1e3 * (received[key] - written[key]):.0f} ms after")


if __name__ == "__main__":
    spread(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    server_side(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0)
