"""Shard plans for the parameter server: which server holds which slice of which parameter.

`vanilla` assigns whole tensors to servers round-robin (TensorFlow's default); the other policies
cut tensors into slices of `slice_bytes` and deal the slices round-robin over the servers
(P3-style), so one large layer no longer lands on one server. The plan is a pure function of the
parameter list, so workers and servers compute it alike; `shard_digest` lets them check that.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import torch

from geryon.transport.policy import Policy
from geryon.transport.wire import dtype_code


@dataclass(frozen=True)
class ParamSpec:
    tensor_id: int
    numel: int
    dtype: torch.dtype
    priority: int
    urgency: int


@dataclass(frozen=True)
class Shard:
    tensor_id: int
    offset: int
    length: int
    server: int
    priority: int
    urgency: int

    @property
    def key(self) -> tuple[int, int]:
        return (self.tensor_id, self.offset)


def param_specs(tensors, priorities: list[tuple[int, int]]) -> list[ParamSpec]:
    return [ParamSpec(i, t.numel(), t.dtype, p, u) for i, (t, (p, u)) in enumerate(zip(tensors, priorities))]


def plan_shards(specs: list[ParamSpec], servers: int, policy: Policy, slice_bytes: int) -> list[Shard]:
    shards, turn = [], 0
    for spec in specs:
        if not policy.spread_over_servers:
            if spec.numel:
                shards.append(Shard(spec.tensor_id, 0, spec.numel, spec.tensor_id % servers,
                                    spec.priority, spec.urgency))
            continue
        step = max(1, slice_bytes // spec.dtype.itemsize)
        for offset in range(0, spec.numel, step):
            shards.append(Shard(spec.tensor_id, offset, min(step, spec.numel - offset),
                                turn % servers, spec.priority, spec.urgency))
            turn += 1
    return shards


def shard_digest(specs: list[ParamSpec], shards: list[Shard], servers: int, workers: int) -> bytes:
    digest = hashlib.sha256(struct.pack("!II", servers, workers))
    for spec in specs:
        digest.update(struct.pack("!QBII", spec.numel, dtype_code(spec.dtype), spec.priority,
                                  spec.urgency & 0xFFFFFFFF))
    for shard in shards:
        digest.update(struct.pack("!IQQI", shard.tensor_id, shard.offset, shard.length, shard.server))
    return digest.digest()
