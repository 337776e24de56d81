"""Fuzzing at volume: generated frames against a live parameter server while two workers train exactly.

Phase 1 (post-authentication): before worker 1 joins, clients that know the secret authenticate under
its id and send a malformed frame, a stray BYE or a hostile PULL, while worker 0 keeps pulling. Phase 2
(pre-authentication): both workers train step after step, each step checked against the exact value,
while fuzzing threads from four source addresses send generated frames on fresh connections. Memory and
thread counts are sampled: they must stay bounded. GERYON_FUZZ_FRAMES sets the total (default 6000 for
CI; `GERYON_FUZZ_FRAMES=100000 python -m pytest tests/test_fuzz_volume.py` is the documented run).
"""

import os
import random
import socket
import threading

import torch

from geryon.errors import GeryonError
from geryon.transport.config import TransportConfig
from geryon.transport.handshake import dial_handshake
from geryon.transport.ps import ParameterServer, PSWorker
from geryon.transport.wire import HEADER, MAGIC, PROTOCOL_VERSION, Kind, encode_control

SECRET = "volume-secret"
FRAMES = int(os.environ.get("GERYON_FUZZ_FRAMES", "6000"))
POST_AUTH_SHARE = 0.05


def _header(rng: random.Random, kind: int) -> bytes:
    fields = dict(magic=MAGIC, version=PROTOCOL_VERSION, kind=kind, dtype=1, priority=0, job=0,
                  iteration=0, tensor=0, offset=0, length=16, payload=64)
    mutation = rng.randrange(10)
    if mutation == 0:
        fields["magic"] = rng.randbytes(4)
    elif mutation == 1:
        fields["version"] = rng.randrange(256)
    elif mutation == 2:
        fields["kind"] = rng.randrange(256)
    elif mutation == 3:
        fields["dtype"] = rng.randrange(256)
    elif mutation == 4:
        fields["priority"] = rng.randrange(256)
    elif mutation == 5:
        fields["job"] = rng.randrange(1, 2**32)
    elif mutation == 6:
        n = rng.randrange(2**31, 2**62)
        fields["length"], fields["payload"] = n, 4 * n
    elif mutation == 7:
        fields["tensor"] = rng.randrange(2**32)
    elif mutation == 8:
        fields["offset"] = rng.randrange(2**63)
    else:
        fields["payload"] = rng.randrange(2**63)
    return HEADER.pack(*fields.values())


def generated_frame(rng: random.Random) -> bytes:
    """One hostile frame: random bytes, a truncated or mutated header, or a header with a short payload."""
    choice = rng.randrange(5)
    if choice == 0:
        return rng.randbytes(rng.randrange(1, 120))
    kind = rng.choice([int(k) for k in Kind] + [0, 99, 255])
    frame = _header(rng, kind)
    if choice == 1:
        return frame[:rng.randrange(1, len(frame))]
    if choice == 2:
        return frame + rng.randbytes(rng.randrange(0, 80))
    return frame


def _send(address, source, frame: bytes, authenticate_as=None, wait_close: bool = True) -> None:
    """Send `frame` on a fresh connection; with `wait_close`, wait (briefly) for the server to close it."""
    try:
        with socket.create_connection(address, timeout=5, source_address=(source, 0)) as sock:
            if authenticate_as is not None:
                dial_handshake(sock, "server", secret=SECRET.encode(), job_id=0, my_id=authenticate_as,
                               class_index=0)
            sock.sendall(frame)
            sock.shutdown(socket.SHUT_WR)
            if wait_close:
                sock.settimeout(2)
                while sock.recv(4096):
                    pass
    except (OSError, GeryonError):
        pass


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_generated_frames_at_volume_while_workers_train_exactly():
    config = TransportConfig(secret=SECRET, timeout=10, policy="vanilla")
    params = [torch.zeros(16), torch.zeros(1000)]
    server = ParameterServer(0, 1, 2, params, config, ("127.0.0.1", 0), lr=0.5)
    address = ("127.0.0.1", server.port)
    rng = random.Random(1313)
    sent = 0
    try:
        worker0 = PSWorker(0, 2, [address], [p.clone() for p in params], config)
        # phase 1: authenticated garbage under worker 1's id, before worker 1 joins
        post_auth = int(FRAMES * POST_AUTH_SHARE)
        for n in range(post_auth):
            bye = n % 3 == 0
            if bye:
                frame = encode_control(Kind.BYE, b"", job_id=0)
            elif n % 3 == 1:
                frame = encode_control(Kind.PULL, b"", job_id=0, iteration=rng.randrange(4))
            else:
                frame = generated_frame(rng)
            _send(address, "127.0.0.1", frame, authenticate_as=1, wait_close=not bye)
            sent += 1
            if n % 50 == 0:
                worker0.pull(0)
                worker0.wait_all()
        worker1 = PSWorker(1, 2, [address], [p.clone() for p in params], config)
        threads_before, rss_before = threading.active_count(), _rss()

        # phase 2: unauthenticated generated frames from four sources while both workers train
        remaining = FRAMES - sent
        counts = [0] * 4
        stop = threading.Event()

        def fuzz(index: int) -> None:
            local = random.Random(index)
            source = f"127.0.2.{index + 1}"
            while counts[index] < remaining // 4 and not stop.is_set():
                _send(address, source, generated_frame(local))
                counts[index] += 1

        fuzzers = [threading.Thread(target=fuzz, args=(i,), daemon=True) for i in range(4)]
        for thread in fuzzers:
            thread.start()
        steps = 0
        samples = []
        reference = [p.clone() for p in params]
        while any(t.is_alive() for t in fuzzers) or steps < 3:
            grad = 1.0 + steps % 7
            for worker in (worker0, worker1):
                worker.push([torch.full((16,), grad), torch.full((1000,), grad)])
            for worker in (worker0, worker1):
                worker.iteration += 1
                worker.pull(worker.iteration)
            for worker in (worker0, worker1):
                worker.wait_all()
            steps += 1
            for ref in reference:      # the SGD step the server takes, in the same float32 arithmetic
                ref.add_(torch.full_like(ref, grad), alpha=-0.5)
            for worker in (worker0, worker1):
                assert torch.equal(worker.params[0], reference[0])
                assert torch.equal(worker.params[1], reference[1])
            samples.append((threading.active_count(), _rss()))
        stop.set()
        sent += sum(counts)
        assert sent >= FRAMES * 0.99, sent
        assert steps >= 3
        peak_threads = max(s[0] for s in samples)
        assert peak_threads - threads_before < 64 + 8, f"{peak_threads} threads (from {threads_before})"
        assert max(s[1] for s in samples) - rss_before < 128 << 20
        worker0.close()
        worker1.close()
        print(f"{sent} frames, {steps} exact steps, peak {peak_threads} threads")
    finally:
        server.close()
