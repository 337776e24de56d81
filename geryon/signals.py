"""Signals that end a geryon process cleanly: SIGTERM as Ctrl-C for a process that owns namespaces and
children (the launcher, a bench), so that `kill` runs the same cleanup as an interrupt; and a
`threading.Event` that a signal sets, for a role that polls for its stop (a server, the sniffer).

A process that brings up namespaces and role processes tears them down in `finally` blocks and
context managers, which a KeyboardInterrupt runs and Python's default SIGTERM (death) skips.

Never call `Event.set()` in a signal handler: Python runs the handler in the main thread between two
bytecodes, and if that thread is inside `Event.wait()` at that moment it holds the Event's lock, which
`set()` then waits for forever. A child looping on `event.wait(0)` hung in 66 of 100 SIGTERMs here;
with a 50 ms wait the window is rare, and that was the sniffer's CI flake. `event_set_by_signals`
sets the Event from a short-lived thread instead, which simply waits for the lock.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading


def event_set_by_signals(*signums: int) -> threading.Event:
    """A new Event, set when any of `signums` arrives (main thread only, as any Python handler).

    Waiting on it in the main thread is safe, with or without a timeout (see the module docstring).
    """
    event = threading.Event()

    def _set_from_a_thread(_signum, _frame):
        threading.Thread(target=event.set, name="signal-set", daemon=True).start()

    for signum in signums:
        signal.signal(signum, _set_from_a_thread)
    return event


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


@contextlib.contextmanager
def interrupts_deferred():
    """Hold off SIGINT and SIGTERM while cleaning up, so a second Ctrl-C or `kill` cannot leave things
    half-removed; one that arrived meanwhile raises KeyboardInterrupt when the block ends.

    As in `sigterm_as_interrupt`, a process forked inside the block (pyroute2's namespace helpers) that
    gets one of these signals exits at once instead of deferring it. A signal this process ignores (a
    command started in the background by a shell ignores SIGINT) stays ignored. A no-op outside the main
    thread.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    installer = os.getpid()
    received: list[int] = []

    def _defer(signum, _frame):
        if os.getpid() != installer:
            os._exit(128 + signum)
        received.append(signum)

    previous = {signum: signal.signal(signum, _defer) for signum in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(signum) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:
        raise KeyboardInterrupt
