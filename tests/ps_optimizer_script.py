"""A tiny training script for the PS optimizer tests: one case per --case, final state_dict to --out.

Alone (one process) it trains on the whole global batch; under geryon.launch each of the W workers
trains on its slice of the same global batch, so every mode must end with the same parameters. A test
computes the one-process reference in its own process with `train_case(parse_args([...]), RankEnv())`:
the same code, without starting an interpreter and importing torch for each case.
"""

import argparse
import io
import warnings

import torch

import geryon

GLOBAL_BATCH, FEATURES, CLASSES = 8, 6, 3


class Lamb(torch.optim.Optimizer):
    """A small LAMB: Adam's direction scaled per tensor by ||p|| / ||update|| (needs whole tensors)."""

    def __init__(self, params, lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"], state["m"], state["v"] = 0, torch.zeros_like(p), torch.zeros_like(p)
                state["step"] += 1
                state["m"].mul_(beta1).add_(p.grad, alpha=1 - beta1)
                state["v"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                m = state["m"] / (1 - beta1 ** state["step"])
                v = state["v"] / (1 - beta2 ** state["step"])
                update = m / (v.sqrt() + group["eps"]) + group["weight_decay"] * p
                trust = (p.norm() / update.norm()).clamp(max=10.0) if p.norm() > 0 else 1.0
                p.add_(update, alpha=-group["lr"] * float(trust))


class Branchy(torch.nn.Module):
    """`extra` serves only the rows asked for (none: no gradient at all); `never` is never used."""

    def __init__(self):
        super().__init__()
        self.body, self.head = torch.nn.Linear(FEATURES, 8), torch.nn.Linear(8, CLASSES)
        self.extra, self.never = torch.nn.Linear(8, CLASSES), torch.nn.Linear(8, CLASSES)

    def forward(self, x, extra_rows):
        hidden = torch.relu(self.body(x))
        out = self.head(hidden)
        if len(extra_rows):
            out = out.index_add(0, extra_rows, self.extra(hidden[extra_rows]))
        return out


class Recomputed(torch.nn.Sequential):
    """The hidden block runs under activation checkpointing: backward runs its forward again."""

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        hidden = checkpoint(lambda t: self[1](self[0](t)), x, use_reentrant=False)
        return self[2](hidden)


def build(case: str):
    torch.manual_seed(1)
    if case == "adam_unused":
        return Branchy()
    if case == "checkpointed":
        return Recomputed(torch.nn.Linear(FEATURES, 8), torch.nn.ReLU(), torch.nn.Linear(8, CLASSES))
    layers = [torch.nn.Linear(FEATURES, 8)]
    if case == "bn":
        layers.append(torch.nn.BatchNorm1d(8))
    layers += [torch.nn.ReLU(), torch.nn.Linear(8, CLASSES)]
    return torch.nn.Sequential(*layers)


def optimizer_for(case: str, model, steps: int):
    """(optimizer, scheduler made before distribute or None, scheduler factory for after or None)."""
    params = list(model.parameters())
    if case == "sgd_steplr":
        opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3)
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1), None
    if case == "sgd_onecycle":
        opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True)
        return opt, None, lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.5, total_steps=steps)
    if case == "adamw_groups":
        decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
        no_decay = [p for n, p in model.named_parameters() if n.endswith("bias")]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": no_decay, "weight_decay": 0.0, "lr": 0.02}], lr=0.01,
                                betas=(0.8, 0.99))

        def schedule(o):
            warmup = torch.optim.lr_scheduler.LinearLR(o, start_factor=0.25, total_iters=2)
            cosine = torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=steps - 2)
            return torch.optim.lr_scheduler.SequentialLR(o, [warmup, cosine], milestones=[2])
        return opt, None, schedule
    if case == "adam_unused":   # skipping a tensor without a gradient matters: state and decay
        return torch.optim.Adam(params, lr=0.01, weight_decay=0.05), None, None
    if case == "late_lr":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9), None, None
    if case in ("adam_amsgrad", "checkpoint"):
        return torch.optim.Adam(params, lr=0.01, amsgrad=True, weight_decay=0.01), None, None
    if case == "rmsprop":
        return torch.optim.RMSprop(params, lr=0.01, momentum=0.5, centered=True), None, None
    if case == "lamb":
        return Lamb(params, lr=0.02), None, None
    if case in ("clip", "torch_clip", "bn", "checkpointed", "peek"):
        return torch.optim.SGD(params, lr=0.5, momentum=0.9), None, None
    raise SystemExit(f"unknown case {case}")


def strict_warnings() -> None:
    """torch's warnings that a scheduler or an optimizer's step() is called out of order become errors."""
    warnings.filterwarnings("error", message=".*lr_scheduler.step.*")
    warnings.filterwarnings("error", message=".*optimizer.step.*overridden.*")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--save-at", type=int, default=None, help="write a checkpoint after this many steps")
    parser.add_argument("--checkpoint", default=None, help="where --save-at writes, --resume reads")
    parser.add_argument("--resume", action="store_true", help="load --checkpoint before training")
    return parser.parse_args(argv)


def train_case(args: argparse.Namespace, ctx) -> dict:
    """Train `args.case` as rank ctx.rank of ctx.world_size (distributed by geryon.distribute for
    `ctx`); the final state_dict, detached. One process (the default RankEnv) is the reference run."""
    torch.manual_seed(7)
    inputs = torch.randn(args.steps, GLOBAL_BATCH, FEATURES)
    labels = torch.randint(0, CLASSES, (args.steps, GLOBAL_BATCH))
    part = GLOBAL_BATCH // ctx.world_size
    mine = slice(ctx.rank * part, (ctx.rank + 1) * part)

    model = build(args.case)
    optimizer, scheduler, make_scheduler = optimizer_for(args.case, model, args.steps)
    model, optimizer = geryon.distribute(model, optimizer, job=ctx)
    if make_scheduler is not None:
        scheduler = make_scheduler(optimizer)

    def forward(step: int):
        if args.case != "adam_unused":
            return model(inputs[step][mine])
        # the extra head serves global rows 0..3 on even steps: worker 0 only, and nobody on odd steps
        rows = torch.arange(GLOBAL_BATCH)[mine]
        wanted = (rows < GLOBAL_BATCH // 2) & torch.tensor(step % 2 == 0)
        return model(inputs[step][mine], extra_rows=wanted.nonzero().squeeze(1))

    def train(step: int) -> None:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(forward(step), labels[step][mine]).backward()
        if args.case == "late_lr":   # a warm-up written between backward and step()
            for group in optimizer.param_groups:
                group["lr"] = 0.05 * (step + 1)
        if args.case == "peek":      # a look at the model between backward and step()
            with torch.no_grad():
                model(inputs[step][mine])
        if args.case == "clip":
            geryon.clip_grad_norm_(optimizer, 0.05)
        if args.case == "torch_clip":   # .grad must hold the averaged gradient (workers step)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()

    first = 0
    if args.resume:   # before the first forward: the state travels with the servers' starting point
        checkpoint = torch.load(args.checkpoint, weights_only=True)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        first = checkpoint["steps"]
    if args.case == "checkpoint":   # save after 3 steps, train 2 more, load, redo them
        for step in range(3):
            train(step)
        saved = io.BytesIO()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, saved)
        for step in range(3, 5):
            train(step)
        checkpoint = torch.load(io.BytesIO(saved.getvalue()), weights_only=True)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        for step in range(3, args.steps):
            train(step)
    else:
        for step in range(first, args.steps):
            train(step)
            if step + 1 == args.save_at:
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "steps": step + 1}
                if ctx.is_main:
                    torch.save(state, args.checkpoint)
    state = model.module.state_dict() if hasattr(model, "module") else model.state_dict()
    return {k: v.detach().clone() for k, v in state.items()}


def main() -> None:
    strict_warnings()
    args = parse_args()
    ctx = geryon.init()
    state = train_case(args, ctx)
    if ctx.is_main:
        torch.save(state, args.out)
        print("saved", args.out, flush=True)


if __name__ == "__main__":
    main()
