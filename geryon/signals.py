"""SIGTERM as Ctrl-C for a process that owns namespaces and children (the launcher, a bench), so that
`kill` runs the same cleanup as an interrupt.

A process that brings up namespaces and role processes tears them down in `finally` blocks and
context managers, which a KeyboardInterrupt runs and Python's default SIGTERM (death) skips.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Inside the block, a SIGTERM to this process raises KeyboardInterrupt in the main thread.

    Only the installing process: pyroute2 forks helpers (to work inside namespaces) that inherit
    Python signal handlers, and a SIGTERM ending one of them must end it, not run our cleanup there.
    A no-op outside the main thread, where Python cannot install handlers.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    installer = os.getpid()

    def _interrupt(signum, _frame):
        if os.getpid() != installer:
            os._exit(128 + signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
