"""Wire format: round trips, one test per invalid field, and hypothesis fuzzing of the decoder."""

import struct

import pytest
import torch
from hypothesis import given, settings, strategies as st

from geryon.errors import ProtocolError
from geryon.transport.wire import (DTYPE_CODES, HEADER, HEADER_SIZE, MAGIC, PROTOCOL_VERSION, Kind,
                                   byte_view, decode_header, encode_control, encode_header,
                                   slice_view)

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
