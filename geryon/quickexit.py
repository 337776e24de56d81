"""A prompt interpreter exit for the processes of a job: workers, servers and the launcher.

When a Python process ends, CPython tears its modules down and runs a full garbage collection
several times over every object still alive. A process that imported torch holds hundreds of
thousands of them (its operator registry, its Python modules), so those collections alone take
0.3-1.5 s of CPU per process, after the training has ended; a job of 2 workers, 2 servers and the
launcher waits for that on each of its processes, and on a machine with few cores they queue.

`exit_without_collecting()` registers `gc.freeze()` as an exit handler: at exit every object alive is
moved to the permanent generation, which those collections skip. Nothing else changes: every other
exit handler still runs, output buffers are flushed, objects freed by reference counting run their
finalisers, and the operating system takes the memory back with the process. Only garbage in
reference cycles that is still uncollected at exit keeps its `__del__` unrun, as CPython already
allows; geryon holds its sockets, threads and files in objects it closes explicitly (exit handlers
and `finally` blocks), never by relying on a finaliser at exit.
"""

import atexit
import gc

_registered = False


def exit_without_collecting() -> None:
    """Skip the interpreter's garbage collections at exit in this process (once; idempotent)."""
    global _registered
    if not _registered:
        # atexit runs handlers last-registered first: those registered after this call (a process
        # group's teardown, a timeline's save) run before the freeze and may still free their objects
        atexit.register(gc.freeze)
        _registered = True
