"""A tiny training script exercising one DDP feature at a time, for tests/test_ddp_compat.py.

    python -m geryon.launch --local --workers 2 tests/ddp_probe.py --feature no_sync --out FILE

Rank 0 writes the final parameters (and what the feature recorded) to FILE as JSON. `reference()`
computes, in one process, what W workers must end with: each step's global batch is split into W
per-worker chunks, and each chunk's loss / W is backpropagated (DDP's average), with the same
forward per chunk as a worker runs (so BatchNorm, bf16 rounding and unused branches match).
"""

import argparse
import contextlib
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

GLOBAL_BATCH = 8
STEPS = 4
LR = 0.1
FEATURES = ("no_sync", "unused", "static_graph", "autocast", "compile", "join", "wrapped", "bucket_options",
            "hook_classes_unused", "hook_classes_static", "plain")
ACCUMULATE = 2          # no_sync: micro-batches per step
JOIN_STEPS = (4, 2)     # join: steps of worker 0 and worker 1 (uneven inputs)


class Probe(nn.Module):
    """conv (class 0 under --priority coarse), fc and an auxiliary head (class 1)."""

    def __init__(self, hidden: int = 3):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.fc = nn.Linear(2 * 4 * 4, hidden)
        self.aux = nn.Linear(hidden, 3)

    def forward(self, x, use_aux: bool = True):
        out = self.fc(F.relu(self.conv(x)).flatten(1))
        return self.aux(out) if use_aux else out


def data(step: int, micro: int = 0):
    generator = torch.Generator().manual_seed(1000 * step + micro)
    return torch.randn(GLOBAL_BATCH, 1, 4, 4, generator=generator), torch.randint(0, 3, (GLOBAL_BATCH,),
                                                                                    generator=generator)


def chunk(tensor, rank: int, world: int):
    size = len(tensor) // world
    return tensor[rank * size:(rank + 1) * size]


def build(feature: str) -> tuple[nn.Module, torch.optim.Optimizer, dict]:
    torch.manual_seed(0)
    model = Probe()
    # unused: momentum and weight decay must skip a parameter without gradient, as torch's SGD does
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9,
                                weight_decay=0.01 if feature == "unused" else 0.0)
    options = {"join": {"bucket_cap_mb": 0.0001},  # several buckets of both classes for the joined worker
               "unused": {"find_unused_parameters": True}, "static_graph": {"static_graph": True},
               "bucket_options": {"gradient_as_bucket_view": True, "bucket_cap_mb": 0.001,
                                  "broadcast_buffers": False},
               "hook_classes_unused": {"find_unused_parameters": True, "bucket_cap_mb": 0.0001},
               "hook_classes_static": {"static_graph": True, "bucket_cap_mb": 0.0001}}.get(feature, {})
    return model, optimizer, options


def loss_of(model, feature: str, x, y, step: int):
    if feature == "autocast":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return F.cross_entropy(model(x).float(), y)
    use_aux = not (feature in ("unused", "hook_classes_unused") and step % 2)  # aux unused on odd steps
    out = model(x, use_aux=use_aux) if use_aux is False else model(x)
    return F.cross_entropy(out[:, :3], y)


def steps_of(feature: str, rank: int) -> int:
    return JOIN_STEPS[rank] if feature == "join" else STEPS


def reference(feature: str, world: int = 2) -> list[float]:
    """What `world` workers end with, computed in one process."""
    model, optimizer, _options = build(feature)
    micro = ACCUMULATE if feature == "no_sync" else 1
    for step in range(max(steps_of(feature, r) for r in range(world))):
        optimizer.zero_grad()
        for m in range(micro):
            x, y = data(step, m)
            for rank in range(world):
                if step < steps_of(feature, rank):  # a joined worker contributes zeros, divided by world
                    (loss_of(model, feature, chunk(x, rank, world), chunk(y, rank, world), step) / world).backward()
        optimizer.step()
    return flat(model)


def flat(model) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def train(feature: str) -> dict:
    import geryon

    torch.set_num_threads(1)
    job = geryon.init()
    record = {"hook_calls": []}
    model, optimizer, options = build(feature)
    if feature.startswith("hook_classes"):
        record_hook_calls(model, record["hook_calls"])
    if feature == "wrapped" and job.distributed and job.mode == "allreduce":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, find_unused_parameters=True)
    if job.mode == "ps":  # DDP's options mean nothing there and are refused (see test_ddp_compat.py)
        options = {}
    model, optimizer = geryon.distribute(model, optimizer, **options)
    if feature == "compile":
        model = torch.compile(model, backend=os.environ.get("PROBE_COMPILE_BACKEND", "aot_eager"))
    micro = ACCUMULATE if feature == "no_sync" else 1
    join = model.join() if feature == "join" else contextlib.nullcontext()
    with join:
        for step in range(steps_of(feature, job.rank)):
            optimizer.zero_grad()
            for m in range(micro):
                x, y = data(step, m)
                quiet = model.no_sync() if m < micro - 1 else contextlib.nullcontext()
                with quiet:
                    loss_of(model, feature, chunk(x, job.rank, job.world_size),
                            chunk(y, job.rank, job.world_size), step).backward()
            optimizer.step()
    if hasattr(optimizer, "synchronize"):
        optimizer.synchronize()
    module = model.module if hasattr(model, "module") else model
    module = getattr(module, "_orig_mod", module)
    module = module.module if hasattr(module, "module") else module
    return {"params": flat(module), "workers": job.world_size, "mode": job.mode, **record}


def record_hook_calls(model, calls: list) -> None:
    """Wrap geryon's DDP hook: note each bucket's members and the (class, urgency) it was sent with."""
    from geryon.transport import hooks

    names = {id(p): n for n, p in model.named_parameters()}
    original = hooks.geryon_ddp_hook

    def recording(state, bucket):
        calls.append({"params": [names.get(id(p), "?") for p in bucket.parameters()],
                      "priority": list(state.priority_of_bucket(bucket.index()))})
        return original(state, bucket)

    hooks.geryon_ddp_hook = recording


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--feature", choices=FEATURES, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    result = train(args.feature)
    if int(os.environ.get("RANK", "0")) == 0:
        with open(args.out, "w") as out:
            json.dump(result, out)


if __name__ == "__main__":
    sys.exit(main())
