"""Thirteenth session: on PYTHONPATH, logs every garbage collection of a bench role process
(generation, milliseconds, time.time() at its end) to /tmp/gclog-PID.txt when the process exits."""
import atexit
import gc
import os
import sys
import time

_collections, _started = [], [0.0]


def _callback(phase, info):
    if phase == "start":
        _started[0] = time.perf_counter()
    else:
        _collections.append((info["generation"], time.perf_counter() - _started[0], time.time()))


@atexit.register
def _dump():
    if "transport_roles" not in " ".join(sys.argv):
        return
    with open(f"/tmp/gclog-{os.getpid()}.txt", "w") as handle:
        handle.write(" ".join(sys.argv) + "\n")
        for generation, seconds, at in _collections:
            handle.write(f"{generation} {seconds * 1e3:.3f} {at:.4f}\n")


gc.callbacks.append(_callback)
