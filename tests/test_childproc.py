"""finish_all: the records of children that all succeed; the root-cause failure when one fails."""

import sys
import time

import pytest

from geryon.childproc import ChildProcess, finish_all
from geryon.errors import TransportError


def _child(code: str, name: str) -> ChildProcess:
    return ChildProcess.start([sys.executable, "-c", code], name=name, error=TransportError)


def test_records_of_children_that_all_succeed():
    children = [_child(f"print('{{\"rank\": {rank}}}')", f"rank {rank}") for rank in range(3)]
    assert finish_all(children, timeout=30) == [[{"rank": 0}], [{"rank": 1}], [{"rank": 2}]]


@pytest.mark.timing
def test_the_failure_seen_first_is_raised_not_the_first_child():
    """rank 1 fails first; rank 0 fails later (as a peer would, on the closed connection); rank 2
    would run on and is killed after the grace period."""
    children = [_child("import sys, time; time.sleep(1.5); sys.exit('peer closed the connection')", "rank 0"),
                _child("import sys; sys.exit('rank 1 root cause')", "rank 1"),
                _child("import time; time.sleep(60)", "rank 2")]
    started = time.monotonic()
    with pytest.raises(TransportError) as failure:
        finish_all(children, timeout=60, grace=3)
    message = str(failure.value)
    assert message.startswith("rank 1 exited 1 first: rank 1 root cause")
    assert "then rank 0 exited 1" in message
    assert time.monotonic() - started < 20          # rank 2 was not waited for
    assert all(not child.running() for child in children)


@pytest.mark.timing
def test_a_hung_child_shows_where_its_threads_were():
    """Past its timeout a Python child is aborted first, so the error carries its threads' stacks."""
    code = ("import threading, time\n"
            "def stuck_in_helper(): time.sleep(60)\n"
            "threading.Thread(target=stuck_in_helper, daemon=True).start()\n"
            "def stuck_in_main(): time.sleep(60)\n"
            "stuck_in_main()\n")
    child = _child(code, "hung child")
    started = time.monotonic()
    with pytest.raises(TransportError) as failure:
        child.finish(timeout=1)
    message = str(failure.value)
    assert message.startswith("hung child ran past 1 s")
    assert "stuck_in_main" in message and "stuck_in_helper" in message
    assert time.monotonic() - started < 10 and not child.running()
    child.close()


def test_a_silent_child_shows_where_it_was_stuck():
    child = _child("import time\ndef never_says_ready(): time.sleep(60)\nnever_says_ready()\n", "silent child")
    with pytest.raises(TransportError) as failure:
        child.next_line(timeout=1)
    assert str(failure.value).startswith("silent child said nothing within 1 s")
    assert "never_says_ready" in str(failure.value) and not child.running()
    child.close()
