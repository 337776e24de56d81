"""Fuzzing at volume: generated frames against a live parameter server while two workers train exactly.

Phase 1 (post-authentication): before worker 1 joins, clients that know the secret authenticate under
its id and send a malformed frame, a stray BYE or a hostile PULL, while worker 0 keeps pulling. Phase 2
(pre-authentication): both workers train step after step, each step checked against the exact value,
while fuzzing threads from four source addresses send generated frames (continuation headers among
them) on fresh connections. Memory and
thread counts are sampled: they must stay bounded. GERYON_FUZZ_FRAMES sets the total (default 6000 for
CI; `GERYON_FUZZ_FRAMES=100000 python -m pytest tests/test_fuzz_volume.py` is the documented run).
"""

import os
import random
import socket
import threading
import time

import torch
from transport_support import step_workers_exactly

from geryon.errors import GeryonError, ProtocolError
from geryon.transport.config import TransportConfig
from geryon.transport.handshake import dial_handshake
from geryon.transport.ps_server import ParameterServer
from geryon.transport.ps_worker import PSWorker
from geryon.transport.wire import (CONTINUATION, CONTINUATION_TAG, CONTROL_KINDS, HEADER, MAGIC,
                                   PROTOCOL_VERSION, Kind, decode_header, encode_control)

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


def _continuation(rng: random.Random, length: int | None = None) -> bytes:
    """An 8-byte continuation header (wire.CONTINUATION), its reserved field now and then nonzero."""
    if length is None:
        length = rng.choice([rng.randrange(1, 64), rng.randrange(2**32)])
    return CONTINUATION.pack(CONTINUATION_TAG, rng.choice([0, 0, 0, rng.randrange(65536)]), length)


def generated_frame(rng: random.Random) -> bytes:
    """One hostile frame: random bytes, a truncated or mutated header, a header with a short payload, or
    a continuation header, alone or after a header and 64 bytes."""
    choice = rng.randrange(6)
    if choice == 0:
        return rng.randbytes(rng.randrange(1, 120))
    kind = rng.choice([int(k) for k in Kind] + [0, 99, 255])
    frame = _header(rng, kind)
    if choice == 1:
        return frame[:rng.randrange(1, len(frame))]
    if choice == 2:
        return frame + rng.randbytes(rng.randrange(0, 80))
    if choice == 3:
        return _continuation(rng) if rng.randrange(2) else frame + rng.randbytes(64) + _continuation(rng)
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


# -- after the join: an authenticated member's extra connection sends generated frames ----------------
JOINED_FRAMES = int(os.environ.get("GERYON_FUZZ_JOINED_FRAMES", "1500"))
TERMINATOR = b"FUZZ" + bytes(HEADER.size - 4)      # a bad magic: the server closes on it


def joined_fuzz_frame(rng: random.Random, server) -> bytes | None:
    """A generated frame made whole, so that the server rejects it (and closes) or reads it to the end.

    A spare connection that stalls mid-frame costs only itself, but only after the server's timeout; so
    that the fuzzer goes on at once, every frame is completed -- a short header padded, a valid header
    given its whole payload -- and followed by TERMINATOR, which the server cuts at once. ABORT and BYE
    are the protocol's own ways for a member to end the job or leave, not fuzz: None (skipped).
    """
    frame = generated_frame(rng)
    frame += rng.randbytes(max(0, HEADER.size - len(frame)))
    try:
        header = decode_header(frame[:HEADER.size], job_id=0, max_payload=server.config.max_payload,
                               tensor_numel=server.tensor_numel)
    except ProtocolError:
        return frame                                # refused at once
    if header.kind in (Kind.ABORT, Kind.BYE) or header.payload_len > 1 << 16:
        return None
    payload = (frame[HEADER.size:] + rng.randbytes(header.payload_len))[:header.payload_len]
    whole = frame[:HEADER.size] + payload
    if header.kind not in CONTROL_KINDS and rng.randrange(3) == 0:   # continued, completed too
        length = rng.randrange(1, 64)
        whole += _continuation(rng, length) + rng.randbytes(length * header.dtype.itemsize)
    return whole + TERMINATOR


def test_authenticated_fuzzing_after_the_join_leaves_training_exact():
    """Both workers joined and train step after step, checked exactly; meanwhile two clients
    authenticate as worker 0 and worker 1 on a spare class flow (the server has a third class the
    workers do not use) and send generated frames after the handshake, a fresh connection each time
    the server cuts one. GERYON_FUZZ_JOINED_FRAMES sets the total (CI: 1500; the documented full run
    is 100000)."""
    workers_config = TransportConfig(secret=SECRET, timeout=10, policy="geryon")
    config = TransportConfig(secret=SECRET, timeout=10, policy="geryon", class_dscp=(46, 10, 0))
    params = [torch.zeros(16), torch.zeros(1000)]
    server = ParameterServer(0, 1, 2, params, config, ("127.0.0.1", 0), lr=0.5)
    address = ("127.0.0.1", server.port)
    workers = [PSWorker(i, 2, [address], [p.clone() for p in params], workers_config) for i in range(2)]
    reference = [p.clone() for p in params]
    counts, connections, stop = [0, 0], [0, 0], threading.Event()

    def step(number: int) -> None:
        step_workers_exactly(workers, reference, 1.0 + number % 7, lr=0.5)

    def fuzz(member: int) -> None:
        rng = random.Random(100 + member)
        while counts[member] < JOINED_FRAMES // 2 and not stop.is_set():
            try:
                with socket.create_connection(address, timeout=5) as sock:
                    dial_handshake(sock, "server", secret=SECRET.encode(), job_id=0, my_id=member,
                                   class_index=2)
                    connections[member] += 1
                    sock.settimeout(5)
                    while counts[member] < JOINED_FRAMES // 2 and not stop.is_set():
                        frame = joined_fuzz_frame(rng, server)
                        if frame is None:
                            continue
                        sock.sendall(frame)
                        counts[member] += 1
                        if frame.endswith(TERMINATOR) or frame[:4] != MAGIC:
                            while sock.recv(65536):   # the server cuts it: wait for that, then reconnect
                                pass
                            break
            except (OSError, GeryonError):
                time.sleep(0.01)                      # e.g. REJECT while the last cut connection ends

    try:
        step(0)                                       # both joined; PUSHes of iteration 0 are stale now
        fuzzers = [threading.Thread(target=fuzz, args=(m,), daemon=True) for m in (0, 1)]
        for thread in fuzzers:
            thread.start()
        steps, threads_before, rss_before, peak = 1, threading.active_count(), _rss(), (0, 0)
        while any(t.is_alive() for t in fuzzers) or steps < 4:
            step(steps)
            steps += 1
            peak = (max(peak[0], threading.active_count()), max(peak[1], _rss()))
        stop.set()
        assert sum(counts) >= JOINED_FRAMES - 2, counts
        assert server.failure is None                 # nothing ended the job
        assert peak[0] - threads_before < 64 + 8 and peak[1] - rss_before < 128 << 20
        print(f"{sum(counts)} frames after the join on {sum(connections)} authenticated connections, "
              f"{steps} exact steps, peak {peak[0]} threads, +{(peak[1] - rss_before) >> 20} MiB")
    finally:
        stop.set()
        for worker in workers:
            worker.close()
        server.close()
