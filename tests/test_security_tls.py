"""--tls: encrypted data flows with per-job credentials, mutual certificate checks, same training.

A TLS job trains exactly like a plain one; a peer without the job's certificate (another job's, none at
all, or no TLS) is refused with an error that says so; a capture of the wire shows none of the tensor's
bytes; the launcher's credentials file is private (0600 in a 0700 directory) and gone after the job.
"""

import json
import os
import re
import signal
import socket
import ssl
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from launch_support import EXAMPLE, EXAMPLE_ARGS, json_records, loss_curve, rank_lines, run_launcher
from test_launch_ssh import loopback_sshd  # noqa: F401 -- a fixture
from transport_support import serve_world_of_threads

from geryon.errors import AuthenticationError
from geryon.launch.config import LaunchConfig
from geryon.launch.credentials import job_credentials
from geryon.launch.ssh_run import remote_command
from geryon.transport import TransportConfig
from geryon.transport.flows import FlowPool
from geryon.transport.tls import TlsCredentials, generate_credentials

JOB = generate_credentials("test job")
TESTS = Path(__file__).resolve().parent


class _Idle:
    def destination(self, flow, header):
        raise AssertionError("no data expected")

    def delivered(self, flow, header):
        pass

    def control(self, flow, header, payload):
        pass


def _config(tls, **extra) -> TransportConfig:
    return TransportConfig(secret="shared secret", tls=tls, timeout=5, **extra)


def _dial(listener_tls, dialer_tls) -> tuple[float, FlowPool]:
    """Dial a listening pool; returns (seconds taken, the listener) -- raises what connect raises."""
    server = FlowPool(1, _config(listener_tls), _Idle(), listen=("127.0.0.1", 0))
    client = FlowPool(0, _config(dialer_tls), _Idle(), listen=None)
    start = time.monotonic()
    try:
        client.connect(1, ("127.0.0.1", server.port))
        return time.monotonic() - start, server
    finally:
        client.close()
        server.close()


def test_credentials_are_fresh_per_job_and_travel_as_one_line():
    other = generate_credentials("test job")
    assert other.pem != JOB.pem
    line = JOB.encoded()
    assert "\n" not in line and TlsCredentials.decode(line) == JOB
    assert "PRIVATE KEY" not in repr(_config(JOB))


def test_tls_allreduce_equals_plain():
    def body(group):
        generator = torch.Generator().manual_seed(group.rank)
        tensors = [torch.randn(300_000, generator=generator), torch.randn(1000, generator=generator)]
        group.allreduce(tensors)
        return tensors

    plain = serve_world_of_threads(3, _config(None), body)
    secure = serve_world_of_threads(3, _config(JOB), body)
    for a, b in zip(plain, secure):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.timing
def test_both_sides_with_the_job_certificate_connect():
    seconds, server = _dial(JOB, JOB)
    assert seconds < 2


@pytest.mark.timing
@pytest.mark.parametrize("dialer", ["another job's certificate", "no TLS"])
def test_a_peer_without_the_job_certificate_is_refused_at_once(dialer):
    dialer_tls = generate_credentials("another job") if dialer != "no TLS" else None
    start = time.monotonic()
    with pytest.raises(AuthenticationError, match="TLS") as caught:
        _dial(JOB, dialer_tls)
    assert time.monotonic() - start < 3, "refused only after retrying until the timeout"
    assert "certificate" in str(caught.value) or "--tls" in str(caught.value)


def test_a_tls_dialer_refuses_a_plain_listener():
    with pytest.raises(AuthenticationError, match="TLS .*certificate"):
        _dial(None, JOB)


def test_a_tls_client_without_a_certificate_gets_nothing():
    """A client that does TLS but has no certificate (e.g. `openssl s_client`) is refused, and the
    listener admits nothing from it."""
    server = FlowPool(1, _config(JOB), _Idle(), listen=("127.0.0.1", 0))
    try:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
            with context.wrap_socket(raw) as tls:
                with pytest.raises((ssl.SSLError, ConnectionError)):
                    tls.sendall(b"GYTR" + bytes(40))
                    if not tls.recv(100):
                        raise ConnectionError("closed")
        assert not server.flows
    finally:
        server.close()


def test_launcher_credentials_are_private_and_removed(tmp_path):
    config = LaunchConfig(script=str(EXAMPLE), tls=True)
    with job_credentials(config) as job:
        path = Path(job.tls_file)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert TlsCredentials(path.read_text()).pem.count("BEGIN") == 2
    assert not path.exists() and not path.parent.exists()
    with job_credentials(LaunchConfig(script=str(EXAMPLE))) as plain:
        assert plain.tls_file is None


def test_ssh_credentials_travel_on_stdin_not_the_command_line():
    line = remote_command(["python", "x.py"], {"A": "1"}, "/tmp", tls=True)
    assert "GERYON_TLS_CREDENTIALS ||" in line and "PRIVATE" not in line
    with pytest.raises(Exception, match="stdin"):
        remote_command(["python", "x.py"], {"GERYON_TLS_CREDENTIALS": JOB.encoded()}, "/tmp", tls=True)


@pytest.mark.slow
def test_local_tls_allreduce_job_follows_the_single_process_curve(single_curve):
    result = run_launcher("--local", "--tls", "--workers", "2", "--mode", "allreduce", EXAMPLE, *EXAMPLE_ARGS)
    assert result.returncode == 0, result.stderr[-3000:]
    assert ", TLS" in result.stderr
    assert loss_curve(json_records(rank_lines(result.stdout, "worker0"))) == pytest.approx(
        single_curve, rel=1e-4, abs=1e-5)


@pytest.mark.root
@pytest.mark.slow
def test_emulated_tls_ps_job_trains_exactly_like_a_plain_one():
    curves = []
    for extra in ([], ["--tls"]):
        result = run_launcher("--emulate", "--bw", "1gbit", "--workers", "2", "--mode", "ps", "--servers", "1",
                              *extra, EXAMPLE, *EXAMPLE_ARGS)
        assert result.returncode == 0, result.stderr[-3000:]
        curves.append(loss_curve(json_records(rank_lines(result.stdout, "worker0"))))
    assert len(curves[0]) == 20 and curves[1] == curves[0]      # bit for bit
    assert any("TLS)" in line for line in rank_lines(result.stdout, "server0"))


@pytest.mark.root
@pytest.mark.slow
def test_ssh_tls_job_gets_its_credentials_on_stdin(loopback_sshd, single_curve):      # noqa: F811
    keys, port = loopback_sshd
    hostfile = keys.folder / "hostfile"
    hostfile.write_text(f"127.0.0.1:{port} slots=2 key={keys.folder / 'client'} iface=lo\n")
    known = keys.known_hosts([("127.0.0.1", port)])
    result = run_launcher("--hostfile", hostfile, "--known-hosts", known, "--mode", "ps", "--tls", EXAMPLE,
                          *EXAMPLE_ARGS)
    assert result.returncode == 0, result.stderr[-3000:]
    assert any("TLS)" in line for line in rank_lines(result.stdout, "server0")), result.stdout[-2000:]
    assert loss_curve(json_records(rank_lines(result.stdout, "worker0"))) == pytest.approx(
        single_curve, rel=1e-4, abs=1e-5)


# -- the wire ---------------------------------------------------------------------------------------
CAPTURED_JOB = """
import sys, torch
sys.path.insert(0, {tests!r})
from transport_support import serve_world_of_threads
from geryon.transport import TransportConfig
from geryon.transport.tls import load_credentials
tls = load_credentials(sys.argv[1]) if len(sys.argv) > 1 else None
payload = torch.load({payload!r})
def body(group):
    tensor = payload.clone() if group.rank == 0 else torch.zeros_like(payload)
    group.allreduce([tensor])
    assert torch.equal(tensor, payload)
serve_world_of_threads(2, TransportConfig(secret="s", tls=tls, timeout=20), body)
print("done")
"""


def _captured(netns: str, tmp_path: Path, name: str, credentials: Path | None) -> bytes:
    """Run a 2-rank allreduce inside `netns` while tcpdump records its loopback; the capture's bytes."""
    capture = tmp_path / f"{name}.pcap"
    # -B 65536: a 64 MiB kernel buffer holds the whole run (~4 MiB), so a loaded machine that does not
    # schedule tcpdump for a while drops nothing (with the default 2 MiB, CI lost half the tensor once)
    tcpdump = subprocess.Popen(["ip", "netns", "exec", netns, "tcpdump", "-i", "lo", "-s", "0", "-U", "-n",
                                "-B", "65536", "-w", str(capture), "tcp"], stderr=subprocess.PIPE, text=True)
    try:
        line = tcpdump.stderr.readline()             # "listening on lo ..." once it captures
        assert "listening" in line, line
        script = tmp_path / f"{name}.py"
        script.write_text(CAPTURED_JOB.format(tests=str(TESTS), payload=str(tmp_path / "payload.pt")))
        argv = ["ip", "netns", "exec", netns, sys.executable, str(script)]
        if credentials is not None:
            argv.append(str(credentials))
        job = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert job.returncode == 0 and "done" in job.stdout, job.stderr[-2000:]
        time.sleep(0.5)
    finally:
        tcpdump.send_signal(signal.SIGINT)
        _, summary = tcpdump.communicate(timeout=10)
    dropped = re.search(r"(\d+) packets? dropped by kernel", summary)
    assert dropped and dropped.group(1) == "0", f"tcpdump lost packets, the capture proves nothing: {summary}"
    return capture.read_bytes()


@pytest.mark.root
def test_a_capture_of_a_tls_job_shows_no_tensor_bytes(unique_name, tmp_path):
    """The control run (no TLS) shows the capture sees the tensor; under TLS no 32-byte piece of it."""
    payload = torch.randn(1 << 18, generator=torch.Generator().manual_seed(5))     # 1 MiB
    torch.save(payload, tmp_path / "payload.pt")
    raw = payload.numpy().tobytes()
    pieces = [raw[i:i + 32] for i in range(0, len(raw) - 32, 4096)]
    credentials = tmp_path / "job.pem"
    credentials.write_text(JOB.pem)
    os.chmod(credentials, 0o600)
    netns = f"gy{unique_name}w"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    try:
        subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True)
        plain = _captured(netns, tmp_path, "plain", None)
        secure = _captured(netns, tmp_path, "tls", credentials)
    finally:
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)
    seen_plain = sum(piece in plain for piece in pieces)
    assert seen_plain > len(pieces) // 2, f"the capture missed the plain run ({seen_plain}/{len(pieces)})"
    assert len(secure) > len(raw), "the TLS run's capture is too short to have carried the tensor"
    assert sum(piece in secure for piece in pieces) == 0


def test_tls_flows_keep_their_dscp_priority_and_notsent_lowat():
    from geryon.transport.flows import TCP_NOTSENT_LOWAT
    from geryon.transport.tls import TlsSocket

    config = _config(JOB)
    server = FlowPool(1, config, _Idle(), listen=("127.0.0.1", 0))
    client = FlowPool(0, config, _Idle(), listen=None)
    try:
        client.connect(1, ("127.0.0.1", server.port))
        server.wait_connected([0], timeout=5)
        for pool, peer in ((client, 1), (server, 0)):
            for index, dscp in enumerate(config.class_dscp):
                sock = pool.flow(peer, index).sock
                assert isinstance(sock, TlsSocket)
                assert sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) == dscp << 2
                assert sock.getsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT) == config.notsent_lowat
    finally:
        client.close()
        server.close()


@pytest.mark.root
@pytest.mark.slow
def test_bench_transport_reports_the_cost_of_tls():
    from launch_support import REPO, clean_env

    result = subprocess.run([sys.executable, "-m", "geryon", "bench", "transport", "--bw", "100mbit", "--size-mb",
                             "1", "--iters", "1", "--tls", "--iperf-seconds", "1", "--json"], cwd=REPO, env=clean_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    records = {r["system"]: r for r in map(json.loads, result.stdout.splitlines()) if "system" in r}
    for system in ("ps", "allreduce"):
        plain, tls = records[system], records[f"{system}-tls"]
        assert "ratio_vs_plain" not in plain and tls["size_bytes"] == plain["size_bytes"]
        # the ratio is TLS's goodput over the plain run's in the same bench, on the same emulated hosts
        assert tls["ratio_vs_plain"] == pytest.approx(tls["goodput_bps"] / plain["goodput_bps"], rel=1e-9)
        assert tls["goodput_bps"] == pytest.approx(tls["size_bytes"] * 8 / tls["seconds"], rel=1e-6)
