"""What a training script reads after optimizer.step(), every step: the reads of tests/test_ps_reads.py.

Alone (one process) it trains on the whole global batch; under geryon.launch each worker trains on its
slice of the same batch, so every value must be the one process's. Each step one way of reading the
model comes first (READS, in turn): a later read could otherwise find the values already current,
made so by an earlier one. Worker 0 saves the values of every step and the final parameters to --out.
"""

import argparse

import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

import geryon

GLOBAL_BATCH, STEPS = 16, 16


def _sum(tensors) -> float:
    return sum(t.detach().double().sum().item() for t in tensors)


def _copy(state: dict) -> dict:
    return {k: v.detach().clone() for k, v in state.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    ctx = geryon.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = geryon.distribute(model, optimizer)
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.8))
    held = model[2].weight   # held across steps: current only after geryon.wait_parameters

    def held_after_wait():
        geryon.wait_parameters(model)
        return held.double().sum().item()

    def update_ema():
        ema.update_parameters(model)
        return _sum(ema.module.parameters())

    reads = {
        "parameters": lambda: _sum(model.parameters()),
        "weight-norm": lambda: model[0].weight.norm().item(),
        "parameters_to_vector": lambda: parameters_to_vector(model.parameters()).double().norm().item(),
        "param_groups": lambda: _sum(p for g in optimizer.param_groups for p in g["params"]),
        "ema": update_ema,
        "submodule": lambda: _sum(dict(next(iter(model.children())).named_parameters()).values()),
        "held": held_after_wait,
        "state_dict": lambda: _sum(model.state_dict().values()),
    }
    names = list(reads)
    generator = torch.Generator().manual_seed(7)
    part = GLOBAL_BATCH // ctx.world_size
    mine = slice(ctx.rank * part, (ctx.rank + 1) * part)
    values = []
    for step in range(STEPS):
        x, y = torch.randn(GLOBAL_BATCH, 8, generator=generator), torch.randn(GLOBAL_BATCH, 1, generator=generator)
        optimizer.zero_grad()
        F.mse_loss(model(x[mine]), y[mine]).backward()
        optimizer.step()
        first = names[step % len(names)]
        row = {first: reads[first]()}
        if first != "ema":
            update_ema()   # the average is updated every step; its turn: first read after step()
        for name in names:
            if name not in ("ema", first):
                row[name] = reads[name]()
        row["ema"] = _sum(ema.module.parameters())
        values.append(row)
    with torch.no_grad():   # the average model's own forward: a plain local model
        ema_output = ema(torch.ones(4, 8)).double().sum().item()
    if ctx.rank == 0:
        torch.save({"reads": values, "ema_output": ema_output, "params": _copy(model.state_dict()),
                    "ema": _copy(ema.module.state_dict())}, args.out)
        print("param-sum", _sum(model.parameters()), flush=True)


if __name__ == "__main__":
    main()
