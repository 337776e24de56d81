"""Prepared allreduces: what a repeated allreduce of the same tensors would otherwise redo per call.

DDP's comm hook, a training loop and the benchmarks reduce the same tensors (DDP's bucket buffers,
the same parameters' gradients) every iteration. For tensors that each fill a bucket of their own
and sit contiguously on the CPU, an allreduce works on the caller's memory directly, and everything
it needs besides is fixed by the tensors: the bucket plan (already checked against the other ranks
by its digest), a flat tensor over each one's memory and a byte view for the sockets. Built again
at every call they cost a fresh call 0.4 ms before its first byte leaves on the test machine, most
of it torch and numpy calls that run from cold caches after the idle gap before a collective;
reused they cost 0.2 ms (docs/transport.md).

`PreparedCache` keeps them per list of tensor objects, priorities and op, and checks at each use
that the objects, their memory, shapes, strides and dtypes are those it was made for. It holds each
tensor only by a weak reference, and what it keeps refers to the memory, not to the tensor object:
when the caller's tensor goes, its entry goes with it, so the cache keeps no memory alive past the
tensors it was made for. (A tensor given other memory in place, `tensor.data = ...`, leaves its old
memory held until its next allreduce replaces the entry, or until the tensor goes.) An entry is
kept only once the ranks have agreed on its plan, so a call it serves skips nothing that the first
call with that plan did not check.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from geryon.transport.buckets import Bucket

MAX_ENTRIES = 256   # a bound on bookkeeping only: entries go with their tensors anyway


@dataclass(frozen=True)
class Prepared:
    """One call's reusable part: its buckets, and per bucket a flat tensor over the caller's memory
    and a writable byte view of it."""
    buckets: list[Bucket]
    flats: list[torch.Tensor]
    views: list[memoryview]


def memory_flat(tensor: torch.Tensor) -> torch.Tensor:
    """A 1-D tensor over a contiguous tensor's memory. It refers to the memory, not to `tensor`
    (`detach` makes a new tensor with no link back), so it does not keep `tensor` alive."""
    return tensor.detach().view(-1)


def _bytes_of(flat: torch.Tensor) -> memoryview:
    # wire.byte_view without its checks, which `reusable` made
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def reusable(tensors: list[torch.Tensor], buckets: list[Bucket]) -> bool:
    """Whether an allreduce of `tensors` planned as `buckets` works on the tensors' own memory: each
    bucket one non-empty contiguous CPU tensor."""
    return all(len(b.entries) == 1 and b.numel > 0 and tensors[b.entries[0].index].is_contiguous()
               and tensors[b.entries[0].index].device.type == "cpu" for b in buckets)


def prepare(tensors: list[torch.Tensor], buckets: list[Bucket]) -> Prepared:
    """The reusable part of an allreduce of `tensors` planned as `buckets`, which must be `reusable`."""
    flats = [memory_flat(tensors[b.entries[0].index]) for b in buckets]
    return Prepared(buckets, flats, [_bytes_of(flat) for flat in flats])


def _shape(tensor: torch.Tensor) -> tuple:
    return tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype


class PreparedCache:
    """Prepared allreduces per list of tensor objects (`get`, `put`); see the module docstring."""

    def __init__(self):
        self._entries: dict[tuple, tuple] = {}   # (tensor ids, (priorities, op)): entry

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def _key(tensors, priorities, op: str):
        try:
            options = (None if priorities is None else tuple(priorities), op)
            hash(options)
        except TypeError:            # priorities given as lists: not kept
            return None
        return tuple(map(id, tensors)), options

    def get(self, tensors: list[torch.Tensor], priorities, op: str) -> Prepared | None:
        key = self._key(tensors, priorities, op)
        entry = self._entries.get(key) if key is not None else None
        if entry is None:
            return None
        refs, shapes, prepared = entry
        if any(ref() is not t for ref, t in zip(refs, tensors)) or list(map(_shape, tensors)) != shapes:
            return None
        return prepared

    def put(self, tensors: list[torch.Tensor], priorities, op: str, prepared: Prepared) -> None:
        """Keep `prepared` (made by `prepare(tensors, ...)`) for calls with these tensors, priorities and op."""
        key = self._key(tensors, priorities, op)
        if key is None:
            return
        entries = self._entries

        def forget(_ref, key=key):
            entries.pop(key, None)

        while len(entries) >= MAX_ENTRIES:
            entries.pop(next(iter(entries)))
        entries[key] = ([weakref.ref(t, forget) for t in tensors], list(map(_shape, tensors)), prepared)
