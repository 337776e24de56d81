"""FlowPool lifecycle and per-class thread scheduling (loopback only)."""

import os
import socket
import subprocess
import sys
import threading

import pytest

from geryon.errors import ConfigError
from geryon.transport.config import DEFAULT_RTO_MAX_MS, TransportConfig
from geryon.transport.flows import TCP_RTO_MAX_MS, FlowPool, cap_retransmission_backoff, tcp_sockets
from transport_support import free_ports


class _NoFrames:
    """A handler for pools that never receive data frames in these tests."""

    def control(self, flow, header, payload):
        pass

    def destination(self, flow, header):
        raise AssertionError("no data frames expected")

    def delivered(self, flow, header):
        pass


def _accept_threads(my_id: int) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"gy-accept-{my_id}" and t.is_alive()]


def test_close_leaves_no_accept_thread():
    config = TransportConfig(secret="flows-test", timeout=5.0)
    pools = [FlowPool(7301 + i, config, _NoFrames(), listen=("127.0.0.1", 0)) for i in range(3)]
    try:
        assert all(_accept_threads(pool.my_id) for pool in pools)
    finally:
        for pool in pools:
            pool.close()
    assert [t.name for pool in pools for t in _accept_threads(pool.my_id)] == []


def test_close_with_connected_peer_leaves_no_accept_thread():
    config = TransportConfig(secret="flows-test", timeout=5.0)
    listener = FlowPool(7311, config, _NoFrames(), listen=("127.0.0.1", 0))
    dialer = FlowPool(7312, config, _NoFrames(), listen=None)
    try:
        dialer.connect(7311, ("127.0.0.1", listener.port))
        listener.wait_connected([7312])
    finally:
        dialer.close()
        listener.close()
    assert _accept_threads(7311) == []


def _per_flow_thread(config, ports, read) -> dict:
    """{flow index: {read(native thread id)}} over both pools' send/receive threads, once connected."""
    import time

    listener = FlowPool(ports[0], config, _NoFrames(), listen=("127.0.0.1", 0))
    dialer = FlowPool(ports[1], config, _NoFrames(), listen=None)
    try:
        dialer.connect(ports[0], ("127.0.0.1", listener.port))
        listener.wait_connected([ports[1]])
        time.sleep(0.2)                       # the flows' threads set their scheduling as they start
        seen = {}
        for thread in threading.enumerate():
            if thread.name.startswith(("gy-send-", "gy-recv-")) and thread.native_id:
                flow = int(thread.name.rsplit("flow ", 1)[1].rstrip(")"))
                seen.setdefault(flow, set()).add(read(thread.native_id))
        return seen
    finally:
        dialer.close()
        listener.close()


def test_less_urgent_classes_run_their_threads_nicer():
    """class_thread_nice: the threads of flow index c run c x N nicer than the process; flow 0's keep
    the process's niceness (CPU goes to the urgent class first where the CPU is contended)."""
    import os

    config = TransportConfig(secret="flows-test", timeout=5.0, policy="geryon", class_dscp=(46, 10, 0),
                             class_thread_nice=3)
    base = os.getpriority(os.PRIO_PROCESS, 0)
    nice = _per_flow_thread(config, (7321, 7322), lambda tid: os.getpriority(os.PRIO_PROCESS, tid))
    assert nice == {0: {base}, 1: {min(19, base + 3)}, 2: {min(19, base + 6)}}


def test_flow_threads_run_real_time_the_urgent_class_highest():
    """thread_rt_priority P: flow c's send and receive threads run SCHED_RR at max(1, P - c), so the
    urgent class preempts the others; class_thread_nice does not apply to real-time threads."""
    import os

    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except OSError as exc:
        pytest.skip(f"real-time scheduling is refused here ({exc}): it needs CAP_SYS_NICE")
    config = TransportConfig(secret="flows-test", timeout=5.0, policy="geryon", class_dscp=(46, 10, 8, 0),
                             thread_rt_priority=3, class_thread_nice=5)
    seen = _per_flow_thread(config, (7331, 7332), lambda tid: (os.sched_getscheduler(tid),
                                                               os.sched_getparam(tid).sched_priority))
    assert seen == {0: {(os.SCHED_RR, 3)}, 1: {(os.SCHED_RR, 2)}, 2: {(os.SCHED_RR, 1)}, 3: {(os.SCHED_RR, 1)}}


def test_an_rt_priority_outside_1_to_99_is_refused():
    with pytest.raises(ConfigError, match="thread_rt_priority"):
        TransportConfig(secret="flows-test", thread_rt_priority=100)


class _Sink(_NoFrames):
    """Takes `expected` data frames of one size into one buffer and says when the last has landed."""

    def __init__(self, size: int, expected: int):
        self.buffer, self.expected, self.received = bytearray(size), expected, 0
        self.done = threading.Event()

    def destination(self, flow, header):
        return memoryview(self.buffer)[:header.payload_len]

    def delivered(self, flow, header):
        self.received += 1
        if self.received == self.expected:
            self.done.set()


def _sleeps(native_id: int) -> int:
    """How many times a thread of this process has slept (its voluntary context switches)."""
    with open(f"/proc/self/task/{native_id}/status") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc")


@pytest.mark.timing
def test_the_receive_thread_of_a_sending_connection_sleeps_through_its_acks():
    """A connection that only sends: its receive thread waits for readable data in poll(), so it sleeps
    through the ACKs that free send buffer (a thread blocked in recv() shares the socket's wait queue
    with the writer and would wake for each: 34 times here before the change), and it still ends
    when the pool closes."""
    import torch

    from geryon.transport.wire import Kind, dtype_code, encode_header

    config = TransportConfig(secret="flows-test", timeout=5.0)
    piece, count = 256 * 1024, 400
    sink = _Sink(piece, count)
    listener = FlowPool(7341, config, sink, listen=("127.0.0.1", 0))
    dialer = FlowPool(7342, config, _NoFrames(), listen=None)
    try:
        dialer.connect(7341, ("127.0.0.1", listener.port))
        listener.wait_connected([7342])
        flow = dialer.flow(7341, 0)
        reader = next(t for t in threading.enumerate() if t.name == f"gy-recv-{flow.name}")
        before = _sleeps(reader.native_id)
        header = encode_header(Kind.REDUCE, job_id=config.job_id, length=piece, dtype=dtype_code(torch.uint8))
        payload = memoryview(bytes(range(256)) * (piece // 256))
        for index in range(count):
            flow.send((index,), header, payload)
        assert sink.done.wait(30), f"{sink.received} of {count} frames arrived"
        woke = _sleeps(reader.native_id) - before
        assert sink.buffer == payload
        assert woke <= 3, f"the idle receive thread woke {woke} times while {count} frames left"
    finally:
        dialer.close()
        listener.close()
    reader.join(5)
    assert not reader.is_alive(), "closing the pool did not end the receive thread waiting in poll()"


def _rto_max_ms(sock) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, TCP_RTO_MAX_MS)


def test_cap_retransmission_backoff_caps_the_sockets_opened_since_and_leaks_nothing():
    """Sockets open before the snapshot (a user's own) keep their setting; those opened after get the cap."""
    listener = socket.create_server(("127.0.0.1", 0))
    old = socket.create_connection(listener.getsockname())
    try:
        default = _rto_max_ms(old)
    except OSError:
        pytest.skip("this kernel has no TCP_RTO_MAX_MS (Linux < 6.15)")
    before = tcp_sockets()
    descriptors = len(os.listdir("/proc/self/fd"))
    new = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    try:
        assert default != 1000
        assert cap_retransmission_backoff(1000, skip=before) == 2      # `new` and its accepted end
        assert (_rto_max_ms(new), _rto_max_ms(accepted)) == (1000, 1000)
        assert (_rto_max_ms(old), _rto_max_ms(listener)) == (default, default)
        assert len(os.listdir("/proc/self/fd")) == descriptors + 2    # no duplicate left open
    finally:
        for sock in (listener, old, new, accepted):
            sock.close()


_GLOO_RANK = """
import os, socket, stat
import geryon, torch.distributed as dist
geryon.init()
store = int(os.environ["MASTER_PORT"])
settings = set()
for name in os.listdir("/proc/self/fd"):                 # gloo's pairs: every TCP connection but the store's
    try:
        if not stat.S_ISSOCK(os.fstat(int(name)).st_mode):
            continue
        sock = socket.socket(fileno=os.dup(int(name)))
    except OSError:
        continue
    with sock:
        try:
            ports = (sock.getsockname()[1], sock.getpeername()[1])
        except OSError:
            continue                                     # a listener
        if sock.type == socket.SOCK_STREAM and store not in ports:
            settings.add(sock.getsockopt(socket.IPPROTO_TCP, 44))
print(sorted(settings))
dist.destroy_process_group()
"""


def test_init_caps_the_retransmission_backoff_of_gloo_connections():
    """geryon.init() under plain torchrun variables: gloo's connections between the ranks resume within
    1 s after an outage, like geryon's flows (the emulated flapping test once stalled on one backed off
    to 6.6 s)."""
    probe = socket.socket()
    try:
        probe.getsockopt(socket.IPPROTO_TCP, TCP_RTO_MAX_MS)
    except OSError:
        pytest.skip("this kernel has no TCP_RTO_MAX_MS (Linux < 6.15)")
    finally:
        probe.close()
    port = free_ports(1)[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GERYON_")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2")
    ranks = [subprocess.Popen([sys.executable, "-c", _GLOO_RANK], env={**env, "RANK": str(r)}, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in (0, 1)]
    outputs = [rank.communicate(timeout=120) for rank in ranks]
    for rank, (out, err) in zip(ranks, outputs):
        assert rank.returncode == 0, err[-2000:]
        assert out.split("\n")[-2] == f"[{DEFAULT_RTO_MAX_MS}]", out
