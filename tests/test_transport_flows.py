"""FlowPool lifecycle: closing a pool stops its accept thread (loopback only)."""

import threading

from geryon.transport.config import TransportConfig
from geryon.transport.flows import FlowPool


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
