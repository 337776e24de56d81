"""The wire format: a 44-byte header (8 bytes for a continuation) then raw tensor bytes; never pickled.

Full header (network byte order, ``struct`` format ``!4sBBBBIIIQQQ``)::

    offset size field         meaning
    0      4    magic         b"GYTR"
    4      1    version       PROTOCOL_VERSION (2)
    5      1    kind          message type (Kind)
    6      1    dtype         dtype code (DTYPES); control messages use uint8
    7      1    priority      priority class of the payload, 0 = most urgent
    8      4    job_id        per-job id, checked on every frame
    12     4    iteration     training iteration / collective sequence number (mod 2**32)
    16     4    tensor_id     index of the tensor (PS) or bucket (allreduce) in the agreed plan
    20     8    offset        first element of the slice, in elements of dtype
    28     8    length        number of elements in the slice
    36     8    payload_len   bytes following the header; must equal length * itemsize

Continuation header (``!2sHI``, 8 bytes): a data frame that carries the next slice of the data frame
sent just before it on the same connection (same kind, dtype, priority, job, iteration and tensor;
offset = that frame's offset + length) says only so::

    0      2    tag           b"G+"
    2      2    reserved      0
    4      4    length        number of elements in the slice

A tensor cut into 256 KiB pieces then pays 8 header bytes per piece instead of 44 (at 100 Mbit/s that
is 2 ms of an 8-rank 100 MB ring allreduce, docs/transport.md), and each piece stays a frame
of its own, so the sender can still put a more urgent frame between any two. `continues` is the
sender's test; `decode_continuation` rebuilds the full Header from the previous data frame's and
validates it exactly like a full one. Control frames neither continue nor are continued; they leave
the previous data frame in place on both sides.

`decode_header` validates every field before the receiver allocates or reads anything; the payload is
then read with `recv_into` straight into a view of the destination tensor's storage (`byte_view`).
Control messages (handshake, plan digests, pull requests, goodbyes, aborts) carry at most
MAX_CONTROL_PAYLOAD bytes, read into a small buffer owned by the connection.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

import torch

from geryon.errors import ProtocolError

MAGIC = b"GYTR"
PROTOCOL_VERSION = 2          # 2: continuation headers
HEADER = struct.Struct("!4sBBBBIIIQQQ")
HEADER_SIZE = HEADER.size
CONTINUATION_TAG = b"G+"
CONTINUATION = struct.Struct("!2sHI")
CONTINUATION_SIZE = CONTINUATION.size
_KIND_AT, _OFFSET_AT = 5, 20   # where a full header holds its kind, and its offset and length
_SAME_STREAM = slice(0, _OFFSET_AT)     # magic .. tensor_id: equal in a frame and its continuation
_OFFSET_LENGTH = struct.Struct("!QQ")
_MAX_CONTINUATION = 0xFFFFFFFF  # elements a continuation header can state
MAX_CONTROL_PAYLOAD = 256
MAX_PRIORITY_CLASSES = 8


class Kind(enum.IntEnum):
    """Message types; the first group are control messages with a small bytes payload."""
    HELLO = 1
    CHALLENGE = 2
    PROOF = 3
    ACCEPT = 4
    REJECT = 5
    PLAN = 6
    PULL = 7
    BYE = 8
    ABORT = 9     # the job is failing: payload is a UTF-8 reason naming the failed rank
    STATE = 10    # PS: save/load optimizer state (worker -> server: JSON request; reply: b"ok" or error)
    ABSENT = 11   # PS: this worker has no gradient for a shard this iteration (payload: its offset, !Q)
    REDUCE = 20   # allreduce, reduce-scatter piece
    GATHER = 21   # allreduce, all-gather piece
    PUSH = 30     # PS: gradient slice, worker -> server
    PARAM = 31    # PS: parameter slice, server -> worker
    STEP = 32     # PS: one iteration's optimizer settings (float64: clip, hyper-parameters, presence)


CONTROL_KINDS = frozenset({Kind.HELLO, Kind.CHALLENGE, Kind.PROOF, Kind.ACCEPT, Kind.REJECT,
                           Kind.PLAN, Kind.PULL, Kind.BYE, Kind.ABORT, Kind.STATE,
                           Kind.ABSENT})
_KINDS = frozenset(int(k) for k in Kind)
_CONTROL_CODES = frozenset(int(k) for k in CONTROL_KINDS)

DTYPES: dict[int, torch.dtype] = {
    1: torch.float32, 2: torch.float16, 3: torch.bfloat16, 4: torch.float64,
    5: torch.int32, 6: torch.int64, 7: torch.uint8, 8: torch.int8,
}
DTYPE_CODES: dict[torch.dtype, int] = {dtype: code for code, dtype in DTYPES.items()}
CONTROL_DTYPE = 7


@dataclass(frozen=True)
class Header:
    """One decoded, validated frame header."""
    kind: Kind
    dtype_code: int
    priority: int
    job_id: int
    iteration: int
    tensor_id: int
    offset: int
    length: int
    payload_len: int

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.dtype_code]

    def describe(self) -> str:
        return (f"{self.kind.name} iteration={self.iteration} tensor={self.tensor_id} "
                f"slice=[{self.offset}, {self.offset + self.length}) {self.dtype}")


def dtype_code(dtype: torch.dtype) -> int:
    """The wire code of a torch dtype; raises ProtocolError for dtypes the wire cannot carry."""
    try:
        return DTYPE_CODES[dtype]
    except KeyError:
        raise ProtocolError(f"dtype {dtype} cannot be sent; use one of "
                            f"{', '.join(str(d) for d in DTYPE_CODES)}") from None


def itemsize(code: int) -> int:
    return DTYPES[code].itemsize


def encode_header(kind: Kind, *, job_id: int, iteration: int = 0, tensor_id: int = 0,
                  offset: int = 0, length: int = 0, dtype: int = CONTROL_DTYPE,
                  priority: int = 0) -> bytes:
    """Pack one header; `length` is in elements of `dtype` and fixes the payload length."""
    return HEADER.pack(MAGIC, PROTOCOL_VERSION, int(kind), dtype, priority, job_id,
                       iteration & 0xFFFFFFFF, tensor_id, offset, length, length * itemsize(dtype))


def encode_control(kind: Kind, payload: bytes, *, job_id: int, iteration: int = 0,
                   tensor_id: int = 0, priority: int = 0) -> bytes:
    """A control frame: header plus a short bytes payload, as one bytes object."""
    if len(payload) > MAX_CONTROL_PAYLOAD:
        raise ProtocolError(f"control payload of {len(payload)} bytes exceeds {MAX_CONTROL_PAYLOAD}")
    return encode_header(kind, job_id=job_id, iteration=iteration, tensor_id=tensor_id,
                         length=len(payload), priority=priority) + payload


def decode_header(raw: bytes | bytearray | memoryview, *, job_id: int, max_payload: int,
                  tensor_numel=None) -> Header:
    """Unpack and validate a header; raises ProtocolError naming the first bad field.

    `tensor_numel(tensor_id) -> int | None` gives the registered size of a tensor (None: unknown);
    when given, data frames must name a registered tensor and a slice inside it.
    """
    if len(raw) != HEADER_SIZE:
        raise ProtocolError(f"truncated header: {len(raw)} of {HEADER_SIZE} bytes")
    (magic, version, kind, dtype, priority, job, iteration, tensor_id, offset, length,
     payload_len) = HEADER.unpack(raw)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {magic!r}: the peer does not speak the geryon transport")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version}, expected {PROTOCOL_VERSION}: "
                            "run the same geryon version on every rank")
    if kind not in _KINDS:
        raise ProtocolError(f"unknown message type {kind}")
    kind = Kind(kind)
    if dtype not in DTYPES:
        raise ProtocolError(f"unknown dtype code {dtype}")
    if priority >= MAX_PRIORITY_CLASSES:
        raise ProtocolError(f"priority class {priority} out of range 0..{MAX_PRIORITY_CLASSES - 1}")
    if job != job_id:
        raise ProtocolError(f"job id {job}, expected {job_id}: the peer belongs to another job")
    if payload_len != length * itemsize(dtype):
        raise ProtocolError(f"payload of {payload_len} bytes does not hold {length} elements "
                            f"of {DTYPES[dtype]}")
    header = Header(kind, dtype, priority, job, iteration, tensor_id, offset, length, payload_len)
    if kind in CONTROL_KINDS:
        if dtype != CONTROL_DTYPE or payload_len > MAX_CONTROL_PAYLOAD or offset != 0:
            raise ProtocolError(f"malformed {kind.name} control frame ({payload_len} bytes)")
    else:
        _check_data(header, max_payload, tensor_numel)
    return header


def _check_data(header: Header, max_payload: int, tensor_numel) -> None:
    """A data frame's payload size, and its slice inside a registered tensor (when known)."""
    if header.payload_len > max_payload:
        raise ProtocolError(f"payload of {header.payload_len} bytes exceeds the maximum {max_payload}")
    if header.length == 0:
        raise ProtocolError("empty data slice")
    if tensor_numel is not None:
        numel = tensor_numel(header.tensor_id)
        if numel is None:
            raise ProtocolError(f"unknown tensor id {header.tensor_id}")
        if header.offset + header.length > numel:
            raise ProtocolError(f"slice [{header.offset}, {header.offset + header.length}) outside tensor "
                                f"{header.tensor_id} of {numel} elements")


def continues(previous: bytes | None, header: bytes) -> bool:
    """Whether the full data `header` continues `previous`, the last data header sent on this
    connection (None: none yet): then it may go as a continuation header (`encode_continuation`)."""
    if (previous is None or header[_KIND_AT] in _CONTROL_CODES
            or header[_SAME_STREAM] != previous[_SAME_STREAM]):
        return False
    offset, length = _OFFSET_LENGTH.unpack_from(previous, _OFFSET_AT)
    next_offset, next_length = _OFFSET_LENGTH.unpack_from(header, _OFFSET_AT)
    return next_offset == offset + length and next_length <= _MAX_CONTINUATION


class HeaderCompressor:
    """The sender side of one connection: what header to write for each frame, in send order (a
    continuation where `continues` allows and `enabled`, else the full header)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.previous: bytes | None = None     # the last data header sent

    def wire_header(self, header: bytes) -> bytes:
        if header[_KIND_AT] in _CONTROL_CODES:
            return header
        wire = encode_continuation(header) if self.enabled and continues(self.previous, header) else header
        self.previous = header
        return wire


def encode_continuation(header: bytes) -> bytes:
    """The 8-byte continuation header standing for the full data `header` (see `continues`)."""
    length = _OFFSET_LENGTH.unpack_from(header, _OFFSET_AT)[1]
    if length > _MAX_CONTINUATION:
        raise ProtocolError(f"a continuation carries at most {_MAX_CONTINUATION} elements, not {length}")
    return CONTINUATION.pack(CONTINUATION_TAG, 0, length)


def decode_continuation(raw: bytes | bytearray | memoryview, previous: Header | None, *,
                        max_payload: int, tensor_numel=None) -> Header:
    """Unpack and validate a continuation header against `previous`, the last data frame received on
    this connection; returns the full Header it stands for. Raises ProtocolError like decode_header."""
    if len(raw) != CONTINUATION_SIZE:
        raise ProtocolError(f"truncated continuation header: {len(raw)} of {CONTINUATION_SIZE} bytes")
    tag, reserved, length = CONTINUATION.unpack(raw)
    if tag != CONTINUATION_TAG or reserved != 0:
        raise ProtocolError(f"malformed continuation header {bytes(raw)!r}")
    if previous is None:
        raise ProtocolError("a continuation header with no data frame before it on this connection")
    header = Header(previous.kind, previous.dtype_code, previous.priority, previous.job_id,
                    previous.iteration, previous.tensor_id, previous.offset + previous.length, length,
                    length * itemsize(previous.dtype_code))
    _check_data(header, max_payload, tensor_numel)
    return header


def byte_view(tensor: torch.Tensor) -> memoryview:
    """A writable byte memoryview over a contiguous tensor's storage (no copy)."""
    if not tensor.is_contiguous():
        raise ProtocolError("tensors on the wire must be contiguous")
    if tensor.device.type != "cpu":
        raise ProtocolError(f"tensors on the wire must live on the CPU, not {tensor.device}")
    flat = tensor.detach().reshape(-1)
    if flat.numel() == 0:
        return memoryview(bytearray(0))
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def slice_view(tensor: torch.Tensor, offset: int, length: int) -> memoryview:
    """Bytes of elements [offset, offset + length) of a contiguous tensor."""
    size = tensor.element_size()
    return byte_view(tensor)[offset * size:(offset + length) * size]
