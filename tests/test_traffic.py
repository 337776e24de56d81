"""The traffic tool on loopback: sink counts, bulk throughput, burst acknowledgements, socket marks."""

import json
import signal
import socket
import subprocess
import time

import pytest

from geryon.emulate import traffic
from geryon.emulate.traffic import traffic_argv


@pytest.fixture
def sink():
    """A sink on a free loopback port; yields (process, port) and always stops it."""
    process = subprocess.Popen(traffic_argv("sink", "--port", "0", "--bind", "127.0.0.1"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        listening = json.loads(process.stdout.readline())
        assert listening["event"] == "listening"
        yield process, listening["port"]
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


def _stop_sink(process) -> dict:
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=10)
    assert process.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _run(mode: str, *args: str, timeout: float = 30) -> dict:
    done = subprocess.run(traffic_argv(mode, *args), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_bulk_reports_acknowledged_throughput_and_marks(sink):
    process, port = sink
    result = _run("bulk", "127.0.0.1", "--port", str(port), "--duration", "1.0", "--warmup", "0.3",
                  "--dscp", "46", "--congestion", "reno")
    assert result["mode"] == "bulk"
    assert (result["dscp"], result["congestion"]) == (46, "reno")
    assert 0.5 < result["seconds"] < 1.0
    assert 0 < result["bytes"] <= result["bytes_acked"] <= result["bytes_written"] + 2  # + SYN, mode byte
    assert result["throughput_bps"] == pytest.approx(result["bytes"] * 8 / result["seconds"], rel=1e-3)
    counts = _stop_sink(process)
    (connection,) = counts["connections"]
    assert connection["mode"] == "bulk"
    # the sink read at least what was acknowledged (minus the mode byte and SYN) and never more than written
    assert result["bytes_acked"] - 2 <= connection["bytes"] <= result["bytes_written"]


def test_burst_times_each_acknowledged_burst(sink):
    process, port = sink
    result = _run("burst", "127.0.0.1", "--port", str(port), "--bytes", "1000000", "--repeat", "3",
                  "--gap", "0.05", "--dscp", "10", "--priority", "5")
    assert (result["dscp"], result["priority"], result["bytes"]) == (10, 5, 1_000_000)
    assert len(result["times_s"]) == 3 and all(t > 0 for t in result["times_s"])
    assert result["min_s"] == min(result["times_s"])
    assert result["median_s"] == sorted(result["times_s"])[1]
    counts = _stop_sink(process)
    (connection,) = counts["connections"]
    assert connection == {"peer": connection["peer"], "mode": "burst", "bytes": 3_000_000, "bursts": 3}


def test_sink_counts_concurrent_connections(sink):
    process, port = sink
    senders = [subprocess.Popen(traffic_argv("burst", "127.0.0.1", "--port", str(port), "--bytes", str(n)),
                                stdout=subprocess.PIPE, text=True) for n in (100_000, 200_000, 300_000)]
    for sender in senders:
        sender.communicate(timeout=30)
        assert sender.returncode == 0
    counts = _stop_sink(process)
    assert sorted(c["bytes"] for c in counts["connections"]) == [100_000, 200_000, 300_000]
    assert counts["bytes_total"] == 600_000


def test_bulk_stops_on_time_against_a_receiver_that_never_reads():
    """A starved flow (full send buffer) must still end at its deadline and report ~nothing."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        began = time.monotonic()
        sender = subprocess.Popen(traffic_argv("bulk", "127.0.0.1", "--port", str(listener.getsockname()[1]),
                                               "--duration", "1.0", "--warmup", "0.5"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        conn, _ = listener.accept()
        with conn:
            out, err = sender.communicate(timeout=15)
        assert sender.returncode == 0, err
    assert time.monotonic() - began < 8
    result = json.loads(out)
    assert result["bytes"] == 0 and result["throughput_bps"] == 0
    assert result["bytes_written"] > 0  # it filled the buffers, nothing more was acknowledged


def test_start_at_delays_the_first_byte(sink):
    _, port = sink
    start = time.time() + 1.0
    _run("burst", "127.0.0.1", "--port", str(port), "--bytes", "1000", "--start-at", repr(start))
    assert time.time() >= start


def test_sender_socket_carries_dscp_priority_and_congestion(congestion="reno"):
    sock = traffic._sender_socket(dscp=46, priority=3, congestion=congestion)
    with sock:
        assert sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) == 46 << 2
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY) == 3
        assert traffic.socket_marks(sock) == {"dscp": 46, "priority": 3, "congestion": congestion}


@pytest.mark.root
@pytest.mark.parametrize("congestion", ["bbr", "cubic"])
def test_bbr_and_cubic_can_be_chosen_per_socket_as_root(congestion):
    with traffic._sender_socket(dscp=0, priority=None, congestion=congestion) as sock:
        assert traffic.socket_marks(sock)["congestion"] == congestion


def test_unknown_congestion_control_is_a_clear_error():
    done = subprocess.run(traffic_argv("bulk", "127.0.0.1", "--port", "9", "--congestion", "nosuchcc"),
                          capture_output=True, text=True, timeout=30)
    assert done.returncode != 0
    assert "congestion control 'nosuchcc' not available" in done.stderr
