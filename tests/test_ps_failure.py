"""A PS worker killed mid-iteration: the servers notice and tell the other workers, all exit quickly."""

import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.transport_support import free_ports

TIMEOUT = 30.0     # the transport timeout; everyone must fail well before it


def _role(*argv):
    argv = [*argv, "--secret", "ps-failure", "--timeout", TIMEOUT, "--slice-bytes", 65536,
            "--sizes", "400000,4000"]
    return subprocess.Popen([sys.executable, "-m", "geryon.bench.transport_roles", *map(str, argv)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(proc, word, count, timeout=60):
    deadline, seen = time.monotonic() + timeout, 0
    while seen < count and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += word in line
    assert seen >= count, proc.stderr.read()


@pytest.mark.slow
def test_killed_worker_is_named_to_every_rank_quickly():
    servers, workers = 2, 3
    ports = free_ports(servers)
    addresses = ",".join(f"127.0.0.1:{p}" for p in ports)
    server_procs = [_role("ps-server", "--index", s, "--servers", servers, "--workers", workers,
                          "--listen", f"127.0.0.1:{ports[s]}") for s in range(servers)]
    worker_procs = [_role("ps-worker", "--rank", w, "--workers", workers, "--servers", addresses,
                          "--iters", 100000, "--checksum") for w in range(workers)]
    procs = server_procs + worker_procs
    try:
        for proc in worker_procs:
            _wait_for(proc, '"iteration"', 3)
        worker_procs[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        survivors = server_procs + [worker_procs[0], worker_procs[2]]
        for proc in survivors:
            threading.Thread(target=proc.stdout.read, daemon=True).start()   # drain
        for proc in survivors:
            rc = proc.wait(timeout=TIMEOUT)
            error = proc.stderr.read()
            assert rc == 1, error
            # a killed process's socket closes (FIN) or, with unread data in it, resets (RST)
            assert "worker 1" in error, error
            assert "closed the connection" in error or "Connection reset by peer" in error, error
            print(f"{time.monotonic() - killed_at:.2f} s: {error.strip().splitlines()[-1]}")
        elapsed = time.monotonic() - killed_at
        assert elapsed < TIMEOUT / 2, f"survivors took {elapsed:.1f} s to fail"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
