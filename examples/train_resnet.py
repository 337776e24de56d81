"""Train a small ResNet the way most real scripts do; alone, under geryon, or under torchrun.

    python examples/train_resnet.py                                          # one process
    python -m geryon.launch --nproc-per-node 2 examples/train_resnet.py      # geryon (allreduce)
    torchrun --nproc-per-node 2 examples/train_resnet.py                     # plain torchrun
    python -m geryon.launch ... examples/train_resnet.py --checkpoint-dir ckpt --checkpoint-every 10
    python -m geryon.launch ... examples/train_resnet.py --resume ckpt/step-10.pt   # goes on from there
    python -m geryon.launch --max-restarts 3 ... examples/train_resnet.py --checkpoint-dir ckpt
        --checkpoint-every 10 --resume latest   # a restart goes on from the newest checkpoint
    python -m geryon.launch --mode ps --max-restarts 3 --ps-checkpoint-every 10 --ps-checkpoint-dir ps-ckpt
        examples/train_resnet.py                # the servers checkpoint; a restart resumes from them
    python -m geryon.launch --local --nproc-per-node 4 examples/train_resnet.py --device cuda   # on GPUs
    python -m geryon.launch --local --mode ps --nproc-per-node 2 examples/train_resnet.py --device cuda

What it has, as real scripts have it: a ResNet-style model (residual blocks, BatchNorm, convolutions
without bias before a norm), AdamW with two parameter groups (weight decay on weights, none on biases
and norms), a linear warm-up then cosine learning-rate schedule, gradient clipping by global norm,
gradient accumulation (`--grad-accum K`, with DDP's `no_sync()` on all but the last micro-batch),
checkpoints of model, optimizer and schedule every K steps (rank 0 writes them), and `--resume`.

Batches follow torchrun's convention: `--batch-size` is per process and per micro-batch; one step
trains on batch-size x grad-accum x workers images. BatchNorm normalises over each process's own
micro-batch, so the single-process run equal to W workers is `--grad-accum W` with the same
--batch-size: same images per step, same normalisation groups, same gradient. (BatchNorm's running
statistics are the exception: DDP keeps worker 0's, a single process sees every micro-batch.)
Step s always trains on the same images (the order is a function of the seed and s), so a resumed
run sees exactly the batches of an uninterrupted one: from `--resume FILE`'s step, or in ps mode
from the servers' own checkpoint (`ctx.resumed_step`; the schedule is advanced to it, the model and
the optimizer state come from the servers). `--out FILE` (rank 0) saves the final model
state; `--log-json` prints one JSON object per step and one at the end.
"""

import argparse
import contextlib
import json
import math
import os
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn

import geryon
from geryon.errors import ConfigError
from geryon.runtime.device import DEVICE_CHOICES, select_device

CLASSES = 10


def make_dataset(count: int, seed: int, size: int = 16, noise: float = 1.5):
    """`count` images (3 x size x size) and labels: a smooth random pattern per class, shifted, plus noise."""
    patterns = F.interpolate(torch.randn(CLASSES, 3, 4, 4, generator=torch.Generator().manual_seed(99)),
                             size=(size + 4, size + 4), mode="bilinear", align_corners=False)
    rng = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (count,), generator=rng)
    shifts = torch.randint(0, 5, (count, 2), generator=rng)
    images = torch.stack([patterns[label, :, dy:dy + size, dx:dx + size]
                          for label, (dy, dx) in zip(labels.tolist(), shifts.tolist())])
    return images + noise * torch.randn(images.shape, generator=rng), labels


class BasicBlock(nn.Module):
    def __init__(self, inputs: int, outputs: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.shortcut = nn.Sequential()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(outputs))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    """A stem, two stages of two basic blocks (the second at stride 2), global pooling, a linear head."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU())
        self.stage1 = nn.Sequential(BasicBlock(width, width), BasicBlock(width, width))
        self.stage2 = nn.Sequential(BasicBlock(width, 2 * width, stride=2), BasicBlock(2 * width, 2 * width))
        self.head = nn.Linear(2 * width, CLASSES)

    def forward(self, x):
        out = self.stage2(self.stage1(self.stem(x)))
        return self.head(F.adaptive_avg_pool2d(out, 1).flatten(1))


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW's usual two groups: decay on conv/linear weights, none on biases and norm parameters."""
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def warmup_cosine(warmup: int, total: int):
    """LambdaLR factor: linear warm-up over `warmup` steps, then a cosine down to 0 at `total`."""
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def step_indices(step: int, count: int, step_batch: int, seed: int) -> torch.Tensor:
    """The images of `step`, the same on every rank and after a resume (epoch order from seed + epoch)."""
    per_epoch = count // step_batch
    if per_epoch < 1:
        raise SystemExit(f"--train-size {count} is smaller than one step's {step_batch} images")
    epoch, position = divmod(step, per_epoch)
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed * 100003 + epoch))
    return order[position * step_batch:(position + 1) * step_batch]


def unwrapped(model: nn.Module) -> nn.Module:
    """The user's module inside DistributedDataParallel (what checkpoints hold)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def save_checkpoint(path: str, step: int, model, optimizer, scheduler) -> None:
    """Write atomically: a job stopped while saving leaves the previous checkpoint intact."""
    state = {"step": step, "model": unwrapped(model).state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict()}
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def accuracy(model: nn.Module, images, labels) -> float:
    model.eval()
    with torch.no_grad():
        correct = (model(images).argmax(1) == labels).sum().item()
    model.train()
    return correct / len(images)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps in all (a resumed run included)")
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--batch-size", type=int, default=None,
                       help="images per process per micro-batch, as under torchrun (default 32)")
    sizes.add_argument("--global-batch-size", type=int, default=None, metavar="G",
                       help="images per step over all workers (each micro-batch takes G / (workers x accum))")
    parser.add_argument("--grad-accum", type=int, default=1, metavar="K", help="micro-batches per step")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--weight-decay", type=float, default=0.05)
    parser.add_argument("--warmup", type=int, default=5, help="warm-up steps of the schedule")
    parser.add_argument("--clip", type=float, default=1.0, help="gradient clipping: max global norm")
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--train-size", type=int, default=2048)
    parser.add_argument("--test-size", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--checkpoint-dir", default=None, help="where rank 0 writes step-<s>.pt")
    parser.add_argument("--checkpoint-every", type=int, default=0, metavar="K", help="checkpoint every K steps")
    parser.add_argument("--resume", default=None, metavar="FILE|latest",
                        help="go on from this checkpoint; latest: the newest in --checkpoint-dir, if any (a job "
                             "restarted by --max-restarts goes on from its last checkpoint)")
    parser.add_argument("--out", default=None, metavar="FILE", help="rank 0 saves the final model state here")
    parser.add_argument("--log-json", action="store_true")
    parser.add_argument("--device", default="auto", choices=DEVICE_CHOICES,
                        help="where the model trains: auto (the rank's GPU when there is one), cpu, cuda")
    args = parser.parse_args(argv)
    if args.checkpoint_every and not args.checkpoint_dir:
        parser.error("--checkpoint-every needs --checkpoint-dir")
    if args.resume == "latest":
        if not args.checkpoint_dir:
            parser.error("--resume latest needs --checkpoint-dir")
        args.resume = latest_checkpoint(args.checkpoint_dir)
    return args


def latest_checkpoint(folder: str) -> str | None:
    """The newest step-<s>.pt in `folder` (None when there is none yet: the job starts afresh)."""
    steps = [int(name[5:-3]) for name in (os.listdir(folder) if os.path.isdir(folder) else ())
             if name.startswith("step-") and name.endswith(".pt") and name[5:-3].isdigit()]
    return os.path.join(folder, f"step-{max(steps)}.pt") if steps else None


def batch_size(args, workers: int) -> int:
    """Images per process per micro-batch, from --batch-size or --global-batch-size."""
    if args.global_batch_size is None:
        return 32 if args.batch_size is None else args.batch_size
    split = workers * args.grad_accum
    if args.global_batch_size % split or args.global_batch_size < split:
        raise SystemExit(f"--global-batch-size {args.global_batch_size} must be a multiple of {workers} "
                         f"workers x {args.grad_accum} micro-batches; pick a multiple of {split}, or give "
                         f"the per-process size with --batch-size, as under torchrun")
    return args.global_batch_size // split


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    job = geryon.init()
    try:
        device = select_device(args.device, job.local_rank)
    except ConfigError as exc:
        raise SystemExit(str(exc)) from None
    local = batch_size(args, job.world_size)
    step_batch = local * args.grad_accum * job.world_size

    images, labels = make_dataset(args.train_size, seed=args.seed)
    test_images, test_labels = make_dataset(args.test_size, seed=args.seed + 1)
    images, labels, test_images, test_labels = (t.to(device) for t in (images, labels, test_images, test_labels))
    torch.manual_seed(args.seed)
    model = ResNet(args.width).to(device)
    # a server checkpoint to resume from (ps mode) is this job's latest state: it wins over --resume
    resume = args.resume if not job.resumed_step else None
    checkpoint = torch.load(resume, weights_only=True, map_location=device) if resume else None
    if checkpoint is not None:  # before distribute(): every worker starts from the checkpoint
        model.load_state_dict(checkpoint["model"])
    optimizer = torch.optim.AdamW(parameter_groups(model, args.weight_decay), lr=args.lr)
    model, optimizer = geryon.distribute(model, optimizer)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(args.warmup, args.steps))
    first = 0
    if checkpoint is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        first = checkpoint["step"]
    elif job.resumed_step:   # ps mode: the servers resumed from their checkpoint of this step
        first = job.resumed_step
        with warnings.catch_warnings():   # the schedule of the steps done, before this start's first step()
            warnings.simplefilter("ignore", UserWarning)
            for _ in range(first):
                scheduler.step()
    accumulating = getattr(model, "no_sync", None) if job.distributed else None

    started = time.perf_counter()
    for step in range(first, args.steps):
        index = step_indices(step, args.train_size, step_batch, args.seed).to(device)
        optimizer.zero_grad()
        total = 0.0
        for micro in range(args.grad_accum):
            chunk = micro * job.world_size + job.rank
            mine = index[chunk * local:(chunk + 1) * local]
            last = micro == args.grad_accum - 1
            with accumulating() if accumulating and not last else contextlib.nullcontext():
                loss = F.cross_entropy(model(images[mine]), labels[mine]) / args.grad_accum
                loss.backward()
            total += loss.item()
        # by the global norm of the averaged gradient; in --mode ps the servers clip (norm None here)
        norm = geryon.clip_grad_norm_(optimizer, args.clip)
        optimizer.step()
        scheduler.step()
        done = step + 1
        if args.checkpoint_every and done % args.checkpoint_every == 0:
            if hasattr(optimizer, "synchronize"):  # PS mode: the parameters of this step are here
                optimizer.synchronize()
            if job.is_main:
                os.makedirs(args.checkpoint_dir, exist_ok=True)
                save_checkpoint(os.path.join(args.checkpoint_dir, f"step-{done}.pt"), done, model, optimizer,
                                scheduler)
        global_loss = geryon.average(total)
        if job.is_main and args.log_json:
            print(json.dumps({"step": step, "loss": global_loss, "grad_norm": None if norm is None else float(norm),
                              "lr": scheduler.get_last_lr()[0],
                              "time_s": round(time.perf_counter() - started, 4)}), flush=True)
    if hasattr(optimizer, "synchronize"):
        optimizer.synchronize()
    if job.is_main:
        module = unwrapped(model)
        if args.out:
            torch.save(module.state_dict(), args.out)
        summary = {"final": True, "steps": args.steps, "resumed_from": first, "workers": job.world_size,
                   "mode": job.mode, "batch_size": local, "step_batch": step_batch,
                   "accuracy": accuracy(module, test_images, test_labels),
                   "seconds": round(time.perf_counter() - started, 3)}
        print(json.dumps(summary) if args.log_json else
              f"{args.steps} steps on {job.world_size} worker(s), test accuracy {summary['accuracy']:.1%}",
              flush=True)


if __name__ == "__main__":
    main()
