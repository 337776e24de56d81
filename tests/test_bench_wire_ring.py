"""The wire-ring bench role's stream (geryon.bench.transport_roles): each rank sends the bytes its ring
link carries and reads as many, over real sockets; a neighbour that goes away is a clear error."""

import socket
from concurrent.futures import ThreadPoolExecutor

import pytest

from geryon.bench.transport_roles import send_right_receive_left, ring_link_bytes
from geryon.errors import TransportError


def test_a_ring_link_carries_two_n_minus_one_over_n_of_the_data():
    assert ring_link_bytes(100, 2) == 100
    assert ring_link_bytes(10_000_000, 8) == 17_500_000
    assert ring_link_bytes(1_000_000, 3) == 1_333_333


def test_stream_sends_and_reads_exactly_the_count_through_buffers_smaller_than_it():
    right, left = socket.socketpair()     # a ring of one: what this rank sends right comes back from the left
    out = memoryview(bytearray(b"\x07" * 1000))
    inbox = memoryview(bytearray(1000))
    with right, left, ThreadPoolExecutor(1) as pool:
        send_right_receive_left(right, left, 12_345, out, inbox, pool)
        right.setblocking(False)
        left.setblocking(False)
        with pytest.raises(BlockingIOError):
            left.recv(1)                  # nothing beyond the count was sent
    assert bytes(inbox[:10]) == b"\x07" * 10


def test_a_neighbour_that_closes_mid_stream_is_a_transport_error_naming_the_count():
    sender, receiver = socket.socketpair()
    right, far = socket.socketpair()      # our right neighbour: its buffer takes all 10000 bytes
    out, inbox = memoryview(bytearray(4096)), memoryview(bytearray(4096))
    sender.sendall(b"x" * 100)
    sender.close()                        # the left neighbour sent 100 of 10000 bytes, then went away
    with receiver, right, far, ThreadPoolExecutor(1) as pool:
        with pytest.raises(TransportError, match="after 100 of 10000 bytes"):
            send_right_receive_left(right, receiver, 10_000, out, inbox, pool)
