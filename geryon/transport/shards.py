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


def plan_shards(specs: list[ParamSpec], servers: int, policy: Policy, slice_bytes: int,
                placement: str = "count") -> list[Shard]:
    """Slices of every tensor and the server of each.

    placement "count" deals slices round-robin (P3's way): equal slice counts per server, but a
    model whose tensors alternate big and small (ResNet's conv and BN layers) loads some servers with
    several times the bytes of others. "bytes" gives each slice to the server holding the fewest
    bytes so far (lowest index on ties): every server within one slice of the mean.
    """
    shards, turn = [], 0
    load = [0] * servers
    for spec in specs:
        if not policy.spread_over_servers:
            if spec.numel:
                shards.append(Shard(spec.tensor_id, 0, spec.numel, spec.tensor_id % servers,
                                    spec.priority, spec.urgency))
            continue
        step = max(1, slice_bytes // spec.dtype.itemsize)
        for offset in range(0, spec.numel, step):
            length = min(step, spec.numel - offset)
            if placement == "bytes":
                server = min(range(servers), key=lambda s: (load[s], s))
            else:
                server = turn % servers
            load[server] += length * spec.dtype.itemsize
            shards.append(Shard(spec.tensor_id, offset, length, server, spec.priority, spec.urgency))
            turn += 1
    return shards


def bytes_per_server(specs: list[ParamSpec], shards: list[Shard], servers: int) -> list[int]:
    """How many parameter bytes each server holds under a plan (what `placement` balances)."""
    load = [0] * servers
    for shard in shards:
        load[shard.server] += shard.length * specs[shard.tensor_id].dtype.itemsize
    return load


def shard_digest(specs: list[ParamSpec], shards: list[Shard], servers: int, workers: int) -> bytes:
    digest = hashlib.sha256(struct.pack("!II", servers, workers))
    for spec in specs:
        digest.update(struct.pack("!QBII", spec.numel, dtype_code(spec.dtype), spec.priority,
                                  spec.urgency & 0xFFFFFFFF))
    for shard in shards:
        digest.update(struct.pack("!IQQI", shard.tensor_id, shard.offset, shard.length, shard.server))
    return digest.digest()
