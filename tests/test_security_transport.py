"""Issue 13, findings 1-3 at the transport: relays, pre-authentication floods, misbehaving peers.

Every test uses real sockets on loopback: a real relay that forwards bytes, real idle and slow-loris
clients, a real file-descriptor exhaustion in a child process, authenticated peers that misbehave.
"""

import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from transport_support import step_workers_exactly

from geryon.errors import AuthenticationError
from geryon.transport.config import TransportConfig
from geryon.transport.flows import next_sequence
from geryon.transport.handshake import dial_handshake
from geryon.transport.ps_server import ParameterServer
from geryon.transport.ps_worker import PSWorker
from geryon.transport.wire import Kind, encode_control

SECRET = "security-secret"


def _config(timeout=4.0):
    return TransportConfig(secret=SECRET, timeout=timeout, policy="vanilla")


def _server(workers=1, timeout=4.0, params=None):
    params = params or [torch.zeros(8)]
    return ParameterServer(0, 1, workers, params, _config(timeout), ("127.0.0.1", 0), lr=1.0)


class Relay:
    """A TCP relay: accepts on its own port and forwards every byte both ways to `target`."""

    def __init__(self, target):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()
        self.relayed = 0
        self.sockets = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source, sink):
        try:
            while data := source.recv(65536):
                self.relayed += len(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.listener.close()
        for s in self.sockets:
            s.close()


def test_relayed_handshake_is_refused():
    """Finding 1: someone who points a worker at itself and relays the bytes gets nowhere."""
    server = _server()
    relay = Relay(("127.0.0.1", server.port))
    try:
        started = time.monotonic()
        with pytest.raises(AuthenticationError, match="relayed"):
            PSWorker(0, 1, [relay.address], [torch.zeros(8)], _config())
        assert relay.relayed > 0, "the relay never carried the handshake"
        assert time.monotonic() - started < 4.0
        local = [torch.zeros(8)]   # the direct path still works
        with PSWorker(0, 1, [("127.0.0.1", server.port)], local, _config()) as worker:
            worker.step([torch.ones(8)])
            worker.wait_all()
        assert torch.equal(local[0], -torch.ones(8))
    finally:
        relay.close()
        server.close()


def _slow_loris(source: str, target, stop: threading.Event, sockets: list):
    """Keep connections from `source` open, each trickling one byte of a HELLO a second, reconnecting."""
    hello = encode_control(Kind.HELLO, b"\0" * 37, job_id=0)
    while not stop.is_set():
        try:
            sock = socket.create_connection(target, timeout=2, source_address=(source, 0))
        except OSError:
            time.sleep(0.05)
            continue
        sockets.append(sock)
        try:
            for byte in hello:
                if stop.wait(1.0):
                    break
                sock.send(bytes([byte]))
        except OSError:
            pass
        sock.close()


def test_flood_of_idle_and_slow_clients_does_not_lock_out_a_worker():
    """Finding 2: 80 slow-loris clients from one host plus 64 idle ones from 64 others."""
    server = _server(timeout=4.0)
    target = ("127.0.0.1", server.port)
    stop = threading.Event()
    sockets = []
    idle = []
    try:
        loris = [threading.Thread(target=_slow_loris, args=("127.0.0.2", target, stop, sockets),
                                  daemon=True) for _ in range(80)]
        for thread in loris:
            thread.start()
        for n in range(64):          # one idle connection from each of 64 addresses: the global cap
            idle.append(socket.create_connection(target, source_address=(f"127.0.1.{n + 1}", 0)))
        time.sleep(0.5)
        local = [torch.zeros(8)]
        started = time.monotonic()
        with PSWorker(0, 1, [target], local, _config(timeout=4.0)) as worker:
            joined = time.monotonic() - started
            worker.step([torch.ones(8)])
            worker.wait_all()
        assert torch.equal(local[0], -torch.ones(8))
        assert joined < 4.0, f"joining took {joined:.1f} s"
    finally:
        stop.set()
        for sock in idle + sockets:
            sock.close()
        server.close()


_EMFILE_SERVER = textwrap.dedent("""
    import resource, sys, torch
    from geryon.transport.config import TransportConfig
    from geryon.transport.ps_server import ParameterServer
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
    config = TransportConfig(secret=%r, timeout=4.0, policy="vanilla")
    server = ParameterServer(0, 1, 1, [torch.zeros(8)], config, ("127.0.0.1", 0), lr=1.0)
    print(server.port, flush=True)
    hog = []
    try:
        while True:
            hog.append(open("/dev/null"))
    except OSError:
        pass
    print("full", flush=True)
    sys.stdin.readline()          # the test connected while no descriptor was free
    for f in hog:
        f.close()
    print("freed", flush=True)
    server.serve_job()
    print("served", flush=True)
""")


def test_accept_error_does_not_end_the_accept_loop():
    """Finding 2: accept() failing with EMFILE while descriptors are exhausted is survived."""
    child = subprocess.Popen([sys.executable, "-c", _EMFILE_SERVER % SECRET], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())
        assert child.stdout.readline().strip() == "full"
        early = socket.create_connection(("127.0.0.1", port))   # accept() fails: EMFILE
        time.sleep(0.5)
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "freed"
        early.close()
        local = [torch.zeros(8)]
        with PSWorker(0, 1, [("127.0.0.1", port)], local, _config()) as worker:
            worker.step([torch.ones(8)])
            worker.wait_all()
        assert torch.equal(local[0], -torch.ones(8))
        assert child.stdout.readline().strip() == "served"
        assert child.wait(10) == 0
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()


def _authenticated(port: int, worker_id: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    dial_handshake(sock, "server", secret=SECRET.encode(), job_id=0, my_id=worker_id, class_index=0)
    return sock


def _train_two(server, params, steps=1):
    results = {}

    def train(rank):
        local = [p.clone() for p in params]
        with PSWorker(rank, 2, [("127.0.0.1", server.port)], local, _config()) as worker:
            for _ in range(steps):
                worker.step([torch.ones_like(p) for p in local])
                worker.wait_all()
        results[rank] = local

    threads = [threading.Thread(target=train, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return results


def test_malformed_frame_under_every_worker_id_does_not_stop_the_server():
    """Finding 3: garbage from authenticated clients posing as workers 0 and 1 before they join."""
    params = [torch.zeros(8)]
    server = _server(workers=2, params=params)
    served = threading.Thread(target=server.serve_job, daemon=True)
    served.start()
    try:
        for worker_id in (0, 1):
            with _authenticated(server.port, worker_id) as sock:
                sock.sendall(b"\xff" * 44)
                sock.recv(100)
        time.sleep(1.0)
        assert served.is_alive(), "the server stopped serving after stray malformed frames"
        results = _train_two(server, params)
        assert sorted(results) == [0, 1]
        for local in results.values():
            assert torch.equal(local[0], -torch.ones(8))
        served.join(10)
        assert not served.is_alive()
    finally:
        server.close()


def test_stray_bye_does_not_hold_a_slot():
    """Finding 3: a BYE from a stray client under worker 1's id before worker 1 joins."""
    params = [torch.zeros(8)]
    server = _server(workers=2, params=params)
    served = threading.Thread(target=server.serve_job, daemon=True)
    served.start()
    stray = _authenticated(server.port, 1)
    try:
        stray.sendall(encode_control(Kind.BYE, b"", job_id=0))
        time.sleep(0.3)
        assert served.is_alive()
        results = _train_two(server, params)
        assert sorted(results) == [0, 1]
        for local in results.values():
            assert torch.equal(local[0], -torch.ones(8))
    finally:
        stray.close()
        server.close()


def test_duplicate_connection_is_refused_before_accept():
    """Finding 3: a second connection for a busy slot gets REJECT, not ACCEPT then silence."""
    server = _server(workers=1)
    holder = _authenticated(server.port, 0)
    try:
        started = time.monotonic()
        with pytest.raises(AuthenticationError, match="connected twice"):
            PSWorker(0, 1, [("127.0.0.1", server.port)], [torch.zeros(8)], _config())
        assert time.monotonic() - started < 2.0
    finally:
        holder.close()
        server.close()


def test_stale_pull_is_ignored():
    """Finding 3: a PULL for a version the server has passed yields no duplicate PARAM."""
    server = _server()
    local = [torch.zeros(8)]
    try:
        with PSWorker(0, 1, [("127.0.0.1", server.port)], local, _config()) as worker:
            worker.step([torch.ones(8)])
            worker.wait_all()
            stale = encode_control(Kind.PULL, b"", job_id=0, iteration=0)
            worker.pool.flow(0, 0).send((-1, next_sequence()), stale)
            early = encode_control(Kind.PULL, b"", job_id=0, iteration=3)   # answered at version 3 only
            worker.pool.flow(0, 0).send((-1, next_sequence()), early)
            time.sleep(0.5)
            for _ in range(2):
                worker.step([torch.ones(8)])
                worker.wait_all()
        assert torch.equal(local[0], torch.full((8,), -3.0))
    finally:
        server.close()


def test_departed_worker_does_not_break_another_workers_flow():
    """Finding 3: sending a parameter to a worker that is gone must not fail the pushing worker."""
    params = [torch.zeros(8)]
    server = _server(workers=2, params=params)
    first = PSWorker(0, 2, [("127.0.0.1", server.port)], [torch.zeros(8)], _config())
    second = PSWorker(1, 2, [("127.0.0.1", server.port)], [torch.zeros(8)], _config())
    try:
        second.push([torch.ones(8)])
        second.iteration += 1
        second.pull(1)
        time.sleep(0.3)
        second.pool.flow(0, 0).sock.sendall(b"\xee" * 44)    # malformed: the server drops worker 1
        deadline = time.monotonic() + 3
        while 1 not in server.pool.failures and time.monotonic() < deadline:
            time.sleep(0.02)
        assert 1 in server.pool.failures
        first.step([torch.ones(8)])    # completes the step on worker 0's thread; PARAM to 1 fails
        first.wait_all()
        assert torch.equal(first.params[0], -torch.ones(8))
        time.sleep(0.3)
        assert 0 not in server.pool.failures, server.pool.failures.get(0)
    finally:
        first.close()
        second.close()
        server.close()


def test_a_cut_extra_connection_does_not_drop_the_workers_pending_pull():
    """A worker's pending PULL survives the server cutting another connection under that worker's id
    (found by the fuzzing after the join: the worker then waited forever for its parameters)."""
    workers_config = TransportConfig(secret=SECRET, timeout=4.0, policy="geryon")
    config = TransportConfig(secret=SECRET, timeout=4.0, policy="geryon", class_dscp=(46, 10, 0))
    server = ParameterServer(0, 1, 1, [torch.zeros(8)], config, ("127.0.0.1", 0), lr=1.0)
    local = [torch.zeros(8)]
    try:
        with PSWorker(0, 1, [("127.0.0.1", server.port)], local, workers_config) as worker:
            worker.iteration += 1
            worker.pull(worker.iteration)                # pending: version 1 does not exist yet
            time.sleep(0.2)
            with socket.create_connection(("127.0.0.1", server.port), timeout=4) as extra:
                dial_handshake(extra, "server", secret=SECRET.encode(), job_id=0, my_id=0, class_index=2)
                extra.sendall(b"FUZZ" + bytes(40))          # bad magic: the server cuts this connection
                assert extra.recv(100) == b""
            time.sleep(0.2)
            worker.iteration -= 1
            worker.push([torch.ones(8)])
            worker.iteration += 1
            worker.wait_all()                            # answered by the PULL sent before the cut
        assert torch.equal(local[0], torch.full((8,), -1.0))
    finally:
        server.close()


STALL_TIMEOUT = 1.5    # the server's transport timeout in the test below: short, to time the cuts


def _spare(port: int, worker_id: int, class_index: int = 2) -> socket.socket:
    """An authenticated connection under `worker_id` on a class the server has and the workers skip."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    dial_handshake(sock, "server", secret=SECRET.encode(), job_id=0, my_id=worker_id,
                   class_index=class_index)
    return sock


def _seconds_until_cut(sock: socket.socket, sent: float) -> float:
    """How long after `sent` the server closed `sock` (it sends nothing on a spare connection)."""
    assert sock.recv(100) == b""
    return time.monotonic() - sent


def test_bad_spare_connections_cost_only_themselves_and_stalls_are_cut_on_time():
    """Both workers joined and train, every step checked exactly, under a live serve_job. A peer that
    authenticates as each joined worker on a spare class connection sends a malformed frame there, then
    stops in the middle of a header, of a continuation header and of a PLAN frame's payload (8 of its 32
    bytes). Each connection is cut -- a stall within 1.2 x the server's timeout of its last byte -- and
    nothing else: the workers go on training exactly and serve_job ends normally when they leave."""
    workers_config = TransportConfig(secret=SECRET, timeout=10, policy="geryon")
    config = TransportConfig(secret=SECRET, timeout=STALL_TIMEOUT, policy="geryon",
                             class_dscp=(46, 10, 0, 0, 0))    # classes 2-4: spare, one per kind of stall
    params = [torch.zeros(16), torch.zeros(1000)]
    server = ParameterServer(0, 1, 2, params, config, ("127.0.0.1", 0), lr=0.5)
    served, outcome = threading.Thread(target=lambda: outcome.append(server.serve_job()), daemon=True), []
    address = ("127.0.0.1", server.port)
    workers = [PSWorker(i, 2, [address], [p.clone() for p in params], workers_config) for i in range(2)]
    reference = [p.clone() for p in params]
    steps = [0]

    def step() -> None:
        step_workers_exactly(workers, reference, 1.0 + steps[0] % 7, lr=0.5, step=steps[0])
        steps[0] += 1

    plan = encode_control(Kind.PLAN, bytes(32), job_id=0)
    stalls = {"header": plan[:20], "continuation header": b"G+\0", "payload": plan[:44 + 8]}
    spare_class = {where: 2 + n for n, where in enumerate(stalls)}
    try:
        served.start()
        step()
        for worker_id in (0, 1):                      # a malformed frame under each joined worker's id
            with _spare(server.port, worker_id) as sock:
                sent = time.monotonic()
                sock.sendall(b"\xee" * 44)
                assert _seconds_until_cut(sock, sent) < 1.0
        step()
        cuts = {}

        def stall(worker_id: int, where: str) -> None:
            with _spare(server.port, worker_id, spare_class[where]) as sock:
                sock.sendall(stalls[where])
                cuts[worker_id, where] = _seconds_until_cut(sock, time.monotonic())

        stallers = [threading.Thread(target=stall, args=(w, where), daemon=True)
                    for w in (0, 1) for where in stalls]
        for thread in stallers:
            thread.start()
        while any(thread.is_alive() for thread in stallers):
            step()                                    # training goes on beside the stalled connections
        assert len(cuts) == 6, cuts
        for (worker_id, where), seconds in cuts.items():
            assert 0.9 * STALL_TIMEOUT <= seconds <= 1.2 * STALL_TIMEOUT, (worker_id, where, seconds)
        for _ in range(3):
            step()
        assert served.is_alive() and server.failure is None and not server.workers_gone()
        for worker in workers:
            worker.close()
        served.join(10)
        assert outcome == [None] and not server.pool.lost()   # every worker left; none was lost
    finally:
        for worker in workers:
            worker.close()
        server.close()
