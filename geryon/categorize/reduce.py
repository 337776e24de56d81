"""Reducers: collect per-rank iteration times on rank 0, let it decide, hand the decision to everyone.

A reducer has `rank`, `world_size` and one collective, `decide(local_times, decide_fn)`: every rank
calls it at the same point with its own list of seconds; rank 0 receives all ranks' lists (index =
rank), calls `decide_fn(all_times)` which returns a JSON-able decision, and every rank returns that
same decision. Other ranks never run `decide_fn`, so no rank can decide differently.

- `LocalReducer`: one process (or a caller that already agrees by other means).
- `TorchDistributedReducer`: over a `torch.distributed` process group (gloo works on CPU, e.g. with a
  `TCPStore`-based group), using `gather_object` and `broadcast_object_list`.
"""

from typing import Callable

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

        if not dist.is_initialized():
            from geryon.errors import ConfigError
            raise ConfigError("torch.distributed is not initialised; call init_process_group first "
                              "or use LocalReducer")
        self._dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self._root = dist.get_global_rank(group, 0) if group is not None else 0

    def decide(self, local_times: list[float], decide_fn: DecideFn) -> Decision:
        dist = self._dist
        gathered = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object([float(x) for x in local_times], gathered, dst=self._root, group=self.group)
        box = [decide_fn(gathered) if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=self._root, group=self.group)
        return box[0]
