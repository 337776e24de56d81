"""Reducers: collect per-rank iteration times on rank 0, let it decide, hand the decision to everyone.

A reducer has `rank`, `world_size` and one collective, `decide(local_times, decide_fn)`: every rank
calls it at the same point with its own list of seconds; rank 0 receives all ranks' lists (index =
rank), calls `decide_fn(all_times)` which returns a JSON-able decision, and every rank returns that
same decision. Other ranks never run `decide_fn`, so no rank can decide differently.

- `LocalReducer`: one process (or a caller that already agrees by other means).
- `TorchDistributedReducer`: over a `torch.distributed` process group (gloo works on CPU, e.g. with a
  `TCPStore`-based group). Nothing is pickled: the times travel as float64 tensors (an all_reduce of
  zeros and each rank's own row, exact) and the decision as JSON bytes, its length checked before
  anything is allocated. (`gather_object`/`broadcast_object_list` would unpickle peers' data.)
"""

import json
from typing import Callable

from geryon.errors import ConfigError

MAX_TIMES = 1 << 16               # per rank and call: a search records a few iterations per probe
MAX_DECISION_BYTES = 16 << 20

Decision = dict
DecideFn = Callable[[list[list[float]]], Decision]


class LocalReducer:
    """A single rank: decides on its own times."""

    rank = 0
    world_size = 1

    def decide(self, local_times: list[float], decide_fn: DecideFn) -> Decision:
        return decide_fn([list(local_times)])


class TorchDistributedReducer:
    """Rank 0 of `group` decides on everyone's times; the decision is broadcast to all ranks."""

    def __init__(self, group=None):
        import torch.distributed as dist

        from geryon.gloo_buffers import KeptBuffers

        if not dist.is_initialized():
            raise ConfigError("torch.distributed is not initialised; call init_process_group first "
                              "or use LocalReducer")
        self._dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self._root = dist.get_global_rank(group, 0) if group is not None else 0
        self._kept = KeptBuffers()

    def decide(self, local_times: list[float], decide_fn: DecideFn) -> Decision:
        everyone = self._all_times([float(x) for x in local_times])
        payload = b""
        if self.rank == 0:
            try:
                payload = json.dumps(decide_fn(everyone), default=float).encode()
            except BaseException:
                self._size_from_root(0)     # length 0: the other ranks raise instead of waiting
                raise
        # every rank, rank 0 included, returns the decoded JSON: the same value everywhere
        return json.loads(self._from_root(payload))

    def _rows(self, name: str, columns: int, dtype, row: list):
        """A zeroed [world_size, columns] buffer with this rank's `row` in place, summed over the group."""
        buffer = self._kept.get(name, self.world_size * columns, dtype)
        buffer.zero_()
        if row:
            buffer[self.rank * columns:self.rank * columns + len(row)] = buffer.new_tensor(row)
        self._dist.all_reduce(buffer, group=self.group)
        return buffer.view(self.world_size, columns)

    def _all_times(self, times: list[float]) -> list[list[float]]:
        import torch

        if len(times) > MAX_TIMES:
            raise ConfigError(f"{len(times)} times in one decide() call; at most {MAX_TIMES}")
        counts = self._rows("counts", 1, torch.int64, [len(times)]).reshape(-1).tolist()
        if any(not 0 <= count <= MAX_TIMES for count in counts):
            raise ConfigError(f"a rank announced {counts} times; each must be 0..{MAX_TIMES}")
        table = self._rows("times", max(counts), torch.float64, times)
        return [table[rank, :count].tolist() for rank, count in enumerate(counts)]

    def _size_from_root(self, size: int) -> int:
        import torch

        buffer = self._kept.get("size", 1, torch.int64)
        buffer.fill_(size if self.rank == 0 else 0)
        self._dist.broadcast(buffer, src=self._root, group=self.group)
        return int(buffer.item())

    def _from_root(self, payload: bytes) -> bytes:
        """Rank 0's `payload` on every rank: its length first (checked), then the bytes."""
        import torch

        length = self._size_from_root(len(payload))
        if length == 0:
            raise ConfigError("rank 0 could not decide (its error is in its own output)")
        if not 0 < length <= MAX_DECISION_BYTES:
            raise ConfigError(f"rank 0's decision is {length} bytes; expected 1..{MAX_DECISION_BYTES}")
        data = self._kept.get("decision", length, torch.uint8)
        if self.rank == 0:
            data.copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
        self._dist.broadcast(data, src=self._root, group=self.group)
        return data.numpy().tobytes()
