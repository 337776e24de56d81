"""Bucket plans for allreduce: small tensors batched, large ones alone, chunks for the ring.

A plan is a pure function of the tensors' sizes, dtypes and priorities in the order the caller
gives them, so every rank computes the same plan; `plan_digest` hashes it so ranks can check that.
Consecutive tensors of one dtype and one priority class are batched until `bucket_bytes` (Caramel's
small-parameter batching); a tensor at least that large gets a bucket of its own and is pipelined
slice by slice. A bucket carries the priority class and urgency of its most urgent tensor; classes
are never mixed in a bucket, so low-class bulk never rides the high-priority queue.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import torch

from geryon.transport.wire import dtype_code


@dataclass(frozen=True)
class BucketEntry:
    index: int     # position of the tensor in the caller's list
    offset: int    # first element inside the bucket
    numel: int


@dataclass(frozen=True)
class Bucket:
    id: int
    dtype: torch.dtype
    numel: int
    priority: int
    urgency: int
    entries: tuple[BucketEntry, ...]


def normalize_priorities(count: int, priorities, classes: int) -> list[tuple[int, int]]:
    """(class, urgency) per tensor; ints mean a class (urgency = position), None means class 0."""
    if priorities is None:
        return [(0, i) for i in range(count)]
    if len(priorities) != count:
        raise ValueError(f"{len(priorities)} priorities for {count} tensors")
    result = []
    for i, item in enumerate(priorities):
        klass, urgency = (item, i) if isinstance(item, int) else (int(item[0]), int(item[1]))
        result.append((min(max(klass, 0), classes - 1), urgency))
    return result


def plan_buckets(tensors, priorities: list[tuple[int, int]], bucket_bytes: int) -> list[Bucket]:
    """Group tensors into buckets in the given order."""
    buckets: list[Bucket] = []
    current: list[int] = []

    def close():
        if not current:
            return
        entries, offset = [], 0
        for index in current:
            numel = tensors[index].numel()
            entries.append(BucketEntry(index, offset, numel))
            offset += numel
        priority, urgency = min(priorities[i] for i in current)
        buckets.append(Bucket(len(buckets), tensors[current[0]].dtype, offset, priority, urgency,
                              tuple(entries)))
        current.clear()

    size = 0
    for index, tensor in enumerate(tensors):
        nbytes = tensor.numel() * tensor.element_size()
        if current and (tensor.dtype != tensors[current[0]].dtype or size + nbytes > bucket_bytes
                        or priorities[index][0] != priorities[current[0]][0]):
            close()
            size = 0
        current.append(index)
        size += nbytes
        if size >= bucket_bytes:
            close()
            size = 0
    close()
    return buckets


def plan_digest(buckets: list[Bucket], world: int, policy: str) -> bytes:
    """SHA-256 of everything the ranks must agree on: world, policy and every bucket."""
    digest = hashlib.sha256(struct.pack("!I", world) + policy.encode())
    for bucket in buckets:
        digest.update(struct.pack("!IBQII", bucket.id, dtype_code(bucket.dtype), bucket.numel,
                                  bucket.priority, bucket.urgency & 0xFFFFFFFF))
        for entry in bucket.entries:
            digest.update(struct.pack("!QQ", entry.offset, entry.numel))
    return digest.digest()


def chunk_bounds(numel: int, world: int) -> list[tuple[int, int]]:
    """Split [0, numel) into `world` contiguous chunks, the first numel % world one longer."""
    base, extra = divmod(numel, world)
    bounds, start = [], 0
    for c in range(world):
        end = start + base + (1 if c < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def pieces(start: int, end: int, piece: int | None) -> list[tuple[int, int]]:
    """(offset, length) pieces covering [start, end); piece None means one piece."""
    if end <= start:
        return []
    if piece is None:
        return [(start, end - start)]
    return [(o, min(piece, end - o)) for o in range(start, end, piece)]
