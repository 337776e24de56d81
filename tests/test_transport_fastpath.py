"""The transport's fast paths keep their meaning: kernel-timeout sockets (blocking, SO_RCVTIMEO/SO_SNDTIMEO,
MSG_WAITALL) report stalls as before, and the piecewise reductions equal torch's whole-tensor ops bit for bit."""

import socket
import threading
import time

import pytest
import torch

from geryon.errors import PeerTimeout
from geryon.transport import elementwise
from geryon.transport.socketio import read_exact_into, timeout_of, use_kernel_timeouts, write_all


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_kernel_timeouts_make_a_plain_socket_blocking(pair):
    a, _ = pair
    assert use_kernel_timeouts(a, 2.5)
    assert a.gettimeout() is None and timeout_of(a) == pytest.approx(2.5, abs=0.01)


def test_a_frame_arriving_in_pieces_is_read_whole(pair):
    a, b = pair
    use_kernel_timeouts(a, 5.0)
    payload = bytes(range(256)) * 1024

    def trickle():
        for start in range(0, len(payload), 10000):
            b.sendall(payload[start:start + 10000])
            time.sleep(0.002)

    thread = threading.Thread(target=trickle)
    thread.start()
    buffer = bytearray(len(payload))
    read_exact_into(a, memoryview(buffer), "peer")
    thread.join()
    assert bytes(buffer) == payload


@pytest.mark.timing
def test_a_peer_stalling_mid_frame_is_named_with_the_timeout(pair):
    a, b = pair
    use_kernel_timeouts(a, 0.3)
    b.sendall(b"x" * 100)
    started = time.monotonic()
    with pytest.raises(PeerTimeout, match="rank 7 sent nothing for 0.3 s in the middle of a frame"):
        read_exact_into(a, memoryview(bytearray(1000)), "rank 7")
    assert 0.25 < time.monotonic() - started < 3


def test_a_peer_that_stops_reading_is_named_with_the_timeout(pair):
    a, _ = pair
    use_kernel_timeouts(a, 0.3)
    with pytest.raises(PeerTimeout, match="rank 3 accepted no data for 0.3 s"):
        write_all(a, [b"h" * 44, bytearray(64 << 20)], "rank 3")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32])
@pytest.mark.parametrize("numel", [1, elementwise.GRAIN - 1, elementwise.GRAIN, elementwise.GRAIN + 1,
                                   3 * elementwise.GRAIN + 17])
def test_piecewise_ops_equal_the_whole_tensor_ops(dtype, numel):
    generator = torch.Generator().manual_seed(numel)
    sources = [(torch.randn(numel, generator=generator) * 100).to(dtype) for _ in range(4)]
    assert torch.equal(elementwise.add_(sources[0].clone(), sources[1]), sources[0].clone().add_(sources[1]))
    assert torch.equal(elementwise.copy_(torch.empty_like(sources[0]), sources[2]), sources[2])
    if dtype.is_floating_point:
        assert torch.equal(elementwise.div_(sources[0].clone(), 3), sources[0].clone().div_(3))
        whole = sources[0].clone()
        for other in sources[1:]:
            whole.add_(other)
        assert torch.equal(elementwise.mean_(torch.empty_like(sources[0]), sources), whole.div_(4))


def test_rto_floor_is_set_where_the_kernel_has_it_and_validated():
    from geryon.errors import ConfigError
    from geryon.transport.config import TransportConfig
    from geryon.transport.flows import TCP_RTO_MIN_US, apply_socket_options

    with pytest.raises(ConfigError, match="rto_min_us"):
        TransportConfig(secret="s", rto_min_us=1000)
    with socket.socket() as sock:
        apply_socket_options(sock, [], rto_min_us=TransportConfig(secret="s").rto_min_us)
        try:
            floor = sock.getsockopt(socket.IPPROTO_TCP, TCP_RTO_MIN_US)
        except OSError:
            pytest.skip("kernel before 6.15: no TCP_RTO_MIN_US")
        assert floor < 50_000          # the kernel rounds up to its tick; the default is 200 ms
