"""`event_set_by_signals`: a SIGTERM always ends a main thread that polls an Event, never deadlocks it;
`interrupts_deferred`: a cleanup finishes before the interrupt it held off is raised.

The child below spends nearly all its time inside `Event.wait(0)`, holding the Event's lock, which is
where a handler calling `event.set()` itself deadlocks (66 of 100 SIGTERMs hung when measured).
"""

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from geryon.childproc import child_env
from geryon.signals import event_set_by_signals, interrupts_deferred

POLLER = textwrap.dedent("""
    import signal, sys, threading
    from geryon.signals import event_set_by_signals, interrupts_deferred
    if sys.argv[1] == "helper":
        stop = event_set_by_signals(signal.SIGTERM)
    else:  # the pattern this helper replaced
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("READY", flush=True)
    while not stop.wait(0):
        pass
    print("STOPPED", flush=True)
""")


def _hung_stops(mode: str, rounds: int, stop_at_first_hang: bool = False) -> int:
    hung = 0
    for _ in range(rounds):
        child = subprocess.Popen([sys.executable, "-c", POLLER, mode], stdout=subprocess.PIPE, text=True,
                                 env=child_env())
        try:
            assert child.stdout.readline().strip() == "READY"
            time.sleep(0.005)
            child.terminate()
            try:
                child.wait(3)
                assert child.stdout.read().strip() == "STOPPED"
            except subprocess.TimeoutExpired:
                hung += 1
        finally:
            child.kill()
            child.wait()
            child.stdout.close()
        if hung and stop_at_first_hang:
            break
    return hung


def test_a_signal_ends_a_main_thread_polling_the_event():
    assert _hung_stops("helper", 20) == 0


@pytest.mark.slow
def test_the_plain_handler_this_replaces_does_deadlock():
    """Evidence that the test above can fail: the direct `event.set()` handler hangs some of the time."""
    assert _hung_stops("plain", 40, stop_at_first_hang=True) > 0


def test_the_event_is_set_in_this_process():
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        event = event_set_by_signals(signal.SIGUSR2)
        assert not event.is_set()
        signal.raise_signal(signal.SIGUSR2)
        assert event.wait(5)
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_an_interrupt_is_raised_after_the_deferred_block_and_an_ignored_one_stays_ignored():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        finished = []
        with pytest.raises(KeyboardInterrupt):
            with interrupts_deferred():
                signal.raise_signal(signal.SIGINT)
                finished.append("cleanup")            # not cut short
        assert finished == ["cleanup"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler   # the handler is back
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with interrupts_deferred():
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
