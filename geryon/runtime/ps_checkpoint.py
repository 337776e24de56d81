"""Optimizer checkpoints in PS mode: the state lives in shards on the servers.

Worker side (`Checkpoints`): `state_dict(worker)` asks every server (a STATE "save" control frame)
to write its shards' optimizer state into the job's store under a fresh key, reads them, joins
each tensor's shards (geryon.transport.server_optimizer.full_state) and returns the user's optimizer's own
state_dict() over that state: the same format, keys and values as in one process.
`load(worker, state)` runs on every worker: worker 0 writes the model's current parameters (and,
with `state`, the optimizer state just loaded by torch's load_state_dict) to the store, asks every
server to load it (a STATE "load" frame, answered once applied), and then every worker pulls the
current version again, so all of them hold exactly what the servers hold.
Both run between iterations (after the pull of the last step completed), so no update is half-applied.

Server side (`state_exchange`): what ParameterServer calls for a STATE request.
Blobs are torch.save'd tensors and numbers, read with weights_only=True.
"""

import io

from geryon.runtime.store_blobs import get_blob, put_blob

STATE_KEY = "ps/state/{rank}/{number}"
LOAD_KEY = "ps/load/{number}"


def _save(data) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(data, buffer)
    return buffer.getvalue()


def _load(data: bytes):
    import torch

    return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")   # servers and workers on GPUs too


def current_states(optimizer, params) -> list:
    """Per tensor of `params` the optimizer's state for it (None when it has none)."""
    return [dict(optimizer.state[p]) if p in optimizer.state and optimizer.state[p] else None
            for p in params]


class Checkpoints:
    """A worker's side of saving and loading optimizer state held by the servers."""

    def __init__(self, optimizer, params, store, prefix: str, rank: int):
        self.optimizer, self.params, self.store, self.prefix, self.rank = (
            optimizer, params, store, prefix, rank)
        self.saves = 0
        self.loads = 0
        self.loading = False

    def state_dict(self, worker) -> dict:
        from geryon.transport.server_optimizer import full_state

        worker.wait_all()   # the last step is applied everywhere
        self.saves += 1
        key = self.prefix + STATE_KEY.format(rank=self.rank, number=self.saves)
        worker.state_request("save", key)
        parts: dict[int, list] = {}
        for server in worker.servers:
            for tensor, offset, state in _load(get_blob(self.store, f"{key}/{server}")):
                parts.setdefault(tensor, []).append((offset, state))
        try:
            for tensor, param in enumerate(self.params):
                state = full_state(parts.get(tensor, []), param)
                if state:
                    self.optimizer.state[param] = state
            return self.optimizer.state_dict()
        finally:
            self.optimizer.state.clear()

    def load(self, worker, state: bool) -> None:
        """Every worker: the servers take worker 0's parameters (and optimizer state); all re-pull."""
        self.loading = True
        try:
            worker.wait_all()
            self.loads += 1
            key = self.prefix + LOAD_KEY.format(number=self.loads)
            if self.rank == 0:
                states = current_states(self.optimizer, self.params) if state else None
                put_blob(self.store, key, _save({"values": [p.detach().cpu() for p in self.params],
                                                 "states": states}))
                worker.state_request("load", key)
                self.store.set(key + "/done", b"1")
            self.store.get(key + "/done")   # every worker waits for the servers to have it
            worker.pull(worker.iteration)
            worker.wait_all()
        finally:
            self.loading = False
            if state:
                self.optimizer.state.clear()


def state_exchange(store, server, op: str, key: str) -> None:
    """Run a worker's STATE request on `server`: save its shards' state, or load a checkpoint."""
    if op == "save":
        states = [[tensor, offset, state] for (tensor, offset), state in server.shard_states().items()]
        put_blob(store, f"{key}/{server.index}", _save(states))
    else:
        data = _load(get_blob(store, key))
        server.load_shards(data["values"], data["states"])
