"""Wire format: round trips, one test per invalid field, hypothesis fuzzing of the decoder, and
continuation headers (sender's choice, receiver's rebuild, and the reader's carried bytes)."""

import socket
import struct

import pytest
import torch
from hypothesis import given, settings, strategies as st

from geryon.errors import ProtocolError
from geryon.transport.socketio import FrameReader
from geryon.transport.wire import (CONTINUATION, CONTINUATION_SIZE, CONTINUATION_TAG, DTYPE_CODES, HEADER,
                                   HEADER_SIZE, MAGIC, PROTOCOL_VERSION, HeaderCompressor, Kind, byte_view,
                                   continues, decode_continuation, decode_header, encode_continuation,
                                   encode_control, encode_header, slice_view)

JOB = 7
NUMEL = {0: 100, 1: 5}


def decode(raw, **kw):
    return decode_header(raw, job_id=JOB, max_payload=1 << 20, tensor_numel=NUMEL.get, **kw)


def test_round_trip_every_dtype():
    for dtype, code in DTYPE_CODES.items():
        raw = encode_header(Kind.PUSH, job_id=JOB, iteration=3, tensor_id=0, offset=10, length=20,
                            dtype=code, priority=1)
        header = decode(raw)
        assert (header.kind, header.dtype, header.offset, header.length, header.priority) == \
            (Kind.PUSH, dtype, 10, 20, 1)
        assert header.payload_len == 20 * dtype.itemsize


def _raw(**fields):
    values = dict(magic=MAGIC, version=PROTOCOL_VERSION, kind=int(Kind.PUSH), dtype=1, priority=0,
                  job=JOB, iteration=0, tensor=0, offset=0, length=4, payload=16)
    values.update(fields)
    return HEADER.pack(*values.values())


@pytest.mark.parametrize("fields, message", [
    (dict(magic=b"HTTP"), "magic"),
    (dict(version=9), "version"),
    (dict(kind=99), "message type"),
    (dict(dtype=42), "dtype"),
    (dict(priority=8), "priority"),
    (dict(job=8), "job id"),
    (dict(payload=15), "does not hold"),
    (dict(length=1 << 40, payload=4 << 40), "exceeds"),
    (dict(tensor=9), "unknown tensor"),
    (dict(offset=98), "outside tensor"),
    (dict(length=0, payload=0), "empty"),
    (dict(kind=int(Kind.PLAN), dtype=7, length=300, payload=300), "control"),
])
def test_each_bad_field_is_named(fields, message):
    with pytest.raises(ProtocolError, match=message):
        decode(_raw(**fields))


def test_truncated_header():
    with pytest.raises(ProtocolError, match="truncated"):
        decode(_raw()[:-1])


def test_control_frames():
    raw = encode_control(Kind.PLAN, b"x" * 32, job_id=JOB, iteration=5)
    header = decode(raw[:HEADER_SIZE])
    assert header.kind == Kind.PLAN and header.payload_len == 32 and header.iteration == 5
    with pytest.raises(ProtocolError):
        encode_control(Kind.PLAN, b"x" * 1000, job_id=JOB)


@settings(max_examples=500, deadline=None)
@given(st.binary(min_size=0, max_size=2 * HEADER_SIZE))
def test_random_bytes_never_crash(raw):
    try:
        header = decode(raw)
    except ProtocolError:
        return
    assert header.payload_len <= 1 << 20


@settings(max_examples=500, deadline=None)
@given(st.integers(0, HEADER_SIZE - 1), st.integers(0, 255))
def test_single_byte_mutations_are_validated(position, value):
    raw = bytearray(_raw())
    raw[position] = value
    try:
        header = decode(bytes(raw))
    except ProtocolError:
        return
    assert header.offset + header.length <= NUMEL[header.tensor_id]
    assert header.payload_len == header.length * header.dtype.itemsize


def test_byte_view_is_zero_copy():
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        tensor = torch.zeros(10, dtype=dtype)
        view = slice_view(tensor, 2, 3)
        assert len(view) == 3 * tensor.element_size()
        source = torch.arange(3).to(dtype)
        view[:] = byte_view(source)
        assert torch.equal(tensor[2:5], source) and tensor[:2].eq(0).all()


def test_header_size_is_documented():
    assert HEADER_SIZE == 44 == struct.calcsize("!4sBBBBIIIQQQ")


# -- continuation headers -------------------------------------------------------------------------

def _data(offset, length, **kw):
    fields = dict(job_id=JOB, iteration=3, tensor_id=0, dtype=1, priority=1)
    fields.update(kw)
    return encode_header(Kind.REDUCE, offset=offset, length=length, **fields)


def test_a_contiguous_slice_of_the_same_tensor_continues_and_decodes_back():
    first, second = _data(0, 10), _data(10, 20)
    assert continues(first, second)
    compact = encode_continuation(second)
    assert len(compact) == CONTINUATION_SIZE == 8
    assert decode_continuation(compact, decode(first), max_payload=1 << 20,
                               tensor_numel=NUMEL.get) == decode(second)


@pytest.mark.parametrize("second", [
    _data(11, 5),                    # a gap
    _data(0, 10),                    # the same slice again
    _data(10, 5, iteration=4),       # the next collective
    _data(10, 5, tensor_id=1),       # another tensor
    _data(10, 5, priority=0),        # another class
    _data(10, 5, dtype=2),           # another dtype
    encode_header(Kind.GATHER, job_id=JOB, iteration=3, tensor_id=0, offset=10, length=5, priority=1),
])
def test_anything_else_takes_the_full_header(second):
    assert not continues(_data(0, 10), second)


def test_the_compressor_writes_continuations_and_lets_control_frames_through():
    compressor = HeaderCompressor()
    plan = encode_control(Kind.PLAN, b"x" * 4, job_id=JOB)
    wire = [compressor.wire_header(h) for h in (_data(0, 10), plan, _data(10, 20), _data(40, 5), _data(45, 5))]
    assert [len(w) for w in wire] == [HEADER_SIZE, len(plan), 8, HEADER_SIZE, 8]
    assert wire[1] == plan                       # a control frame passes, and breaks no chain
    assert [len(HeaderCompressor(False).wire_header(_data(o, 5))) for o in (0, 5)] == [HEADER_SIZE] * 2


@pytest.mark.parametrize("raw, previous, message", [
    (CONTINUATION.pack(CONTINUATION_TAG, 0, 5), None, "no data frame before it"),
    (CONTINUATION.pack(CONTINUATION_TAG, 1, 5), "prev", "malformed"),
    (CONTINUATION.pack(CONTINUATION_TAG, 0, 0), "prev", "empty"),
    (CONTINUATION.pack(CONTINUATION_TAG, 0, 91), "prev", "outside tensor"),
    (CONTINUATION.pack(CONTINUATION_TAG, 0, 1 << 30), "prev", "exceeds"),
    (CONTINUATION.pack(CONTINUATION_TAG, 0, 5)[:7], "prev", "truncated"),
])
def test_each_bad_continuation_is_named(raw, previous, message):
    previous = decode(_data(0, 10)) if previous else None
    with pytest.raises(ProtocolError, match=message):
        decode_continuation(raw, previous, max_payload=1 << 20, tensor_numel=NUMEL.get)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=CONTINUATION_SIZE, max_size=CONTINUATION_SIZE))
def test_random_continuations_never_escape_the_tensor(raw):
    try:
        header = decode_continuation(raw, decode(_data(0, 10)), max_payload=1 << 20, tensor_numel=NUMEL.get)
    except ProtocolError:
        return
    assert header.offset == 10 and header.offset + header.length <= NUMEL[0]


def _reader_pair():
    left, right = socket.socketpair()
    right.settimeout(5)
    return left, right, FrameReader(right, "peer", job_id=JOB, max_payload=1 << 20, tensor_numel={0: 1000}.get)


def test_the_reader_carries_bytes_read_past_a_continuation_into_payloads_and_the_next_header():
    """Frames with 1-element payloads: a 44-byte read past an 8-byte header takes the payload and
    most of the next headers; every byte still lands where it belongs."""
    left, right, frames = _reader_pair()
    compressor = HeaderCompressor()
    values = torch.arange(12, dtype=torch.float32)
    stream = b"".join(compressor.wire_header(_data(i, 1)) + byte_view(values[i:i + 1]).tobytes()
                      for i in range(12))
    stream += encode_control(Kind.PLAN, b"abc", job_id=JOB)
    try:
        left.sendall(stream)
        out = torch.zeros(12)
        for i in range(12):
            header = frames.next_header(lambda view: right.recv_into(view, HEADER_SIZE))
            assert (header.kind, header.offset, header.length) == (Kind.REDUCE, i, 1)
            assert frames.header_size == (HEADER_SIZE if i == 0 else 8)
            frames.read_into(slice_view(out, header.offset, header.length))
        plan = frames.next_header(lambda view: right.recv_into(view, HEADER_SIZE))
        assert plan.kind == Kind.PLAN and frames.read_control(plan) == b"abc"
        assert torch.equal(out, values) and frames.have == 0
    finally:
        left.close()
        right.close()


def test_a_continuation_as_a_connections_first_frame_is_refused():
    left, right, frames = _reader_pair()
    try:
        left.sendall(CONTINUATION.pack(CONTINUATION_TAG, 0, 4) + bytes(16))
        with pytest.raises(ProtocolError, match="no data frame before it"):
            frames.next_header(lambda view: right.recv_into(view, HEADER_SIZE))
    finally:
        left.close()
        right.close()
