"""Failure behaviour: dead or stalled ranks, bad secrets, malformed frames, bounded memory."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from geryon.errors import AuthenticationError, PeerTimeout, ProtocolError
from geryon.transport.allreduce import AllreduceGroup
from geryon.transport.config import TransportConfig
from geryon.transport.handshake import dial_handshake
from geryon.transport.ps_server import ParameterServer
from geryon.transport.ps_worker import PSWorker
from geryon.transport.wire import HEADER, MAGIC, PROTOCOL_VERSION, Kind
from tests.transport_support import free_ports

SECRET = "fuzz-secret"


def _start_ring(world, extra=()):
    """`world` ring ranks as processes: a dead or stalled peer is found within 3 s, while each waits up
    to 60 s for the others to start (importing torch takes seconds when the machine is busy)."""
    ports = free_ports(world)
    peers = ",".join(f"127.0.0.1:{p}" for p in ports)
    argv = [sys.executable, "-m", "geryon.bench.transport_roles", "allreduce", "--peers", peers,
            "--sizes", "2000000", "--iters", "100000", "--checksum", "--timeout", "3",
            "--connect-timeout", "60", "--secret", SECRET, "--slice-bytes", "65536", *extra]
    return [subprocess.Popen(argv + ["--rank", str(r)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for r in range(world)]


def _wait_iterations(proc, count, timeout=60):
    deadline = time.monotonic() + timeout
    seen = 0
    while seen < count and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += '"iteration"' in line
    assert seen >= count, proc.stderr.read()


def _stop(procs):
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["kill", "stall"])
def test_dead_or_stalled_rank_gives_clear_error_within_timeout(how):
    procs = _start_ring(3)
    try:
        _wait_iterations(procs[0], 3)
        victim = procs[1]
        victim.send_signal(signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        killed_at = time.monotonic()
        for proc in (procs[0], procs[2]):
            threading.Thread(target=proc.stdout.read, daemon=True).start()   # drain
            rc = proc.wait(timeout=3 + 10)
            assert rc == 1
            elapsed = time.monotonic() - killed_at
            error = proc.stderr.read()
            assert "rank 1" in error or "rank " in error, error
            if how == "kill":   # seen directly, or told by the other neighbour (PeerAborted)
                assert "rank 1" in error, error
                assert any(name in error for name in ("TransportError", "PeerAborted", "PeerTimeout")), error
            else:
                assert "PeerTimeout" in error or "TransportError" in error, error
        assert elapsed < 3 + 10
    finally:
        procs[1].send_signal(signal.SIGCONT)
        _stop(procs)


@pytest.mark.parametrize("connect_timeout", [None, 10.0])
def test_a_late_peer_is_waited_for_up_to_the_connect_timeout(connect_timeout):
    """A ring rank that starts 1.5 s after the other: with a 0.5 s transport timeout alone the early
    rank gives up on it, naming it; with connect_timeout=10 it waits, and the ring then reduces exactly
    (the 0.5 s no-progress limit is the dead-peer test's subject, above)."""
    config = TransportConfig(secret=SECRET, timeout=0.5, connect_timeout=connect_timeout)
    ports = free_ports(2)
    peers = [("127.0.0.1", p) for p in ports]
    results, errors = {}, {}

    def rank(r, delay):
        time.sleep(delay)
        started = time.monotonic()
        try:
            with AllreduceGroup(r, 2, peers, config, listen=peers[r]) as group:
                results[r] = group.allreduce([torch.full((1000,), float(r + 1))])[0]
        except Exception as exc:  # noqa: BLE001 -- checked below
            errors[r] = (exc, time.monotonic() - started)

    threads = [threading.Thread(target=rank, args=(0, 0.0)), threading.Thread(target=rank, args=(1, 1.5))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    if connect_timeout is None:
        exc, waited = errors[0]
        assert isinstance(exc, PeerTimeout) and "rank 1" in str(exc), exc
        assert waited < 1.4
    else:
        assert not errors, errors
        assert all(torch.equal(results[r], torch.full((1000,), 3.0)) for r in (0, 1))


def test_wrong_secret_is_refused_and_server_keeps_serving():
    good = TransportConfig(secret="right", timeout=5)
    server = ParameterServer(0, 1, 1, [torch.zeros(4)], good, ("127.0.0.1", 0), lr=1.0)
    try:
        with pytest.raises(AuthenticationError):
            PSWorker(0, 1, [("127.0.0.1", server.port)], [torch.zeros(4)],
                     TransportConfig(secret="wrong", timeout=5))
        with pytest.raises(ProtocolError, match="job id"):
            PSWorker(0, 1, [("127.0.0.1", server.port)], [torch.zeros(4)],
                     TransportConfig(secret="right", job_id=9, timeout=5))
        local = [torch.zeros(4)]
        with PSWorker(0, 1, [("127.0.0.1", server.port)], local, good) as worker:
            worker.step([torch.ones(4)])
            worker.wait_all()
        assert torch.equal(local[0], -torch.ones(4))
    finally:
        server.close()


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _valid_push(**fields):
    values = dict(magic=MAGIC, version=PROTOCOL_VERSION, kind=int(Kind.PUSH), dtype=1, priority=0,
                  job=0, iteration=0, tensor=0, offset=0, length=16, payload=64)
    values.update(fields)
    return HEADER.pack(*values.values())


BAD_FRAMES = st.one_of(
    st.binary(min_size=1, max_size=200),                                        # random
    st.integers(1, 43).map(lambda n: _valid_push()[:n]),                        # truncated header
    st.just(_valid_push() + b"\0" * 10),                                        # truncated payload
    st.integers(1 << 31, (1 << 62) - 1).map(lambda n: _valid_push(length=n, payload=4 * n)),   # oversized
    st.binary(min_size=4, max_size=4).filter(lambda m: m != MAGIC).map(lambda m: _valid_push(magic=m)),
    st.integers(2, 255).map(lambda v: _valid_push(version=v)),
    st.integers(9, 255).map(lambda d: _valid_push(dtype=d)),
    st.sampled_from([2, 3]).map(lambda d: _valid_push(dtype=d)),    # wrong dtype for the tensor
    st.integers(1, 1000).map(lambda i: _valid_push(iteration=i)),   # wrong iteration
    st.integers(1, 2**32 - 1).map(lambda t: _valid_push(tensor=t)),
)


def test_fuzzed_frames_never_stop_the_server():
    config = TransportConfig(secret=SECRET, timeout=5, policy="vanilla")
    params = [torch.zeros(16), torch.zeros(1000)]
    server = ParameterServer(0, 1, 2, params, config, ("127.0.0.1", 0), lr=1.0)
    address = ("127.0.0.1", server.port)
    stop = threading.Event()
    served = []
    try:
        good = PSWorker(0, 2, [address], [p.clone() for p in params], config)

        def keep_pulling():
            while not stop.is_set():
                good.pull(0)
                good.wait_all()
                served.append(1)

        puller = threading.Thread(target=keep_pulling)
        puller.start()
        rss_before = _rss_bytes()

        @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
        @given(frame=BAD_FRAMES, authenticate=st.booleans())
        def attack(frame, authenticate):
            with socket.create_connection(address, timeout=5) as sock:
                if authenticate:
                    dial_handshake(sock, "server", secret=SECRET.encode(), job_id=0, my_id=1,
                                   class_index=0)
                try:
                    sock.sendall(frame)
                    sock.shutdown(socket.SHUT_WR)
                    sock.recv(1024)          # the server closes the connection
                except OSError:
                    pass

        attack()
        stop.set()
        puller.join(10)
        assert served, "the well-behaved worker was not served during the fuzzing"
        assert _rss_bytes() - rss_before < 64 << 20

        # the job still trains once the real second worker shows up
        second = PSWorker(1, 2, [address], [p.clone() for p in params], config)
        results = []

        def train(worker):
            worker.step([torch.ones(16), torch.ones(1000)])
            worker.wait_all()
            results.append([p.clone() for p in worker.params])

        threads = [threading.Thread(target=train, args=(w,)) for w in (good, second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert len(results) == 2
        for result in results:
            assert torch.equal(result[0], -torch.ones(16)) and torch.equal(result[1], -torch.ones(1000))
        good.close()
        second.close()
    finally:
        stop.set()
        server.close()


@pytest.mark.slow
def test_ring_passes_the_news_to_ranks_that_are_not_neighbours():
    """4 ranks: rank 3 is not next to rank 1, yet its error names rank 1 (ABORT round the ring)."""
    procs = _start_ring(4)
    try:
        _wait_iterations(procs[3], 3)
        procs[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        for proc in (procs[0], procs[2], procs[3]):
            threading.Thread(target=proc.stdout.read, daemon=True).start()
        for proc in (procs[0], procs[2], procs[3]):
            assert proc.wait(timeout=3 + 10) == 1
            error = proc.stderr.read()
            assert "rank 1 failed" in error or "rank 1 at" in error, error
            print(f"{time.monotonic() - killed_at:.2f} s: {error.strip().splitlines()[-1]}")
        assert time.monotonic() - killed_at < 3 + 10
    finally:
        _stop(procs)
