"""Server-side checkpoints in PS mode: a restarted job resumes from the servers' own copy of the model.

With `--ps-checkpoint-every K --ps-checkpoint-dir DIR` every K steps each server writes its shards'
values, optimizer state and version to DIR, and a job that starts (or is restarted by
--max-restarts) with a consistent step S in DIR resumes from it: the servers load S, the workers
pull version S and continue at step S (`ctx.resumed_step`), without the user's own checkpoint.

Files in DIR (S zero-padded, so names sort by step):
  step-S.server-J-of-M.pt  server J's shards at version S: {(tensor, offset): (value, optimizer state)},
                           torch.save'd tensors and numbers, read with weights_only=True
  step-S.buffers.pt        the model's buffers (BatchNorm statistics: worker 0's, as every worker holds
                           them in PS mode), written by worker 0; absent for a model without buffers
  step-S.done              JSON {"step": S, "servers": M, "buffers": bool}: every file of step S is written
Every file is written atomically: a temporary file in DIR, fsync, rename (then DIR is fsync'd).

When: the workers' step counter is the version. After step() of every K-th step, worker 0 waits
for its pull of version S (every shard on every server is then at S, and none can move on before
worker 0 pushes its next gradient), asks every server to write its file (a STATE "checkpoint"
request), and once all answered, writes the buffers and the marker and removes older steps, keeping
the last two consistent ones (a failure while step S is written still leaves the one before).

The consistency rule: a step S is consistent when its marker exists and all M of its server files
do; each server refuses to write a file unless every shard it holds is at version S, so a
consistent step has every shard at the same version S. A job resumes from the latest consistent
step; files of a step without a marker are ignored. DIR must be the same directory for every rank
(one machine, or a shared filesystem for SSH hosts).
"""

import io
import json
import os
import re

from geryon import safefiles
from geryon.errors import ConfigError

MARKER = "step-{step:09d}.done"
BUFFERS_FILE = "step-{step:09d}.buffers.pt"
SERVER_FILE = "step-{step:09d}.server-{index}-of-{count}.pt"
KEEP = 2
_MARKER_RE = re.compile(r"step-(\d+)\.done$")
_STEP_RE = re.compile(r"\.?step-(\d+)\.")   # a step's files, and temporary files of a write cut short


def replace_bytes(path: str, data: bytes) -> None:
    """Write `data` to `path` atomically and durably, readable by its owner only."""
    safefiles.replace_bytes(path, data, mode=0o600, durable=True)


def consistent_steps(directory: str | None) -> list[int]:
    """The consistent steps in `directory`, oldest first (none when it is unset or missing)."""
    if not directory or not os.path.isdir(directory):
        return []
    names = set(os.listdir(directory))
    steps = []
    for name in names:
        match = _MARKER_RE.fullmatch(name)
        if not match:
            continue
        step = int(match.group(1))
        count = _marker(directory, step)["servers"]
        if all(SERVER_FILE.format(step=step, index=j, count=count) in names for j in range(count)):
            steps.append(step)
    return sorted(steps)


def resume_step(directory: str | None) -> int:
    """The step a job starting now resumes from: the latest consistent one, else 0."""
    steps = consistent_steps(directory)
    return steps[-1] if steps else 0


def _marker(directory: str, step: int) -> dict:
    path = os.path.join(directory, MARKER.format(step=step))
    try:
        with open(path) as handle:
            marker = json.load(handle)
        if marker["step"] != step or int(marker["servers"]) < 1:
            raise ValueError(marker)
        return marker
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"server checkpoint marker {path} is unreadable ({exc}); remove it to resume "
                          "from the step before, or empty the --ps-checkpoint-dir to start afresh") from None


# -- the server's side --------------------------------------------------------------------------------------
def write_server_file(server, directory: str, step: int) -> None:
    """Server `server.index` writes its shards at version `step`; refused if any shard is elsewhere."""
    import torch

    versions = sorted({state.version for state in server.shards.values()})
    if versions not in ([], [step]):   # [] : a server the plan gave no shard
        raise ConfigError(f"server {server.index}: asked for a checkpoint of step {step}, but its shards are "
                          f"at versions {versions}")
    shards = {key: (state.value(), state.state()) for key, state in server.shards.items()}
    buffer = io.BytesIO()
    torch.save({"step": step, "shards": shards}, buffer)
    replace_bytes(os.path.join(directory, SERVER_FILE.format(step=step, index=server.index,
                                                             count=server.servers)), buffer.getvalue())


def load(directory: str, step: int, values: list) -> tuple[list, list]:
    """(values, per-tensor optimizer states) of the whole model at consistent step `step`.

    Every server's file is read, so a server gets its shards even when the plan placed them
    elsewhere before; `values` (the starting point) gives shapes and what no file holds.
    """
    import torch

    from geryon.transport.server_optimizer import full_state

    count = _marker(directory, step)["servers"]
    new_values = [v.detach().clone() for v in values]
    parts: dict[int, list] = {}
    for index in range(count):
        path = os.path.join(directory, SERVER_FILE.format(step=step, index=index, count=count))
        data = torch.load(path, weights_only=True)
        if data["step"] != step:
            raise ConfigError(f"{path} holds step {data['step']}, not {step}; remove the step's files")
        for (tensor, offset), (param, state) in data["shards"].items():
            if tensor >= len(new_values) or offset + param.numel() > new_values[tensor].numel():
                raise ConfigError(f"{path} does not fit this model (tensor {tensor}); point "
                                  "--ps-checkpoint-dir at this model's checkpoints or an empty directory")
            new_values[tensor].view(-1)[offset:offset + param.numel()] = param
            parts.setdefault(tensor, []).append((offset, state))
    states = [full_state(parts.get(tensor, []), value) or None for tensor, value in enumerate(new_values)]
    return new_values, states


# -- worker 0's side ----------------------------------------------------------------------------------------
def load_buffers(directory: str, step: int, model) -> None:
    """Give `model` the buffers saved with consistent step `step` (nothing when it was saved without)."""
    import torch

    if not _marker(directory, step).get("buffers"):
        return
    path = os.path.join(directory, BUFFERS_FILE.format(step=step))
    saved = torch.load(path, weights_only=True, map_location="cpu")   # copied to the model's device below
    mine = dict(model.named_buffers())
    if saved.keys() != mine.keys():
        raise ConfigError(f"{path} holds the buffers of another model; point --ps-checkpoint-dir at this "
                          "model's checkpoints or an empty directory")
    with torch.no_grad():
        for name, value in saved.items():
            mine[name].copy_(value)


class StepCheckpoints:
    """Worker 0 has the servers checkpoint every `every` steps into `directory`, then marks the step."""

    def __init__(self, directory: str, every: int, servers: int, model):
        self.directory, self.every, self.servers, self.model = directory, every, servers, model

    def after_step(self, worker) -> None:
        """After step() advanced `worker.iteration`: checkpoint when it is a multiple of `every`."""
        step = worker.iteration
        if step % self.every:
            return
        worker.wait_all()   # every shard everywhere is at `step` and stays there until this worker pushes
        worker.state_request("checkpoint", str(step))
        buffers = {name: value.detach().to("cpu", copy=True) for name, value in self.model.named_buffers()}
        if buffers:
            import torch

            data = io.BytesIO()
            torch.save(buffers, data)
            replace_bytes(os.path.join(self.directory, BUFFERS_FILE.format(step=step)), data.getvalue())
        marker = json.dumps({"step": step, "servers": self.servers, "buffers": bool(buffers)}).encode()
        replace_bytes(os.path.join(self.directory, MARKER.format(step=step)), marker)
        self.prune()

    def prune(self) -> None:
        """Remove every file of a step older than the last KEEP consistent ones (temporary ones too)."""
        kept = consistent_steps(self.directory)[-KEEP:]
        if len(kept) < KEEP:
            return
        for name in os.listdir(self.directory):
            match = _STEP_RE.match(name)
            if match and int(match.group(1)) < kept[0]:
                try:
                    os.unlink(os.path.join(self.directory, name))
                except FileNotFoundError:
                    pass


def exchange(store, directory: str | None, server, op: str, key: str) -> None:
    """A worker's STATE request on `server`: "checkpoint" (step `key`) here, the rest as ps_checkpoint does.

    The worker names only the step; the directory is the server's own (GERYON_PS_CHECKPOINT_DIR).
    """
    from geryon.runtime.ps_checkpoint import state_exchange

    if op != "checkpoint":
        state_exchange(store, server, op, key)
        return
    if not directory:
        raise ConfigError("a worker asked for a server checkpoint, but this job has no --ps-checkpoint-dir")
    write_server_file(server, directory, int(key))
